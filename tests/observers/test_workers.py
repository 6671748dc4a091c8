"""Each worker's unaccounted time and its waits, per window and over the steady state
(issue 28), on a manual clock, worked out by hand.

Boundaries at 0, 100, 200, 300 ms, the finish at 400 (windows 1 and 2 are the steady
state). Three workers: engines e0 and e1 (the spans' ``engine`` attribute) and the
trainer ``main`` (the batch's source).

    window  e0 covered            e1 covered             main covered
    0       gen 0-40, ww 40-60    gen 0-80               train 40-90, wr 90-100
    1       gen 110-150,          gen 100-190,           train 100-180
            ww 150-170 & 160-180  gen 195-230 (to 200)
    2       gen 210-260           gen (200-)230          train 200-280, wr 280-300
    3       -                     gen 300-330            train 300-380

    unaccounted (ms)  e0   e1   main   max (who)   min   mean
    0                 40   20   40     40 (e0)     20    100/3
    1                 30    5   20     30 (e0)      5     55/3
    2                 50   70    0     70 (e1)      0    120/3
    3                100   70   20    100 (e0)     20    190/3

(ww: wait.weights, wr: wait.rollout; window 1's two wait.weights overlap: 30 ms.)
Steady state: e0 80, e1 75, main 20 ms of 200; wait.weights e0 30, wait.rollout main 20.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_scripted_run import manual_session
from twinkle.observers._workers import WorkerLedger, WorkerTiming, measure_workers
from twinkle.perf import Span
from twinkle.report import format_report, load_report

MS = 1_000_000
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train"]},
    "streaming": {"generation": "rollout", "training": "train"},
}


def _span(name: str, start: int, end: int, **attrs: Any) -> Span:
    return Span(name, start * MS, end * MS, 1, 1, attrs, None)


E0: dict[str, Any] = {"engine": "e0"}
E1: dict[str, Any] = {"engine": "e1"}
SPANS = {
    0: [
        _span("generate", 0, 40, **E0),
        _span("wait.weights", 40, 60, **E0),
        _span("generate", 0, 80, **E1),
        _span("train", 40, 90),
        _span("wait.rollout", 90, 100),
    ],
    1: [
        _span("generate", 110, 150, **E0),
        _span("wait.weights", 150, 170, **E0),
        _span("wait.weights", 160, 180, **E0),
        _span("generate", 100, 190, **E1),
        _span("generate", 195, 230, **E1),
        _span("train", 100, 180),
    ],
    2: [
        _span("generate", 210, 260, **E0),
        _span("train", 200, 280),
        _span("wait.rollout", 280, 300),
    ],
    3: [_span("generate", 300, 330, **E1), _span("train", 300, 380)],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run, clock = manual_session(tmp_path_factory.mktemp("workers"), "w", CONFIG)
    for it in range(4):
        clock.set(it * 100 * MS)
        run.bus.iteration_started(it)
        clock.set((it * 100 + 99) * MS)
        run.bus.publish_spans("main", run.bus.anchor, SPANS[it])
    clock.set(400 * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def test_each_window_reduces_the_workers_unaccounted_time_and_adds_the_waits(
    run_dir: Path,
) -> None:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    waits = {r["iteration"]: r for r in map(orjson.loads, lines) if r["kind"] == "waits"}
    expected = {  # max, min, sum of the three (ms), who holds the max, wait.rollout, wait.weights
        0: (40, 20, 100, "e0", 10, 20),
        1: (30, 5, 55, "e0", 0, 30),
        2: (70, 0, 120, "e1", 20, 0),
        3: (100, 20, 190, "e0", 0, 0),
    }
    assert sorted(waits) == sorted(expected)
    for it, (most, least, total, who, rollout, weights) in expected.items():
        assert waits[it]["values"] == {
            "unaccounted_seconds_max": most / 1e3,
            "unaccounted_seconds_min": least / 1e3,
            "unaccounted_seconds_mean": total * MS / 3 / 1e9,
            "unaccounted_workers": 3,
            "wait.rollout_seconds": rollout / 1e3,
            "wait.weights_seconds": weights / 1e3,
        }, it
        # the first window fills the pipeline, the last drains it (the run ends ok)
        flags = {0: ["warmup"], 3: ["drain"]}.get(it, [])
        assert waits[it]["attrs"] == {
            "window_flags": flags, "iteration_steps": 0, "unaccounted_argmax_worker": who
        }, it  # fmt: skip


def test_the_summary_gives_each_workers_share_of_the_steady_state(run_dir: Path) -> None:
    workers = orjson.loads((run_dir / "summary.json").read_bytes())["limits"]["workers"]
    assert workers == {
        "over": "steady state",
        "unaccounted": {
            "e0": {"seconds": 0.08, "share": 0.4},
            "e1": {"seconds": 0.075, "share": 0.375},
            "main": {"seconds": 0.02, "share": 0.1},
        },
        "waits": {
            "wait.rollout": {"main": {"seconds": 0.02, "share": 0.1}},
            "wait.weights": {"e0": {"seconds": 0.03, "share": 0.15}},
        },
    }


def test_the_report_names_the_waits_and_the_workers_with_most_unaccounted(
    run_dir: Path,
) -> None:
    text = format_report(load_report(run_dir))
    assert "  wait.weights      e0 0.030 s (15%) of their windows waiting" in text
    assert "  wait.rollout      main 0.020 s (10%) of their windows waiting" in text
    assert (
        "  unaccounted       e0 0.080 s (40%), e1 0.075 s (38%), main 0.020 s (10%) "
        "of their windows: no span" in text
    )


def test_a_resumed_segment_counts_only_the_workers_it_sees() -> None:
    ledger = WorkerLedger()
    ledger.window(100, WorkerTiming({"a": 60, "b": 10}, {}), steady=False)
    found = ledger.window(100, WorkerTiming({"a": 100}, {}), steady=False)
    assert found is not None and found[0]["unaccounted_workers"] == 2  # b: all 100 ns
    ledger.resumed()
    found = ledger.window(100, WorkerTiming({"a": 100}, {}), steady=False)
    assert found is not None and found[0]["unaccounted_workers"] == 1
    assert ledger.summary()["unaccounted"] == {
        "a": {"seconds": 40e-9, "share": 40 / 300},
        "b": {"seconds": 190e-9, "share": 0.95},
    }
    assert ledger.window(5, WorkerTiming({}, {}), steady=True) == (
        {
            "unaccounted_seconds_max": 5e-9,
            "unaccounted_seconds_min": 5e-9,
            "unaccounted_seconds_mean": 5e-9,
            "unaccounted_workers": 1,
        },
        {"unaccounted_argmax_worker": "a"},
    )
    assert WorkerLedger().window(5, WorkerTiming({}, {}), steady=True) is None


def test_a_piece_is_clipped_to_the_window_and_a_wait_counted_once_per_worker() -> None:
    pieces = [
        ("a", None, 0, 50),
        ("a", "wait.x", 40, 120),  # clipped to 40-100
        ("a", "wait.x", 60, 70),  # inside the first: once
        ("b", "wait.x", 90, 95),
        ("c", None, 100, 130),  # after the window: no worker of it
        ("d", None, 100, 100),  # empty, at its end: none either
    ]
    assert measure_workers(0, 100, pieces) == WorkerTiming(
        {"a": 100, "b": 5}, {("wait.x", "a"): 60, ("wait.x", "b"): 5}
    )
