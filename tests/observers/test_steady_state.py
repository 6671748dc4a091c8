"""Numbers people quote, on a scripted streaming run with a manual clock (issue 27).

The workers start (``workers.start``, a ``lifecycle.setup`` phase), iteration 0's
boundary comes, and then the pipeline runs: while the trainer (thread A) trains
iteration ``i`` the engine (thread B) generates iteration ``i + 1``. After the last
training step the workers stop (``workers.stop``, a ``lifecycle.teardown`` phase) and
the run finishes. Milliseconds::

    A  workers.start 0-40 | train0 60-90 | train1 90-120 | train2 120-150 | train3 150-180
    B                     | gen0 40-60, gen1 60-85 | gen2 90-115 | gen3 120-145 |
    A  workers.stop 185-195; boundaries 40, 90, 120, 150; finish 200

Every figure below is worked out by hand from that picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_scripted_run import manual_session
from twinkle.errors import ConfigError
from twinkle.observers import ObserverConfig
from twinkle.perf import Span
from twinkle.reporting import cut_short, record_from_dict

MS = 1_000_000
A, B = 1, 2
TOKENS = {0: 100, 1: 120, 2: 120, 3: 130}
CONFIG: dict[str, Any] = {
    "phases": {
        "rollout": ["generate"],
        "train": ["train.*"],
        "startup": ["workers.start"],
        "shutdown": ["workers.stop"],
    },
    "lifecycle": {"setup": ["startup"], "teardown": ["shutdown"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 2},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 2},
    "streaming": {"generation": "rollout", "training": "train"},
}


def _s(name: str, start_ms: int, end_ms: int, tid: int, **attrs: Any) -> Span:
    return Span(name, start_ms * MS, end_ms * MS, tid, 1, attrs, None)


SPANS = [
    _s("workers.start", 0, 40, A),
    _s("generate", 40, 60, B, iteration=0),
    _s("train.step", 60, 90, A, iteration=0),
    _s("generate", 60, 85, B, iteration=1),
    _s("train.step", 90, 120, A, iteration=1),
    _s("generate", 90, 115, B, iteration=2),
    _s("train.step", 120, 150, A, iteration=2),
    _s("generate", 120, 145, B, iteration=3),
    _s("train.step", 150, 180, A, iteration=3),
    _s("workers.stop", 185, 195, A),
]
BOUNDARIES_MS = [40, 90, 120, 150]
FINISH_MS = 200


def _run(
    out_dir: Path,
    *,
    status: str = "ok",
    config: dict[str, Any] | None = None,
    spans: list[Span] = SPANS,
    late: tuple[str, ...] = (),
    steps: bool = False,
) -> Path:
    """The scripted run; spans named in ``late`` are sent only at the finish; with
    ``steps``, each iteration takes an optimizer step after its samples."""
    run, clock = manual_session(out_dir, "steady", CONFIG if config is None else config)
    bus = run.bus
    published: set[int] = set()

    def publish_until(t_ms: int) -> None:
        due = {i for i, s in enumerate(spans) if s.end_ns <= t_ms * MS}
        if t_ms < FINISH_MS:
            due = {i for i in due if spans[i].name not in late}
        batch = [s for i, s in enumerate(spans) if i in due and i not in published]
        published.update(due)
        if batch:
            clock.set(t_ms * MS - 1)
            bus.publish_spans("main", bus.anchor, batch)

    for it, at_ms in enumerate(BOUNDARIES_MS):
        publish_until(at_ms)
        clock.set(at_ms * MS)
        bus.iteration_started(it)
        bus.samples(iteration=it, phase="rollout", lengths=[TOKENS[it]])
        bus.samples(iteration=it, phase="train", lengths=[TOKENS[it]])
        if steps:
            bus.optimizer_step(iteration=it, step=it + 1, samples=1)
    publish_until(FINISH_MS)
    clock.set(FINISH_MS * MS)
    run.finish(status=status, error=None if status == "ok" else "it failed")  # type: ignore[arg-type]
    assert run.out_dir is not None
    return run.out_dir


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def _one(run_dir: Path, kind: str, scope: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        r["values"] for r in _records(run_dir) if (r["kind"], r["scope"]) == (kind, scope)
    ]
    [values] = found
    return values


def _ms(values: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v * 1e3, 6) if k.endswith("_seconds") else v for k, v in values.items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("steady"))


def test_start_up_is_set_up_and_stopping_the_workers_is_tear_down(run_dir: Path) -> None:
    run = _ms(_one(run_dir, "timing", "run"))
    # set-up [0, 40): the workers starting, busy throughout
    assert (run["setup_wall_seconds"], run["setup_busy_seconds"]) == (40, 40)
    # the loop [40, 185): the windows 50 + 30 + 30 + 35; idle only 180-185
    assert (run["loop_wall_seconds"], run["loop_busy_seconds"], run["loop_idle_seconds"]) == (
        145,
        140,
        5,
    )
    # tear-down [185, 200): the workers stopping 185-195, then nothing to the finish
    assert (run["teardown_wall_seconds"], run["teardown_busy_seconds"]) == (15, 10)
    assert run["teardown_idle_seconds"] == 5
    assert run["wall_seconds"] == 200 == 40 + 145 + 15
    assert run["idle_seconds"] == 10 == 0 + 5 + 5
    # the active time starts with the loop's first work (gen0 at 40), not the start-up,
    # and ends with the loop, not after stopping the workers
    assert (run["active_wall_seconds"], run["active_logical_seconds"]) == (145, 145)
    timing = {
        r["iteration"]: _ms(r["values"])
        for r in _records(run_dir)
        if (r["kind"], r["scope"]) == ("timing", "iteration")
    }
    assert [timing[i]["window_wall_seconds"] for i in range(4)] == [50, 30, 30, 35]
    assert timing[3]["window_shutdown_seconds"] == 0  # not in the last iteration


def test_the_ends_are_flagged_and_the_steady_state_leaves_them_out(run_dir: Path) -> None:
    rows = {
        r["iteration"]: r
        for r in _records(run_dir)
        if (r["kind"], r["scope"]) == ("iteration", "iteration")
    }
    assert {i: r["attrs"]["window_flags"] for i, r in rows.items()} == {
        0: ["warmup"],
        1: [],
        2: [],
        3: ["drain"],
    }
    per_iteration = [rows[i]["values"]["tokens_per_s_per_device"] for i in range(4)]
    # warm-up: two generations in its window; drain: none (too high)
    assert per_iteration == [
        100 / (0.050 * 2),
        120 / (0.030 * 2),
        120 / (0.030 * 2),
        130 / (0.035 * 2),
    ]
    run = _one(run_dir, "run", "run")
    # all-in: every token over the active 145 ms on 2 devices
    assert run["tokens_per_s_per_device"] == 470 / (0.145 * 2)
    # steady: iterations 1 and 2, 240 tokens over 60 ms on 2 devices
    assert (run["steady_iterations"], run["steady_tokens"]) == (2, 240)
    assert run["steady_seconds"] == 0.06
    assert run["steady_tokens_per_s_per_device"] == 240 / (0.06 * 2) == 2000
    # produced: gen1 and gen2 (25 ms each) on 2 devices; consumed: train1, train2 on 1
    assert _one(run_dir, "rollout", "window")["steady_tokens_per_s_per_device"] == 240 / (0.050 * 2)
    assert _one(run_dir, "train", "window")["steady_tokens_per_s_per_device"] == 240 / 0.060
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["window"]["steady_tokens_per_s_per_device"] == 2000


def test_a_run_that_ends_in_error_marks_its_last_window_partial(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, status="error")
    flags = [
        r["attrs"]["window_flags"]
        for r in _records(run_dir)
        if (r["kind"], r["scope"]) == ("timing", "iteration")
    ]
    assert flags == [["warmup"], [], [], ["partial"]]


def test_every_figure_of_a_window_carries_its_flags_and_a_cut_short_one_says_so(
    tmp_path: Path,
) -> None:
    """The window-derived records of an iteration (timing, waits, the phases', the window's)
    carry its flags, so a dashboard can leave out the cut-short iteration 3 whole;
    nothing of the run's or a window's scope is cut short."""
    run_dir = _run(tmp_path, status="error")
    records = [record_from_dict(r) for r in _records(run_dir)]
    flagged = {
        (r.kind, r.iteration): list(r.attrs["window_flags"])
        for r in records
        if r.scope == "iteration"
    }
    kinds = ("timing", "waits", "rollout", "train", "iteration")
    flags = {0: ["warmup"], 1: [], 2: [], 3: ["partial"]}
    assert flagged == {(k, i): flags[i] for k in kinds for i in range(4)}
    assert {(r.kind, r.iteration) for r in records if cut_short(r)} == {(k, 3) for k in kinds}
    assert {r.scope for r in records if not cut_short(r)} == {"iteration", "window", "run"}


def test_the_flat_line_of_a_cut_short_iteration_is_marked(tmp_path: Path) -> None:
    """metrics.jsonl keeps iteration 3's line, cut short at iteration 2's step (no step
    is taken here: every line is at step 0); ``cut_short: 1`` tells a plot by step to
    leave it out, as the dashboards do. An iteration that took its step is no such line."""
    flat = [
        orjson.loads(line)
        for line in (_run(tmp_path, status="error") / "metrics.jsonl").read_bytes().splitlines()
    ]
    assert [(row["iteration"], row.get("cut_short")) for row in flat] == [
        (0, None), (1, None), (2, None), (3, 1)
    ]  # fmt: skip
    stepped = _run(tmp_path / "stepped", status="error", steps=True) / "metrics.jsonl"
    assert not any("cut_short" in orjson.loads(line) for line in stepped.read_bytes().splitlines())


def test_an_iteration_that_took_its_step_before_an_error_is_partial_but_not_cut_short(
    tmp_path: Path,
) -> None:
    """Each iteration steps; the run then ends in error: iteration 3's window is still
    flagged partial (the steady state leaves it out), but it took step 4, a point of its
    own on a dashboard: not cut short."""
    run_dir = _run(tmp_path, status="error", steps=True)
    records = [record_from_dict(r) for r in _records(run_dir)]
    last = [r for r in records if r.scope == "iteration" and r.iteration == 3]
    assert {r.kind for r in last} == {"timing", "waits", "rollout", "train", "iteration"}
    assert {(r.step, r.attrs["window_flags"], r.attrs["iteration_steps"]) for r in last} == {
        (4, ("partial",), 1)
    }
    assert not any(cut_short(r) for r in records)


@pytest.mark.parametrize(
    ("lifecycle", "match"),
    [
        ("startup", r"config.lifecycle must be an object"),
        ({"start": ["startup"]}, r"keys 'setup' and/or 'teardown'"),
        ({"setup": "startup"}, r"config.lifecycle.setup must be a list of phases"),
        ({"setup": ["boot"]}, r"names 'boot', not a phase of config.phases"),
        ({"teardown": ["train"]}, r"the streaming generation or training phase"),
        ({"setup": ["startup"], "teardown": ["startup"]}, r"both a set-up and a tear-down"),
    ],
)
def test_a_bad_lifecycle_is_refused_by_name(lifecycle: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ObserverConfig.parse({**CONFIG, "lifecycle": lifecycle})


def test_without_a_window_the_steady_state_still_has_its_seconds(tmp_path: Path) -> None:
    config = {k: v for k, v in CONFIG.items() if k != "window"}
    run_dir = _run(tmp_path, config=config)
    run = _one(run_dir, "run", "run")
    # iterations 1 and 2: their windows' 30 + 30 ms, no tokens counted
    assert (run["steady_iterations"], run["steady_seconds"], run["steady_tokens"]) == (2, 0.06, 0)


def test_a_tear_down_span_sent_late_still_ends_the_loop_where_it_started(tmp_path: Path) -> None:
    """With finalise_lag 0 the horizon is the last window's start: a workers.stop that
    started before the last boundary, sent after it, must not end the loop there."""
    early_stop = [s for s in SPANS if s.name != "workers.stop"]
    early_stop.append(_s("workers.stop", 145, 155, A))  # across the last boundary (150)
    config = {**CONFIG, "finalise_lag": 0}
    run_dir = _run(tmp_path, config=config, spans=early_stop, late=("workers.stop",))
    timing = {
        r["iteration"]: r["values"]
        for r in _records(run_dir)
        if (r["kind"], r["scope"]) == ("timing", "iteration")
    }
    assert round(timing[3]["window_wall_seconds"] * 1e3, 6) == 50  # [150, 200): the finish
