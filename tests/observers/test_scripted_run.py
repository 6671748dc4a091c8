"""A scripted run with a manual clock: three iterations, generation overlapping training
(streaming), observer overhead spans nested inside phase spans — exact records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.observers import ThroughputObserver, TimingObserver
from twinkle.perf import ManualClock, Span
from twinkle.run import RunSession

MS = 1_000_000
A, B = 1, 2  # thread ids: trainer thread A, rollout thread B
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 2},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 3},
    "streaming": {"generation": "rollout", "training": "train"},
    "total_steps": 3,
}


def _s(name: str, start_ms: int, end_ms: int, tid: int, **attrs: Any) -> Span:
    return Span(name, start_ms * MS, end_ms * MS, tid, 1, attrs, None)


def _over(start_ms: int, end_ms: int, tid: int) -> Span:
    return _s("twinkle.observe", start_ms, end_ms, tid, event="x")


def manual_session(
    out_dir: Path,
    run_id: str,
    config: dict[str, Any],
    clock: ManualClock | None = None,
    **options: Any,
) -> tuple[RunSession, ManualClock]:
    """A started run on a manual clock (from 0 unless given; wall time = 2023-11-14 +
    the clock), records written in the caller's thread, no third-party plugins;
    ``options`` to the session (``resume=True``)."""
    clock = ManualClock(0) if clock is None else clock
    run = RunSession(
        out_dir=out_dir,
        run_id=run_id,
        config=config,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
        autoload=False,
        background_writer=False,
        **options,
    )
    return run.start(), clock


def scripted_run(out_dir: Path) -> RunSession:
    """Publish the scripted events; every time is given, nothing is measured."""
    run, clock = manual_session(out_dir, "scripted", CONFIG)
    bus = run.bus
    anchor = bus.anchor

    def spans(*ss: Span) -> None:
        bus.publish_spans("main", anchor, list(ss))

    bus.iteration_started(0)  # at 0 ms
    spans(
        _s("generate", 0, 40, A, iteration=0),
        _s("train.fwd", 40, 70, A),
        _s("train.step", 70, 80, A),
        _s("generate", 50, 120, B, iteration=1),  # next rollout, streaming ahead
        _over(60, 65, A),  # observer overhead nested in train.fwd,
        _over(63, 67, A),  # overlapping another: deducted once
    )
    bus.samples(iteration=0, phase="rollout", lengths=[10, 20], groups=1)
    bus.samples(iteration=0, phase="train", lengths=[10, 20])
    bus.optimizer_step(iteration=0, step=1, samples=2)

    clock.set(100 * MS)
    bus.iteration_started(1)
    spans(
        _s("train.fwd", 100, 150, A),
        _s("generate", 110, 160, B, iteration=2),
        _over(120, 122, A),
        _over(130, 131, B),  # on the rollout thread, inside next iteration's generate
    )
    bus.samples(iteration=1, phase="rollout", lengths=[5, 5, 5], groups=1)
    bus.samples(iteration=1, phase="train", lengths=[5, 5, 5])
    bus.optimizer_step(iteration=1, step=2, samples=3)

    clock.set(200 * MS)
    bus.iteration_started(2)
    spans(
        _s("train.fwd", 200, 240, A),
        _s("train.inner", 210, 220, A),  # nested in train.fwd: same phase
        _over(215, 218, A),  # nested in both
    )
    bus.samples(iteration=2, phase="rollout", lengths=[40], groups=1)
    bus.samples(iteration=2, phase="train", lengths=[40])
    bus.optimizer_step(iteration=2, step=3, samples=1)

    clock.set(250 * MS)
    run.finish(terminal_totals={"samples_rollout": 6})
    return run


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = scripted_run(tmp_path_factory.mktemp("runs"))
    assert run.out_dir is not None
    return run.out_dir


def _by(records: list[dict[str, Any]], kind: str, scope: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind and r["scope"] == scope]


def test_timing_records_are_exact(run_dir: Path) -> None:
    timing = _by(_records(run_dir / "metrics_raw.jsonl"), "timing", "iteration")
    assert [r["iteration"] for r in timing] == [0, 1, 2]
    assert [r["step"] for r in timing] == [1, 2, 3]
    v0, v1, v2 = (r["values"] for r in timing)
    # iteration 0: window [0,100); overhead [60,65] u [63,67] = 7 ms, counted once
    assert v0["window_wall_seconds"] == 0.1
    assert v0["window_overhead_seconds"] == 0.007
    assert v0["window_logical_seconds"] == 0.093
    assert v0["attributed_rollout_sum_seconds"] == 0.04
    assert v0["attributed_rollout_logical_seconds"] == 0.04
    assert v0["attributed_train_sum_seconds"] == 0.04
    assert v0["attributed_train_seconds"] == 0.04
    assert v0["attributed_train_logical_seconds"] == 0.033  # 40 ms less 7 ms nested overhead
    # the window holds the next iteration's generate [50,100) too: busy [0,100)
    assert v0["window_busy_seconds"] == 0.1
    assert v0["window_overlap_rollout_train_seconds"] == 0.03  # [50,80)
    # iteration 1: the rollout for it ran [50,120) during iteration 0 (streaming)
    assert v1["window_overhead_seconds"] == 0.003
    assert v1["window_logical_seconds"] == 0.097
    assert v1["attributed_rollout_sum_seconds"] == 0.07
    assert v1["attributed_train_logical_seconds"] == 0.048
    assert v1["window_busy_seconds"] == 0.06  # [100,160)
    assert v1["window_overlap_rollout_train_seconds"] == 0.05  # train [100,150) under generate
    # iteration 2: nested train spans: sum adds them, union does not
    assert v2["window_wall_seconds"] == 0.05
    assert v2["window_overhead_seconds"] == 0.003
    assert v2["window_logical_seconds"] == 0.047
    assert v2["attributed_train_sum_seconds"] == 0.05
    assert v2["attributed_train_seconds"] == 0.04
    assert v2["attributed_train_logical_seconds"] == 0.037
    # the rollout thread's overhead [130,131) fell inside this iteration's generate
    assert v2["attributed_rollout_seconds"] == 0.05
    assert v2["attributed_rollout_logical_seconds"] == 0.049


def test_throughput_records_are_ratios_of_the_iteration_totals(run_dir: Path) -> None:
    records = _records(run_dir / "metrics_raw.jsonl")
    rollout = [r["values"] for r in _by(records, "rollout", "iteration")]
    train = [r["values"] for r in _by(records, "train", "iteration")]
    iteration = [r["values"] for r in _by(records, "iteration", "iteration")]
    assert [v["tokens"] for v in rollout] == [30, 15, 40]
    assert rollout[0]["seconds"] == 0.04
    assert rollout[0]["tokens_per_s"] == pytest.approx(30 / 0.04, rel=1e-12)
    assert rollout[0]["tokens_per_s_per_device"] == pytest.approx(30 / 0.04 / 2, rel=1e-12)
    assert rollout[0]["groups"] == 1
    assert train[0]["tokens_per_s_per_device"] == pytest.approx(30 / 0.033, rel=1e-12)
    assert rollout[2]["tokens_per_s"] == pytest.approx(40 / 0.049, rel=1e-12)
    assert [v["tokens"] for v in iteration] == [30, 15, 40]
    assert iteration[1]["tokens_per_s_per_device"] == pytest.approx(15 / 0.097 / 3, rel=1e-12)
    (run,) = _by(records, "run", "run")
    assert run["values"]["tokens"] == 85
    assert run["values"]["iterations"] == 3
    assert run["values"]["optimizer_updates"] == 3
    window = 85 / (0.25 - 0.013)  # the active run: [0, 250) less the overhead
    assert run["values"]["tokens_per_s"] == pytest.approx(window, rel=1e-12)
    assert run["values"]["tokens_per_s_per_device"] == pytest.approx(window / 3, rel=1e-12)
    (rollout_window,) = _by(records, "rollout", "window")
    assert rollout_window["values"]["tokens_per_s"] == pytest.approx(
        85 / 0.149,
        rel=1e-12,  # the true union [0,40) u [50,160), less [130,131) on B
    )


def test_seq_is_strictly_increasing_and_records_are_complete(run_dir: Path) -> None:
    records = _records(run_dir / "metrics_raw.jsonl")
    assert [r["seq"] for r in records] == list(range(len(records)))
    kinds = sorted({(r["kind"], r["scope"]) for r in records})
    assert kinds == [
        ("iteration", "iteration"),
        ("rollout", "iteration"),
        ("rollout", "window"),
        ("run", "run"),
        ("timing", "iteration"),
        ("timing", "run"),
        ("train", "iteration"),
        ("train", "window"),
        ("waits", "iteration"),
    ]


def test_summary_counts_overhead_once_and_calibrates_totals(run_dir: Path) -> None:
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["iterations"] == 3
    assert summary["seconds"]["overhead_seconds"] == pytest.approx(0.013, abs=1e-15)
    assert summary["seconds"]["logical_seconds"] == pytest.approx(0.237, abs=1e-15)
    assert summary["observer_failures"] == {}
    assert summary["records_dropped"] == 0
    counts = summary["counts"]
    assert counts["samples_rollout"]["accumulated"] == 6
    assert counts["samples_rollout"]["terminal"] == 6
    assert counts["samples_rollout"]["discrepancy"] == 0
    assert counts["optimizer_updates"]["accumulated"] == 3


def test_webui_flat_file_has_one_numeric_object_per_iteration(run_dir: Path) -> None:
    lines = _records(run_dir / "metrics.jsonl")
    assert [line["iteration"] for line in lines] == [0, 1, 2]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert line["total_steps"] == 3
        assert all(isinstance(v, int | float) for v in line.values())


def test_trace_is_valid_chrome_trace_json(run_dir: Path) -> None:
    events = orjson.loads((run_dir / "trace.json").read_bytes())
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"generate", "train.fwd", "train.inner", "twinkle.observe"} <= names


def test_overhead_intervals_are_pruned_as_iterations_close(tmp_path: Path) -> None:
    clock = ManualClock(0)
    run = RunSession(
        out_dir=None, run_id="prune", config=CONFIG, clock=clock, autoload=False
    ).start()
    timing = run.pm.get_plugin("timing")
    throughput = run.pm.get_plugin("throughput")
    assert isinstance(timing, TimingObserver) and isinstance(throughput, ThroughputObserver)
    for i in range(200):
        run.bus.iteration_started(i)
        base = i * 10
        run.bus.publish_spans(
            "main", run.bus.anchor, [_s("train.fwd", base, base + 5, A), _over(base, base + 1, A)]
        )
        clock.set((i + 1) * 10 * MS)
    # one shared timeline; it keeps only what open iterations can still need
    assert timing.timeline is throughput.timeline
    assert len(timing.timeline.overhead) < 10
    run.finish()
