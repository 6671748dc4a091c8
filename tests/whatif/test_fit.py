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


def test_each_iteration_keeps_its_pace_when_its_tokens_are_shared_again() -> None:
    """Two engines of one speed, each 100 tokens an iteration: 10 ns each on iteration
    0, 30 on iteration 1 (the machine busy). Their line: 40 ns over 200 tokens, 0.2 a
    token (every span 100 tokens: no slope known). The paces: (10 + 10) / (20 + 20) =
    0.5 and (30 + 30) / 40 = 1.5, so one engine generating the 200 tokens takes 20 ns on
    iteration 0 and 60 on iteration 1: the 80 ns the two took, where the line alone
    gives 40 and 40."""
    from twinkle.whatif._work import _paces, _shared_piece

    a = _engine("a", [(100, 10), (100, 30)])
    b = _engine("b", [(100, 10), (100, 30)])
    fitted = fit_engines([a, b], "rollout")
    assert fitted is not None
    fits, _ = fitted
    assert fits["a"] == fits["b"] == Fit(0.0, 0.2)
    paces = _paces([a, b], fits, "rollout")
    assert paces == {0: pytest.approx(0.5), 1: pytest.approx(1.5)}
    took = [
        _shared_piece(a.items[it][0], 2.0, "rollout", fits["a"], "a", paces[it]).duration_ns
        for it in (0, 1)
    ]
    assert took == [20, 60]
