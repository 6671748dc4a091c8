"""The driver's health per window (issue 28, waits and async health), from its
snapshots on a manual clock, worked out by hand. Boundaries at 10, 100 and 200 ms, the
finish at 300; snapshots (cumulative, as the StreamingDriver's state):

    at    produced consumed dropped buffered  wait   e0 idle  e1 idle  version
    5       2        0        0       2       0.000   0.000    0.000     0    (set-up)
    50      4        2        0       2       0.030   0.010    0.000     1    window 0
    90      5        2        0       3       0.030   0.020    0.005     1    window 0
    250     8        6        1       1       0.050   0.020    0.015     3    window 2

Window 0 changes from the set-up's; window 1 has no snapshot (no record); window 2
changes from window 0's last.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import check_replay
from observers.test_scripted_run import manual_session
from twinkle.observers._driver_health import DRIVER_KEYS, DriverLedger
from twinkle.perf import ManualClock

MS = 1_000_000
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "streaming": {"generation": "rollout", "training": "train"},
}
SNAPSHOTS = [
    (5, 2, 0, 0, 2, 0.0, 0.0, 0.0, 0),
    (50, 4, 2, 0, 2, 0.03, 0.01, 0.0, 1),
    (90, 5, 2, 0, 3, 0.03, 0.02, 0.005, 1),
    (250, 8, 6, 1, 1, 0.05, 0.02, 0.015, 3),
]


def _state(row: tuple[Any, ...]) -> dict[str, Any]:
    _, produced, consumed, dropped, buffered, wait, idle0, idle1, version = row
    return {
        "version": version,
        "produced": produced,
        "consumed": consumed,
        "dropped": dropped,
        "buffered": buffered,
        "trainer_wait_seconds": wait,
        "producers": {
            "e0": {"idle_seconds": idle0, "state": "producing"},
            "e1": {"idle_seconds": idle1, "state": "producing"},
        },
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _first_segment(tmp_path_factory.mktemp("driver"))


def _first_segment(out_dir: Path) -> Path:
    """The run of the table above, finished."""
    run, clock = manual_session(out_dir, "d", CONFIG)
    events: list[tuple[int, str, Any]] = [(row[0], "snapshot", row) for row in SNAPSHOTS]
    events += [(at, "boundary", i) for i, at in enumerate([10, 100, 200])]
    events.append((260, "caller", None))  # the caller's own snapshot: not read
    for at, what, arg in sorted(events, key=lambda e: e[0]):
        clock.set(at * MS)
        if what == "boundary":
            run.bus.iteration_started(arg)
        elif what == "snapshot":
            run.bus.snapshot(_state(arg))
        else:
            run.bus.snapshot({"version": 99})
    clock.set(300 * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def test_each_window_gets_the_change_of_the_drivers_state(run_dir: Path) -> None:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    driver = {
        r["iteration"]: r["values"] for r in map(orjson.loads, lines) if r["kind"] == "driver"
    }
    assert sorted(driver) == [0, 2]  # window 1 had no snapshot
    assert driver[0] == {
        "trainer_wait_seconds": 0.03,
        "engines_blocked_seconds": pytest.approx(0.025),
        "produced": 3,
        "consumed": 2,
        "dropped": 0,
        "buffered": 3,
        "buffered_max": 3,
        "version": 1,
        "policy_age_mean": None,  # (no generation span said its version)
        "policy_age_max": None,
    }
    assert driver[2] == {
        "trainer_wait_seconds": pytest.approx(0.02),
        "engines_blocked_seconds": pytest.approx(0.01),
        "produced": 3,
        "consumed": 4,
        "dropped": 1,
        "buffered": 1,
        "buffered_max": 1,
        "version": 3,
        "policy_age_mean": None,
        "policy_age_max": None,
    }


def test_the_summary_gives_the_runs_totals_and_what_was_never_trained(run_dir: Path) -> None:
    limits = orjson.loads((run_dir / "summary.json").read_bytes())["limits"]
    assert limits["driver"] == {
        "trainer_wait_seconds": 0.05,
        "engines_blocked_seconds": {"e0": 0.02, "e1": 0.015},
        "produced": 8,
        "consumed": 6,
        "dropped": 1,
        "left_in_buffer": 1,
    }
    assert limits["never_trained"] == {
        "dropped": 1,
        "left_in_buffer": 1,
        "unstarted_iterations": 0,
        "unstarted_span_seconds": 0,
        "unstarted_samples": {},
        "unstarted_tokens": {},
    }


def test_a_resumed_runs_totals_add_each_segments(tmp_path: Path) -> None:
    """A second segment's driver counts from zero: set-up (1, 0, 0, 1, 0.0, 0.0, 0.0),
    then in window 3 (3, 2, 0, 1, 0.010, 0.005, 0.0). The run's totals are the two
    segments' last snapshots added; what each left in its buffer was never trained."""
    _first_segment(tmp_path)
    run, clock = manual_session(tmp_path, "d", CONFIG, ManualClock(1000 * MS), resume=True)
    assert run.resumed is not None and run.resumed.restored_events == run.resumed.events
    for at, row in [
        (1005, (1, 0, 0, 1, 0.0, 0.0, 0.0, 3)),
        (1050, (3, 2, 0, 1, 0.01, 0.005, 0.0, 4)),
    ]:
        clock.set(at * MS)
        run.bus.snapshot(_state((at, *row)))
        if at == 1005:
            clock.set(1010 * MS)
            run.bus.iteration_started(3)
    clock.set(1100 * MS)
    run.finish()
    limits = orjson.loads((tmp_path / "d" / "summary.json").read_bytes())["limits"]
    assert limits["driver"] == {
        "trainer_wait_seconds": 0.05 + 0.01,
        "engines_blocked_seconds": {"e0": 0.02 + 0.005, "e1": 0.015 + 0.0},
        "produced": 8 + 3,
        "consumed": 6 + 2,
        "dropped": 1 + 0,
        "left_in_buffer": 1 + 1,
    }
    assert (limits["never_trained"]["dropped"], limits["never_trained"]["left_in_buffer"]) == (1, 2)
    check_replay(tmp_path / "d", tmp_path / "again")  # (as from the whole log)


