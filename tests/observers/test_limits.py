"""What limits the run (issue 28), on a scripted run with a manual clock: each window
is one case, its critical path and verdict worked out by hand (milliseconds).

Thread A is the trainer, B an engine; boundaries every 100 ms from 0, finish at 600::

    window 0 [0, 100)    train 0-90, generate 0-30        trainer busier: training-bound
    window 1 [100, 200)  train 100-140, generate 100-195   engines busier: generation-bound
    window 2 [200, 300)  train 200-230, load 200-270, generate 270-290: publish-bound
    window 3 [300, 400)  train 300-355, then generate 355-395: 55 % vs 40 %, mixed
    window 4 [400, 500)  train 400-420, eval 420-490 (no side): abstain
    window 5 [500, 600)  train 500-560: training-bound (the drain)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import check_replay, check_run
from observers.test_scripted_run import manual_session
from twinkle.observers import ObserverConfig
from twinkle.observers._limits import verdict
from twinkle.perf import Span

MS = 1_000_000
A, B = 1, 2
CONFIG: dict[str, Any] = {
    "phases": {
        "rollout": ["generate"],
        "train": ["train.*"],
        "publish": ["weights.load"],
        "eval": ["eval.*"],
    },
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
    "streaming": {"generation": "rollout", "training": "train", "publish": "publish"},
}


def _s(name: str, start_ms: int, end_ms: int, tid: int) -> Span:
    return Span(name, start_ms * MS, end_ms * MS, tid, 1, {}, None)


SPANS = [
    _s("train.step", 0, 90, A),
    _s("generate", 0, 30, B),
    _s("train.step", 100, 140, A),
    _s("generate", 100, 195, B),
    _s("train.step", 200, 230, A),
    _s("weights.load", 200, 270, B),
    _s("generate", 270, 290, B),
    _s("train.step", 300, 355, A),
    _s("generate", 355, 395, B),
    _s("train.step", 400, 420, A),
    _s("eval.run", 420, 490, A),
    _s("train.step", 500, 560, A),
]
#: each window's critical path (ms): training, publish, generation, other, overhead, idle
PATHS = [
    (90, 0, 0, 0, 0, 10),
    (0, 0, 95, 0, 0, 5),
    (0, 70, 20, 0, 0, 10),
    (55, 0, 40, 0, 0, 5),
    (20, 0, 0, 70, 0, 10),
    (60, 0, 0, 0, 0, 40),
]
VERDICTS = [
    "training-bound",
    "generation-bound",
    "publish-bound",
    "mixed",
    "abstain",
    "training-bound",
]
KINDS = ("training", "publish", "generation", "other", "overhead", "idle")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run, clock = manual_session(tmp_path_factory.mktemp("limits"), "limits", CONFIG)
    bus = run.bus
    for it in range(7):
        at = it * 100
        batch = [s for s in SPANS if (at - 100) * MS < s.end_ns <= at * MS]
        if batch:
            clock.set(at * MS - 1)
            bus.publish_spans("main", bus.anchor, batch)
        clock.set(at * MS)
        if it < 6:
            bus.iteration_started(it)
            bus.samples(iteration=it, phase="rollout", lengths=[10])
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def test_each_windows_critical_path_and_verdict(run_dir: Path) -> None:
    timing = sorted(
        (r for r in _records(run_dir) if (r["kind"], r["scope"]) == ("timing", "iteration")),
        key=lambda r: r["iteration"],
    )
    paths = [
        tuple(round(t["values"][f"window_path_{k}_seconds"] * 1e3, 6) for k in KINDS)
        for t in timing
    ]
    assert paths == PATHS
    assert [t["attrs"]["window_verdict"] for t in timing] == VERDICTS
    for t in timing:  # the path adds up to the window
        total = sum(t["values"][f"window_path_{k}_seconds"] for k in KINDS)
        assert total == pytest.approx(t["values"]["window_wall_seconds"], abs=1e-12)


def test_the_runs_verdict_is_the_rule_on_the_steady_state(run_dir: Path) -> None:
    limits = orjson.loads((run_dir / "summary.json").read_bytes())["limits"]
    # windows 1-4 (0: warm-up, 5: drain): generation 95+20+40 = 155, training 0+0+55+20
    # = 75, publish 70, other 70, idle 30 of 400 ms: generation 38.75 % < 50 %: mixed
    path = {k: round(v * 1e3, 6) for k, v in limits["path_seconds"].items()}
    assert path == {
        "training": 75,
        "publish": 70,
        "generation": 155,
        "other": 70,
        "overhead": 0,
        "idle": 30,
    }
    assert (limits["verdict"], limits["over"], limits["steady_windows"]) == (
        "mixed",
        "steady state",
        4,
    )
    assert limits["windows"] == {
        "abstain": 1,
        "generation-bound": 1,
        "mixed": 1,
        "publish-bound": 1,
        "training-bound": 2,
    }
    # at most half of each side's time, and no more than its time on the path: training
    # min(75, 145 / 2), generation min(155, 155 / 2), publish min(70, 70 / 2)
    faster = {k: round(v["seconds"] * 1e3, 6) for k, v in limits["twice_as_fast"].items()}
    assert faster == {"training": 72.5, "generation": 77.5, "publish": 35}
    assert limits["twice_as_fast"]["generation"]["share"] == pytest.approx(77.5 / 400)
    busy = limits["busy_shares"]
    assert (busy["training"], busy["generation"], busy["publish"]) == (
        pytest.approx(145 / 400),
        pytest.approx(155 / 400),
        pytest.approx(70 / 400),
    )


def test_the_run_record_holds_the_loop_and_steady_paths(run_dir: Path, tmp_path: Path) -> None:
    (run,) = [
        r["values"] for r in _records(run_dir) if (r["kind"], r["scope"]) == ("timing", "run")
    ]
    loop = {k: round(run[f"loop_path_{k}_seconds"] * 1e3, 6) for k in KINDS}
    assert loop == {k: sum(p[i] for p in PATHS) for i, k in enumerate(KINDS)}
    assert round(run["steady_path_generation_seconds"] * 1e3, 6) == 155
    check_replay(run_dir, tmp_path / "again")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # exactly 50 % with a 20-point lead: bound; a hair less lead: mixed
        ({"training": 50, "generation": 30, "idle": 20}, "training-bound"),
        ({"training": 6, "generation": 4}, "training-bound"),  # 0.6 - 0.4 in floats < 0.2
        ({"training": 50, "generation": 31, "idle": 19}, "mixed"),
        ({"generation": 49, "publish": 0, "idle": 51}, "abstain"),  # sides under half
        ({"idle": 0}, "abstain"),  # no time
    ],
)
def test_the_rule_at_its_edges(path: dict[str, int], expected: str) -> None:
    full = dict.fromkeys(KINDS, 0) | path
    assert verdict(full, ObserverConfig.parse(CONFIG))[0] == expected


@pytest.mark.parametrize(
    ("path", "why"),
    [
        # 588 and 394 of 1000: shown as 59 % and 39 %, a lead that rounds to the margin
        (
            {"training": 588, "generation": 394, "idle": 18},
            "training 59% and generation 39% of the critical path: a lead of 19.4 points, "
            "under the 20 a bound side needs",
        ),
        (  # (19.996 points: rounded down, not up to the margin)
            {"training": 59996, "generation": 40000, "idle": 4},
            "training 60% and generation 40% of the critical path: a lead of 19.9 points, "
            "under the 20 a bound side needs",
        ),
        (
            {"training": 45, "generation": 20, "idle": 35},
            "training 45% and generation 20% of the critical path: no side holds 50%",
        ),
    ],
)
def test_a_mixed_verdict_says_which_test_failed_exactly(path: dict[str, int], why: str) -> None:
    full = dict.fromkeys(KINDS, 0) | path
    assert verdict(full, ObserverConfig.parse(CONFIG)) == ("mixed", why)


@pytest.mark.parametrize(
    ("training_busy", "expected"),
    [(80, "generation-bound"), (81, "mixed"), (92, "mixed")],
)
def test_a_side_bound_by_the_path_is_not_the_bound_when_another_ran_nearly_as_long(
    training_busy: int, expected: str
) -> None:
    """Generation holds 96 % of the path; training ran ``training_busy`` % of the stretch
    beside it, so a faster generation alone saves at most 100 - that: at least 20 points
    (the margin) and generation bounds the run, else both matter."""
    path = dict.fromkeys(KINDS, 0) | {"generation": 96, "training": 2, "idle": 2}
    rest = {"generation": ("training", training_busy), "training": ("generation", 96)}
    found, why = verdict(path, ObserverConfig.parse(CONFIG), rest)
    assert found == expected
    if training_busy == 92:
        assert why == (
            "generation 96% of the critical path, but training ran 92% of the stretch: a "
            "faster generation alone saves at most 8% (both matter)"
        )


def _pipeline(tmp_path: Path, run_id: str, cycle: list[Span]) -> dict[str, Any]:
    """Four 100 ms windows, each running ``cycle`` (ms within the window); the summary's
    ``limits``, in ms."""
    run, clock = manual_session(tmp_path, run_id, CONFIG_WRITES)
    bus = run.bus
    for it in range(5):
        at = it * 100
        if it:
            clock.set(at * MS - 1)
            shifted = [
                Span(s.name, s.start_ns + (at - 100) * MS, s.end_ns + (at - 100) * MS,
                     s.thread_id, s.pid, s.attrs, None)
                for s in cycle
            ]  # fmt: skip
            bus.publish_spans("main", bus.anchor, shifted)
        clock.set(at * MS)
        if it < 4:
            bus.iteration_started(it)
            bus.samples(iteration=it, phase="rollout", lengths=[10])
    run.finish()
    assert run.out_dir is not None
    limits: dict[str, Any] = orjson.loads((run.out_dir / "summary.json").read_bytes())["limits"]
    return limits


CONFIG_WRITES = {**CONFIG, "phases": {**CONFIG["phases"], "publish": ["weights.*"]}}


def _ms(limits: dict[str, Any], key: str) -> dict[str, float]:
    return {
        k: round((v if key == "path_seconds" else v["seconds"]) * 1e3, 6)
        for k, v in limits[key].items()
    }


def test_a_balanced_pipeline_is_mixed_and_a_faster_side_saves_what_the_other_leaves(
    tmp_path: Path,
) -> None:
    """Each 100 ms window: the engine generates 0-96, the trainer trains 4-96 beside it.
    The engines are busier, so the path is generation's (96 + 4 idle), but a
    twice-as-fast generation leaves the window no shorter than training's 92 ms: the
    steady state (windows 1-2, 200 ms) saves at most 16 ms, not 96."""
    limits = _pipeline(tmp_path, "balanced", [_s("generate", 0, 96, B), _s("train.step", 4, 96, A)])
    path = _ms(limits, "path_seconds")
    assert (path["generation"], path["idle"], path["training"]) == (192, 8, 0)
    assert limits["verdict"] == "mixed"
    assert limits["reason"].startswith("generation 96% of the critical path, but training ran")
    faster = _ms(limits, "twice_as_fast")
    # generation: min(192 on the path, 192 / 2, 200 - 184 training ran); training: 0 on
    # the path; publish: none ran
    assert faster == {"training": 0, "generation": 16, "publish": 0}
    assert limits["windows"] == {"mixed": 4}


def test_the_weights_the_trainer_writes_are_the_trainers_side_of_the_pipeline(
    tmp_path: Path,
) -> None:
    """Each window: the trainer (thread A) trains 0-60 and writes the weights 60-100;
    the engine (thread B, which generates: its load is the engines') loads them 0-2 and
    generates 2-62. The trainer is busy the whole window, the engine 62 ms: the trainer
    sets the pace. Counting the write on the engines' side (62 + 40 > 60) made
    generation the bound at 60 % of the path, a twice-as-fast trainer saving "at most
    0 %" where it saves 30 ms of each 100."""
    limits = _pipeline(
        tmp_path, "writes",
        [_s("train.step", 0, 60, A), _s("weights.write", 60, 100, A),
         _s("weights.load", 0, 2, B), _s("generate", 2, 62, B)],
    )  # fmt: skip
    # the trainer's side first: training 60, then publish 40 (the write; the load runs
    # beside training), generation never first; steady state: windows 1-2
    assert _ms(limits, "path_seconds") == {
        "training": 120, "publish": 80, "generation": 0, "other": 0, "overhead": 0, "idle": 0
    }  # fmt: skip
    assert limits["verdict"] == "training-bound"
    assert limits["reason"] == "training 60% of the critical path, publish next at 40%"
    # training: min(120 on the path, 120 / 2, 200 - 124 the engines ran); generation:
    # none of the path; publish: min(80, 84 / 2, 200 - 120 training or generation ran)
    assert _ms(limits, "twice_as_fast") == {"training": 60, "generation": 0, "publish": 42}


def test_a_side_bound_by_the_path_is_not_the_bound_when_the_other_sides_work_filled_it(
    tmp_path: Path,
) -> None:
    """Each window: the trainer trains 0-100; the engine loads the weights 0-45 and
    generates 45-95. Training holds the whole path, but the engines ran 95 ms of each
    100 (neither their loads, 45, nor their generation, 50, alone more than 80): a
    faster trainer saves at most 5 ms. Both matter."""
    limits = _pipeline(
        tmp_path, "loads",
        [_s("train.step", 0, 100, A), _s("weights.load", 0, 45, B), _s("generate", 45, 95, B)],
    )  # fmt: skip
    assert _ms(limits, "path_seconds")["training"] == 200
    assert limits["verdict"] == "mixed"
    assert limits["reason"] == (
        "training 100% of the critical path, but the engines (generation and publish) ran "
        "95% of the stretch: a faster training alone saves at most 5% (both matter)"
    )
    assert _ms(limits, "twice_as_fast")["training"] == 10  # min(200, 100, 200 - 190)


def test_without_streaming_the_verdict_abstains_saying_why() -> None:
    found, why = verdict(dict.fromkeys(KINDS, 10), ObserverConfig.parse({}))
    assert found == "abstain" and "no config.streaming" in why


def test_the_trace_draws_each_windows_critical_path(run_dir: Path) -> None:
    trace = orjson.loads((run_dir / "trace.json").read_bytes())
    path = [e for e in trace if e.get("cat") == "critical path"]
    # window 2 [200, 300): publish 200-270, generation 270-290, idle 290-300
    window2 = [
        (e["name"], e["ts"] / 1e3, e["dur"] / 1e3) for e in path if 200 <= e["ts"] / 1e3 < 300
    ]
    assert window2 == [("publish", 200, 70), ("generation", 270, 20), ("idle", 290, 10)]
    # every window's slices tile it: 600 ms in all, by kind as the records say
    by_kind: dict[str, float] = {}
    for e in path:
        by_kind[e["name"]] = by_kind.get(e["name"], 0) + e["dur"] / 1e3
    assert sum(by_kind.values()) == pytest.approx(600)
    assert by_kind["generation"] == pytest.approx(sum(p[2] for p in PATHS))
    (track,) = {e["tid"] for e in path}
    names = [
        e["args"]["name"] for e in trace if e.get("name") == "thread_name" and e["tid"] == track
    ]
    assert names == ["critical path"]


def test_without_a_steady_state_window_the_verdict_abstains_giving_the_loops(
    tmp_path: Path,
) -> None:
    """Two iterations: a warm-up (training 90 ms of its 100, as if compiling) and a
    drain; no window is the run's pace, so no verdict, whatever the loop's says."""
    run, clock = manual_session(tmp_path, "short", CONFIG)
    bus = run.bus
    for it, batch in enumerate(([SPANS[0], SPANS[1]], [SPANS[2], SPANS[3]])):
        clock.set(it * 100 * MS)
        bus.iteration_started(it)
        clock.set((it * 100 + 99) * MS)
        bus.publish_spans("main", bus.anchor, batch)
    clock.set(200 * MS)
    run.finish()
    assert run.out_dir is not None
    limits = orjson.loads((run.out_dir / "summary.json").read_bytes())["limits"]
    assert limits["verdict"] == "abstain"
    assert (limits["over"], limits["steady_windows"]) == ("loop", 0)
    assert limits["windows"] == {"generation-bound": 1, "training-bound": 1}
    # the loop: training 90 (window 0), generation 95 (window 1) of 200 ms: neither 50%
    assert (limits["path_seconds"]["training"], limits["path_seconds"]["generation"]) == (
        0.09,
        0.095,
    )
    assert limits["reason"].startswith("no steady-state window (every window is warm-up")
    assert "over the whole loop, warm-up included, mixed:" in limits["reason"]


@pytest.mark.parametrize(
    ("path", "rest", "why"),
    [
        (  # 499 of 1000: no 50 %, though it rounds to it
            {"generation": 499, "training": 200, "other": 301},
            None,
            "generation 49.9% and training 20% of the critical path: no side holds 50%",
        ),
        (  # training ran 802 of 1000: more than 80 %, though it rounds to it
            {"generation": 960, "training": 20, "idle": 20},
            {"generation": ("training", 802)},
            "generation 96% of the critical path, but training ran 80.2% of the stretch: a "
            "faster generation alone saves at most 19.8% (both matter)",
        ),
    ],
)
def test_a_share_next_to_the_line_it_failed_is_given_to_a_tenth(
    path: dict[str, int], rest: dict[str, tuple[str, int]] | None, why: str
) -> None:
    full = dict.fromkeys(KINDS, 0) | path
    assert verdict(full, ObserverConfig.parse(CONFIG), rest) == ("mixed", why)


def test_a_streaming_run_without_an_iteration_has_no_verdict_and_no_failure(
    tmp_path: Path,
) -> None:
    """No window at all: the pipeline's sides hold nothing (a twice-as-fast side's bound
    read the sides of a stretch that had none: the timing observer failed)."""
    run, _ = manual_session(tmp_path, "empty", CONFIG)
    run.finish()
    assert run.out_dir is not None
    summary = orjson.loads((run.out_dir / "summary.json").read_bytes())
    assert summary["observer_failures"] == {}
    limits = summary["limits"]
    assert (limits["verdict"], limits["side_shares"], limits["busy_shares"]) == ("abstain", {}, {})
    assert {k: v["seconds"] for k, v in limits["twice_as_fast"].items()} == {
        "training": 0, "generation": 0, "publish": 0
    }  # fmt: skip


def test_a_threads_late_training_span_still_makes_its_publish_the_trainers(
    tmp_path: Path,
) -> None:
    """Thread C generates 200-250 and loads 250-300 in window 2; its training span
    150-190 arrives after boundary 3, wholly late (in no window). C trained, so its load
    is the trainer's: the trainer's side (train 200-260, load 250-300: 100 ms) is busier
    than the engines' (50), and the path is training 60, publish 40. The late span was
    not noted: generation 50, publish 50, training 0."""
    c = 3
    run, clock = manual_session(tmp_path, "late", CONFIG)
    bus = run.bus
    batches = {
        2: [_s("train.step", 200, 260, A), _s("generate", 200, 250, c),
            _s("weights.load", 250, 300, c)],
        3: [_s("train.step", 150, 190, c), _s("train.step", 300, 360, A),
            _s("generate", 300, 350, B)],
    }  # fmt: skip
    for it in range(5):
        clock.set(it * 100 * MS)
        bus.iteration_started(it)
        bus.samples(iteration=it, phase="rollout", lengths=[10])
        at = it * 100
        spans = batches.get(it, [_s("train.step", at, at + 60, A), _s("generate", at, at + 50, B)])
        bus.publish_spans("main", bus.anchor, spans)
    clock.set(500 * MS)
    run.finish()
    assert run.out_dir is not None
    (window2,) = [
        r["values"] for r in _records(run.out_dir)
        if (r["kind"], r["scope"], r["iteration"]) == ("timing", "iteration", 2)
    ]  # fmt: skip
    path = {k: round(window2[f"window_path_{k}_seconds"] * 1e3, 6) for k in KINDS}
    assert (path["training"], path["publish"], path["generation"]) == (60, 40, 0)
    check_run(run.out_dir)  # (the independent recompute: the late span counts there too)
    check_replay(run.out_dir, tmp_path / "again")
