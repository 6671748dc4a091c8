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


def test_each_engine_keeps_its_pace_on_each_iteration_when_its_tokens_are_shared() -> None:
    """Engine a: 100 tokens in 10 ns on iteration 0, in 30 on iteration 1 (the machine
    busy); engine b: 10 on each. Rates 40/200 = 0.2 and 20/200 = 0.1 a token; typical
    0.1 (the low median); no slope known (every span 100 tokens): the shape 0.1 a token,
    a's line 0.2, b's 0.1. The paces: a 10/20 = 0.5 and 30/20 = 1.5, b 1 and 1. So
    engine a generating 200 tokens takes 0.2 x 200 x 0.5 = 20 ns on iteration 0 and 60
    on iteration 1, where its line alone gives 40 and 40; a new engine made after b, 20
    and 20."""
    from twinkle.whatif._work import _paces, _shared_piece

    a = _engine("a", [(100, 10), (100, 30)])
    b = _engine("b", [(100, 10), (100, 10)])
    fitted = fit_engines([a, b], "rollout")
    assert fitted is not None
    fits, new = fitted
    assert (fits["a"], fits["b"], new) == (Fit(0.0, 0.2), Fit(0.0, 0.1), Fit(0.0, 0.1))
    paces = _paces([a, b], fits, "rollout")
    assert paces == {
        ("a", 0): pytest.approx(0.5),
        ("a", 1): pytest.approx(1.5),
        ("b", 0): pytest.approx(1.0),
        ("b", 1): pytest.approx(1.0),
    }
    for engine, fit, template, want in (("a", fits["a"], a, [20, 60]), ("e2", new, b, [20, 20])):
        took = [
            _shared_piece(
                template.items[it][0], 2.0, "rollout", fit, engine, paces[template.name, it]
            ).duration_ns
            for it in (0, 1)
        ]
        assert took == want, engine