def test_the_totals_handed_out_are_a_copy() -> None:
    ledger = DriverLedger()
    ledger.snapshot(_state(SNAPSHOTS[1]), None)
    ledger.resumed()  # (the new segment takes no snapshot: the earlier totals alone)
    ledger.summary()["engines_blocked_seconds"]["e0"] = 99.0
    assert ledger.summary()["engines_blocked_seconds"] == {"e0": 0.01, "e1": 0.0}


def test_the_driver_table_of_the_docs_names_every_key() -> None:
    text = DOC.read_text()
    table = text[text.index("### kind `driver`") :]
    table = table[: table.index("\n## ")]
    assert tuple(re.findall(r"^\| `([^`]+)` \|", table, re.M)) == DRIVER_KEYS


def test_policy_ages_from_the_spans(tmp_path: Path) -> None:
    """Iterations 0-3 (1 and 2 steady). Generation spans say the version they used:
    iteration 1 two spans of versions 0 and 1 (ages 1 and 0), iteration 2 one of
    version 1 (age 1): the steady state's mean age 2/3, max 1, over 3 spans."""
    from twinkle.perf import Span

    def span(name: str, at: int, ms: int, **attrs: Any) -> Span:
        return Span(name, at * MS, (at + ms) * MS, 1, 1, attrs, None)

    spans = {
        0: [span("generate", 1, 5, iteration=0, version=0)],
        1: [
            span("generate", 101, 5, iteration=1, version=0, engine="e0"),
            span("generate", 101, 5, iteration=1, version=1, engine="e1"),
        ],
        2: [span("generate", 201, 5, iteration=2, version=1)],
        3: [span("generate", 301, 5, iteration=3, version=2)],
    }
    run, clock = manual_session(tmp_path, "ages", CONFIG)
    for it in range(4):
        clock.set(it * 100 * MS)
        run.bus.iteration_started(it)
        clock.set((it * 100 + 99) * MS)
        run.bus.publish_spans("main", run.bus.anchor, spans[it])
    clock.set(400 * MS)
    run.finish()
    assert run.out_dir is not None
    summary = orjson.loads((run.out_dir / "summary.json").read_bytes())
    limits = summary["limits"]
    assert limits["policy_age"] == {
        "mean": pytest.approx(2 / 3),
        "max": 1,
        "spans": 3,
        "over": "steady state",
    }
    lines = (run.out_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    ages = {
        r["iteration"]: (r["values"]["policy_age_mean"], r["values"]["policy_age_max"])
        for r in map(orjson.loads, lines)
        if r["kind"] == "driver"
    }
    assert ages == {0: (0.0, 0), 1: (0.5, 1), 2: (1.0, 1), 3: (1.0, 1)}
