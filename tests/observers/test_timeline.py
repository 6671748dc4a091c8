"""The run timeline on a scripted streaming run with a manual clock.

Two engines (threads B, C) run ahead of the trainer (thread A): iteration 0's rollouts
start before the first boundary, the next iteration's generation overlaps training, a
weight load crosses a boundary, a span arrives after its window was finalised, one
iteration is observed but never starts, and spans run past the run's finish. Every
figure below is worked out by hand (milliseconds) from the span list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_scripted_run import manual_session  # the same manual-clock session
from twinkle.observers._intervals import union_ns
from twinkle.perf import Span
from twinkle.perf.stats import MemoryReading
from twinkle.run import RunSession, replay

MS = 1_000_000
A, B, C = 1, 2, 3  # trainer, engine 1, engine 2
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"], "publish": ["weights.load"]},
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


#: every span of the run with the moment (ms) it is published
SCRIPT: list[tuple[int, Span]] = [
    # published just before boundary 1 (t=100)
    (99, _s("generate", 2, 30, B, iteration=0)),  # before the first boundary (t=10)
    (99, _s("generate", 4, 26, C, iteration=0)),
    (99, _s("train.fwd", 30, 70, A)),  # no attribute: the window holding its start
    (99, _s("generate", 35, 90, B, iteration=1)),  # streaming ahead
    (99, _s("twinkle.observe", 50, 54, A, event="x")),  # overhead inside train.fwd
    # published just before boundary 2 (t=200)
    (199, _s("generate", 40, 120, C, iteration=1)),  # crosses boundary 1
    (199, _s("weights.load", 90, 105, B)),  # crosses boundary 1, no attribute
    (199, _s("train.fwd", 120, 160, A)),
    (199, _s("twinkle.observe", 155, 157, B, event="x")),  # on an engine thread
    (199, _s("generate", 160, 180, C, iteration=5)),  # iteration 5 never starts
    # published in the last window, before the finish (t=260)
    (259, _s("generate", 150, 210, B, iteration=2)),  # crosses boundary 2
    (259, _s("train.fwd", 210, 250, A)),
    (259, _s("train.late", 60, 80, A)),  # window 0 was finalised at t=200: late
    (259, _s("weights.load", 255, 270, B)),  # runs past the finish
    (259, _s("generate", 262, 268, C)),  # starts after the finish: tear-down
]
BOUNDARIES_MS = [10, 100, 200]
FINISH_MS = 260


def _run(out_dir: Path) -> RunSession:
    run, clock = manual_session(out_dir, "timeline", CONFIG)
    bus = run.bus
    samples = {0: [10, 20], 1: [5, 5, 5], 2: [7]}
    reading = MemoryReading("w0", None, 1, "h", "cpu", 1000, 2001, None, None, None, None)
    for it, at_ms in enumerate(BOUNDARIES_MS):
        batch = [s for t, s in SCRIPT if t < at_ms and (it == 0 or t >= BOUNDARIES_MS[it - 1])]
        if batch:
            clock.set(at_ms * MS - MS)
            bus.publish_spans("main", bus.anchor, batch)
        clock.set(at_ms * MS)
        bus.iteration_started(it)
        if it == 0:
            bus.samples(iteration=5, phase="rollout", lengths=[100])  # never starts
        bus.samples(iteration=it, phase="rollout", lengths=samples[it], groups=1)
        bus.samples(iteration=it, phase="train", lengths=samples[it])
        bus.optimizer_step(iteration=it, step=it + 1, samples=len(samples[it]))
        bus.memory([reading], iteration=it)
    clock.set((FINISH_MS - 1) * MS)
    bus.publish_spans("main", bus.anchor, [s for t, s in SCRIPT if t >= BOUNDARIES_MS[-1]])
    clock.set(FINISH_MS * MS)
    run.finish()
    return run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _run(tmp_path_factory.mktemp("timeline"))
    assert run.out_dir is not None
    return run.out_dir


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line) for line in (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    ]


def _values(run_dir: Path, kind: str, scope: str) -> dict[int, dict[str, Any]]:
    return {
        r["iteration"]: r["values"]
        for r in _records(run_dir)
        if r["kind"] == kind and r["scope"] == scope
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 9)


def test_windows_tile_the_run_and_busy_never_exceeds_wall(run_dir: Path) -> None:
    timing = _values(run_dir, "timing", "iteration")
    run = _values(run_dir, "timing", "run")[2]
    walls = [_ms(timing[i]["window_wall_seconds"]) for i in range(3)]
    assert walls == [90, 100, 60]
    assert (_ms(run["setup_wall_seconds"]), _ms(run["teardown_wall_seconds"])) == (10, 10)
    # set-up [0, 10) + windows [10, 260) + tear-down [260, 270): the whole run, exactly
    assert run["wall_seconds"] * 1e9 == 270 * MS
    assert sum(walls) + 10 + 10 == _ms(run["wall_seconds"])
    for t in timing.values():
        assert t["window_busy_seconds"] <= t["window_wall_seconds"]
        assert t["window_idle_seconds"] == pytest.approx(
            t["window_wall_seconds"] - t["window_busy_seconds"], abs=1e-12
        )


def test_window_view_clips_every_span_whichever_iteration_it_serves(run_dir: Path) -> None:
    t = _values(run_dir, "timing", "iteration")
    w0, w1, w2 = (
        {k: _ms(v) for k, v in t[i].items() if k.startswith("window_") and k.endswith("_seconds")}
        for i in range(3)
    )
    assert w0 == {
        "window_wall_seconds": 90,
        "window_overhead_seconds": 4,
        "window_logical_seconds": 86,
        "window_busy_seconds": 90,
        "window_idle_seconds": 0,
        "window_span_seconds": 201,
        "window_unnamed_seconds": 0,  # every span in a phase
        "window_rollout_seconds": 85,  # [10,30) u [35,100): iterations 0 and 1 alike
        "window_rollout_logical_seconds": 85,  # the overhead ran on the trainer thread
        "window_train_seconds": 40,
        "window_train_logical_seconds": 36,
        "window_publish_seconds": 10,  # the part of the load before boundary 1
        "window_publish_logical_seconds": 10,
        "window_overlap_rollout_train_seconds": 35,
        "window_overlap_rollout_publish_seconds": 10,
        "window_overlap_train_publish_seconds": 0,
        # the engines (rollout 85) were busier than the trainer (train 40): the path runs
        # through generation, then the training it did not cover ([30, 35)); publish is
        # no streaming phase here (other), and lies inside the rollouts
        "window_path_training_seconds": 5,
        "window_path_publish_seconds": 0,
        "window_path_generation_seconds": 85,
        "window_path_other_seconds": 0,
        "window_path_overhead_seconds": 0,
        "window_path_idle_seconds": 0,
    }
    assert (w1["window_rollout_seconds"], w1["window_rollout_logical_seconds"]) == (70, 68)
    assert (w1["window_overlap_rollout_train_seconds"], w1["window_publish_seconds"]) == (10, 5)
    assert (w1["window_busy_seconds"], w1["window_overhead_seconds"]) == (100, 2)
    assert (w2["window_busy_seconds"], w2["window_idle_seconds"]) == (55, 5)
    assert w2["window_publish_seconds"] == 5  # [255, 260): the rest is tear-down


def test_attributed_view_keeps_each_iterations_work_whole(run_dir: Path) -> None:
    t = _values(run_dir, "timing", "iteration")
    a0 = t[0]
    # iteration 0's rollouts started before the first boundary: counted whole here
    assert _ms(a0["attributed_rollout_sum_seconds"]) == 50
    assert _ms(a0["attributed_rollout_seconds"]) == 28
    assert _ms(a0["attributed_train_logical_seconds"]) == 36
    assert _ms(a0["attributed_publish_seconds"]) == 15  # the crossing load, whole
    assert a0["attributed_spans"] == 4
    assert _ms(t[1]["attributed_rollout_seconds"]) == 85  # [35, 120), before its window
    assert _ms(t[2]["attributed_rollout_logical_seconds"]) == 58  # engine-thread overhead
    assert _ms(t[2]["attributed_publish_seconds"]) == 15


def test_run_figures_are_true_unions_and_overlaps(run_dir: Path) -> None:
    run = {
        k: _ms(v) if k.endswith("_seconds") else v
        for k, v in _values(run_dir, "timing", "run")[2].items()
    }
    spans = [s for _, s in SCRIPT if s.name != "twinkle.observe" and s.name != "train.late"]

    def union(prefix: str) -> float:
        return union_ns((s.start_ns, s.end_ns) for s in spans if s.name.startswith(prefix)) / MS

    assert run["rollout_seconds"] == union("generate") == 179
    assert run["train_seconds"] == union("train.") == 120
    assert run["publish_seconds"] == union("weights.load") == 30
    assert run["busy_seconds"] == 263
    assert run["idle_seconds"] == 7
    assert run["overlap_rollout_train_seconds"] == 45
    assert run["generation_hidden_seconds"] == 45
    assert run["generation_hidden_share"] == 45 / 179
    assert (run["overhead_seconds"], run["logical_seconds"]) == (6, 264)
    # from the first phase span (2) to the loop's end (the finish, 260): no tear-down
    assert (run["active_wall_seconds"], run["active_logical_seconds"]) == (258, 252)
    assert (run["setup_busy_seconds"], run["setup_idle_seconds"]) == (8, 2)
    assert (run["late_spans"], run["late_seconds"]) == (1, 20)
    assert run["iterations"] == 3


def test_every_span_is_accounted_for(run_dir: Path) -> None:
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    spans = summary["spans"]
    durations = sum(s.duration_ns for _, s in SCRIPT if s.name != "twinkle.observe")
    assert durations == 441 * MS
    assert spans["total"] == 13
    assert spans["total_seconds"] * 1e9 == pytest.approx(durations, abs=1)
    where = {k: (v["spans"], _ms(v["seconds"])) for k, v in spans["attributed"].items()}
    assert where == {
        "iterations": (10, 395),
        "setup": (0, 0),
        "teardown": (1, 6),
        "unstarted": (1, 20),
        "late": (1, 20),
    }
    window = spans["window"]
    assert _ms(window["in_windows_seconds"]) + _ms(window["late"]["seconds"]) == 441
    assert summary["unstarted_iterations"] == {
        "5": {
            "spans": 1,
            "span_seconds": 0.02,
            "samples": {"rollout": 1},
            "tokens": {"rollout": 100},
        }
    }


def test_throughput_uses_attributed_phase_time_and_the_active_run(run_dir: Path) -> None:
    rollout = _values(run_dir, "rollout", "iteration")
    assert rollout[0]["tokens"] == 30
    assert rollout[0]["seconds"] == 0.028
    assert rollout[0]["tokens_per_s_per_device"] == 30 / (0.028 * 2)
    it = _values(run_dir, "iteration", "iteration")
    assert it[0]["window_logical_seconds"] == 0.086
    run = _values(run_dir, "run", "run")[2]
    # every generated token, iteration 5's included, over the active logical seconds
    assert run["tokens"] == 152
    assert run["tokens_per_s_per_device"] == pytest.approx(152 / (0.252 * 3), rel=1e-15)
    phase = {r["kind"]: r["values"] for r in _records(run_dir) if r["scope"] == "window"}
    assert phase["rollout"]["seconds"] == 0.177  # Σ window rollout logical: 8+85+68+10+6
    assert phase["train"]["seconds"] == 0.116
    assert phase["train"]["tokens"] == 52


def test_set_up_loop_and_tear_down_partition_the_run(run_dir: Path) -> None:
    run = {k: _ms(v) for k, v in _values(run_dir, "timing", "run")[2].items()}
    # set-up [0, 10), the loop [10, 260) (the three windows), tear-down [260, 270)
    assert (run["setup_wall_seconds"], run["loop_wall_seconds"]) == (10, 250)
    assert run["teardown_wall_seconds"] == 10
    for part in ("wall", "busy", "idle", "overhead"):
        assert run[f"{part}_seconds"] == pytest.approx(
            run[f"setup_{part}_seconds"]
            + run[f"loop_{part}_seconds"]
            + run[f"teardown_{part}_seconds"],
            abs=1e-9,
        ), part
    # busy in the loop: windows 0-2 busy 90 + 100 + 55, idle 0 + 0 + 5 (250-255 in window 2)
    assert (run["loop_busy_seconds"], run["loop_idle_seconds"]) == (245, 5)
    assert (run["teardown_busy_seconds"], run["teardown_idle_seconds"]) == (10, 0)


def test_warm_up_and_drain_are_flagged_and_left_out_of_the_steady_state(run_dir: Path) -> None:
    timing = _values(run_dir, "timing", "iteration")
    flags = {
        r["iteration"]: r["attrs"]["window_flags"]
        for r in _records(run_dir)
        if r["kind"] == "timing" and r["scope"] == "iteration"
    }
    assert flags == {0: ["warmup"], 1: [], 2: ["drain"]}
    assert [timing[i]["window_steady"] for i in range(3)] == [0, 1, 0]
    assert [_values(run_dir, "iteration", "iteration")[i]["steady"] for i in range(3)] == [0, 1, 0]
    run = _values(run_dir, "run", "run")[2]
    # iteration 1 alone: 15 rollout tokens over its window, 100 ms less 2 ms of overhead
    assert run["steady_iterations"] == 1
    assert (run["steady_tokens"], run["steady_seconds"]) == (15, 0.098)
    assert run["steady_tokens_per_s_per_device"] == 15 / (0.098 * 3)
    phase = {r["kind"]: r["values"] for r in _records(run_dir) if r["scope"] == "window"}
    # its rollouts (35-90 on B, 40-120 on C: 85 ms) on 2 devices; its training (120-160)
    assert phase["rollout"]["steady_tokens_per_s_per_device"] == 15 / (0.085 * 2)
    assert phase["train"]["steady_tokens_per_s_per_device"] == 15 / 0.040


def test_webui_file_has_one_line_per_iteration_and_integer_bytes(run_dir: Path) -> None:
    lines = [orjson.loads(x) for x in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1, 2]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert lines[0]["iteration/tokens"] == 30  # never the run window's 152
    assert not any(key.startswith("run/") for line in lines for key in line)
    assert lines[0]["memory/host_peak_rss_bytes_max"] == 2001
    memory = [r for r in _records(run_dir) if r["kind"] == "memory"]
    for r in memory:
        for key, value in r["values"].items():
            if "_bytes_" in key and value is not None:
                assert type(value) is int, (key, value)


def test_replay_reproduces_the_timeline_byte_for_byte(run_dir: Path, tmp_path: Path) -> None:
    replay(run_dir / "events.jsonl", out_dir=tmp_path)
    for name in ("metrics_raw.jsonl", "metrics.jsonl", "summary.json"):
        assert (tmp_path / name).read_bytes() == (run_dir / name).read_bytes(), name
