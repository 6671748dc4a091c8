"""RunTotals: per-batch accumulation calibrated against terminal totals."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.reporting import RunTotals


def test_add_accumulates_ints_exactly_and_floats_as_floats() -> None:
    totals = RunTotals()
    for n in (3, 4, 5):
        totals.add("samples", n)
    totals.add("seconds", 1)
    totals.add("seconds", 0.5)
    assert totals.totals() == {"samples": 12, "seconds": 1.5}
    assert type(totals.get("samples")) is int
    assert totals.get("never") == 0


def test_calibrate_prefers_terminal_and_records_the_discrepancy() -> None:
    totals = RunTotals()
    totals.add("samples_generated", 250)
    totals.add("samples_generated", 240)
    totals.add("optimizer_updates", 10)
    result = totals.calibrate({"samples_generated": 512, "generation_groups": 64})
    assert result == {
        "generation_groups": {"accumulated": 0, "terminal": 64, "final": 64, "discrepancy": 64},
        "optimizer_updates": {
            "accumulated": 10,
            "terminal": None,
            "final": 10,
            "discrepancy": None,
        },
        "samples_generated": {"accumulated": 490, "terminal": 512, "final": 512, "discrepancy": 22},
    }
    assert list(result) == sorted(result)
    # calibrate does not change what was accumulated, and repeats identically
    assert totals.get("samples_generated") == 490
    assert totals.calibrate({"samples_generated": 512, "generation_groups": 64}) == result


def test_agreeing_totals_have_zero_discrepancy() -> None:
    totals = RunTotals()
    totals.add("tokens", 1000)
    assert totals.calibrate({"tokens": 1000})["tokens"]["discrepancy"] == 0
    assert totals.calibrate()["tokens"] == {
        "accumulated": 1000,
        "terminal": None,
        "final": 1000,
        "discrepancy": None,
    }


@pytest.mark.parametrize(
    ("key", "amount", "culprit"),
    [
        ("", 1, r"key must be a non-empty str, got ''"),
        (3, 1, r"key must be a non-empty str, got 3"),
        ("x", True, r"amount\['x'\] = True must be a finite int or float"),
        ("x", float("nan"), r"amount\['x'\] = nan must be a finite"),
        ("x", float("inf"), r"amount\['x'\] = inf"),
        ("x", "3", r"amount\['x'\] = '3'"),
        ("x", None, r"amount\['x'\] = None"),
    ],
)
def test_bad_add_names_the_key_and_value(key: object, amount: object, culprit: str) -> None:
    totals = RunTotals()
    totals.add("kept", 1)
    with pytest.raises(InvalidArgumentError, match=culprit):
        totals.add(key, amount)  # type: ignore[arg-type]  # the wrong types are the point
    assert totals.totals() == {"kept": 1}


def test_bad_terminal_totals_are_rejected() -> None:
    totals = RunTotals()
    with pytest.raises(InvalidArgumentError, match=r"terminal\['x'\] = nan"):
        totals.calibrate({"x": float("nan")})
    with pytest.raises(InvalidArgumentError, match="terminal must be a mapping"):
        totals.calibrate([("x", 1)])  # type: ignore[arg-type]


def test_concurrent_adds_are_not_lost() -> None:
    totals = RunTotals()

    def worker() -> None:
        for _ in range(10_000):
            totals.add("n", 1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert totals.get("n") == 80_000


@given(
    amounts=st.lists(st.integers(min_value=-(10**6), max_value=10**6), max_size=50),
    terminal=st.none() | st.integers(min_value=0, max_value=10**8),
)
def test_final_is_terminal_when_given_and_discrepancy_is_the_difference(
    amounts: list[int], terminal: int | None
) -> None:
    totals = RunTotals()
    for a in amounts:
        totals.add("k", a)
    out = totals.calibrate({} if terminal is None else {"k": terminal})
    if not amounts and terminal is None:
        assert out == {}
        return
    row = out["k"]
    assert row["accumulated"] == sum(amounts)
    if terminal is None:
        assert row["final"] == sum(amounts) and row["discrepancy"] is None
    else:
        assert row["final"] == terminal
        assert row["discrepancy"] == terminal - sum(amounts)
