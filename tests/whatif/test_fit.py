"""The engines' generation lines (``twinkle.whatif._fit``), worked by hand."""

from __future__ import annotations

import pytest

from twinkle.whatif._fit import Fit, fit_engines
from twinkle.whatif._recorded import EngineRecord, Piece


def _engine(name: str, points: list[tuple[int, int]]) -> EngineRecord:
    rec = EngineRecord(name, 1, 1, 0)
    for it, (tokens, ns) in enumerate(points):
        rec.items[it] = (Piece("generate", 0, ns, "rollout", {"tokens": tokens}),)
        rec.items[it] += (Piece("reward", 0, 5, "rollout", {}),)  # (no tokens: not fitted)
    return rec


def test_a_straggler_keeps_its_speed_and_a_new_engine_is_typical() -> None:
    """fast: 10 + 0.1 x exactly; slow: twice that. rate(fast) = 86/460 is the low
    median; the slow spans scaled by 1/2 lie on the same line: a = 10, b = 0.1."""
    xs = [100, 110, 120, 130]
    fast = _engine("fast", [(x, 10 + x // 10) for x in xs])
    slow = _engine("slow", [(x, 2 * (10 + x // 10)) for x in xs])
    fitted = fit_engines([fast, slow], "rollout")
    assert fitted is not None
    fits, new = fitted
    assert new.a_ns == pytest.approx(10) and new.b_ns_per_token == pytest.approx(0.1)
    assert fits["fast"].ns(200) == pytest.approx(30)
    assert fits["slow"].ns(200) == pytest.approx(60)


def test_a_line_not_known_well_enough_is_proportional() -> None:
    """x 100, 101, 102 and y 30, 10, 30: slope 0, not used; 70 ns over 303 tokens."""
    rec = _engine("e", [(100, 30), (101, 10), (102, 30)])
    fitted = fit_engines([rec], "rollout")
    assert fitted is not None
    fits, new = fitted
    assert new == Fit(0.0, 70 / 303) == fits["e"]


def test_no_tokens_no_fit() -> None:
    rec = EngineRecord("e", 1, 1, 0, items={0: (Piece("generate", 0, 9, "rollout", {}),)})
    assert fit_engines([rec], "rollout") is None
