"""Two edge cases of the run timeline, as docs/metrics.md defines them, on manual-clock
scripted runs (every figure worked out by hand, in milliseconds, from the span list).

* Attribution is by a span's start, not by when it was published: the bus reads a
  boundary's time before it flushes the recorders, so a span that another thread starts
  at or after that reading and closes before the flush reaches the log *before* the
  boundary. A span without an ``iteration`` attribute that starts at or after the
  boundary is the new iteration's (or, at the finish, the tear-down's), never the
  window's before it. The scripts below publish such spans just before the boundary,
  with the clock at the boundary's time.
* Overhead is kept while an open iteration's late spans can still need it: with
  ``finalise_lag`` 0 the next iteration's rollout, begun in the window just finalised and
  ended after the boundary, arrives late (its time before the boundary is in no window)
  but is attributed whole, and its logical time deducts the overhead on its thread that
  was published (and its window finalised) before the rollout arrived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_scripted_run import manual_session  # the same manual-clock session
from observers.test_timeline import _ms, _values  # (the records, read as there)
from twinkle.events import IterationStarted, RunFinished, RunStarted, SpanBatch
from twinkle.observers import Timeline
from twinkle.perf import ClockAnchor, Span
from twinkle.run import replay

MS = 1_000_000
A, B = 1, 2  # trainer thread, engine thread
FILES = ("metrics_raw.jsonl", "metrics.jsonl", "summary.json")


def _config(lag: int) -> dict[str, Any]:
    return {
        "phases": {"rollout": ["generate"], "train": ["train.*"]},
        "throughput": {
            "rollout": {"samples": "rollout", "devices": 1},
            "train": {"samples": "train", "devices": 1},
        },
        "window": {"samples": "rollout", "devices": 1},
        "streaming": {"generation": "rollout", "training": "train"},
        "finalise_lag": lag,
        "total_steps": 2,
    }


def _s(name: str, start_ms: int, end_ms: int, tid: int, **attrs: Any) -> Span:
    return Span(name, start_ms * MS, end_ms * MS, tid, 1, attrs, None)


def _over(start_ms: int, end_ms: int, tid: int) -> Span:
    return _s("twinkle.observe", start_ms, end_ms, tid, event="samples")


def _replays_byte_for_byte(run_dir: Path, out: Path) -> None:
    replay(run_dir / "events.jsonl", out_dir=out)
    for name in FILES:
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


# -- attribution by start time ---------------------------------------------------------


def _start_time_run(out_dir: Path, lag: int) -> Path:
    """Boundaries at 10 and 100 ms, the finish at 200 ms; at each, spans that start at or
    after it are published just before it."""
    run, clock = manual_session(out_dir, f"start-time-{lag}", _config(lag))
    bus, anchor = run.bus, run.bus.anchor

    def spans(*ss: Span) -> None:
        bus.publish_spans("main", anchor, list(ss))

    clock.set(10 * MS)
    spans(
        _s("generate", 2, 8, B, iteration=0),  # iteration 0's, by its attribute
        _s("train.prep", 4, 9, A),  # starts before boundary 0: set-up
        _s("train.fwd", 10, 14, A),  # starts at boundary 0: iteration 0, not set-up
    )
    bus.iteration_started(0)
    bus.samples(iteration=0, phase="rollout", lengths=[30], groups=1)
    bus.samples(iteration=0, phase="train", lengths=[25, 25])
    bus.optimizer_step(iteration=0, step=1, samples=2)
    clock.set(99 * MS)
    spans(
        _s("train.fwd", 20, 60, A),
        _s("train.fwd", 95, 101, A),  # crosses boundary 1, starts before it: iteration 0
    )
    clock.set(100 * MS)
    spans(
        _s("train.step", 100, 102, A),  # starts at boundary 1: iteration 1
        _s("train.fwd", 101, 104, A),  # starts after it: iteration 1
    )
    bus.iteration_started(1)
    bus.samples(iteration=1, phase="rollout", lengths=[20], groups=1)
    bus.samples(iteration=1, phase="train", lengths=[40])
    bus.optimizer_step(iteration=1, step=2, samples=1)
    clock.set(199 * MS)
    spans(_s("generate", 105, 125, B, iteration=1), _s("train.fwd", 110, 150, A))
    clock.set(200 * MS)
    spans(_s("train.save", 200, 203, A))  # starts at the finish: tear-down
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


@pytest.fixture(scope="module", params=[0, 1], ids=["lag0", "lag1"])
def start_time_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    lag: int = request.param
    return _start_time_run(tmp_path_factory.mktemp(f"start-time-{lag}"), lag)


def test_a_span_published_before_a_boundary_that_starts_at_it_is_the_next_iterations(
    start_time_run: Path,
) -> None:
    t = _values(start_time_run, "timing", "iteration")
    # iteration 0: generate [2,8) by its attribute; train [10,14) (published before
    # boundary 0, starts at it) + [20,60) + [95,101) (starts before boundary 1):
    # sum 4 + 40 + 6 = 50, union the same (disjoint)
    assert t[0]["attributed_spans"] == 4
    assert _ms(t[0]["attributed_rollout_sum_seconds"]) == 6
    assert _ms(t[0]["attributed_train_sum_seconds"]) == 50
    assert _ms(t[0]["attributed_train_seconds"]) == 50
    assert t[0]["attributed_train_spans"] == 3
    # iteration 1: train [100,102) + [101,104) (published before boundary 1, start at or
    # after it) + [110,150): sum 2 + 3 + 40 = 45, union [100,104) u [110,150) = 4 + 40 = 44;
    # generate [105,125) = 20
    assert t[1]["attributed_spans"] == 4
    assert _ms(t[1]["attributed_train_sum_seconds"]) == 45
    assert _ms(t[1]["attributed_train_seconds"]) == 44
    assert _ms(t[1]["attributed_train_logical_seconds"]) == 44  # no overhead in the script
    assert t[1]["attributed_train_spans"] == 3
    assert _ms(t[1]["attributed_rollout_seconds"]) == 20


def test_per_phase_throughput_divides_by_the_spans_that_started_in_the_window(
    start_time_run: Path,
) -> None:
    train = _values(start_time_run, "train", "iteration")
    # iteration 0: 25 + 25 = 50 tokens over 0.050 s; iteration 1: 40 tokens over 0.044 s
    assert (train[0]["tokens"], train[0]["seconds"]) == (50, 0.05)
    assert train[0]["tokens_per_s"] == pytest.approx(1000, rel=1e-12)
    assert (train[1]["tokens"], train[1]["seconds"]) == (40, 0.044)
    assert train[1]["tokens_per_s"] == pytest.approx(40 / 0.044, rel=1e-12)  # 909.09...


def test_set_up_and_tear_down_take_only_the_spans_that_start_in_them(
    start_time_run: Path,
) -> None:
    spans = orjson.loads((start_time_run / "summary.json").read_bytes())["spans"]
    where = {k: (v["spans"], _ms(v["seconds"])) for k, v in spans["attributed"].items()}
    # set-up: train.prep [4,9) only; tear-down: train.save [200,203); the iterations:
    # 4 + 4 spans of 6 + 50 and 45 + 20 ms
    assert where == {
        "iterations": (8, 121),
        "setup": (1, 5),
        "teardown": (1, 3),
        "unstarted": (0, 0),
        "late": (0, 0),
    }
    assert (spans["total"], _ms(spans["total_seconds"])) == (10, 129)


def test_attribution_by_start_time_replays_byte_for_byte(
    start_time_run: Path, tmp_path: Path
) -> None:
    _replays_byte_for_byte(start_time_run, tmp_path)


def test_without_a_boundary_a_span_that_starts_at_the_finish_is_tear_down() -> None:
    anchor = ClockAnchor(0, 0, 1, "h")
    tl = Timeline()
    tl.run_started(RunStarted("r", 0, 0, anchor, {"phases": {"train": ["train.*"]}}))
    batch = (_s("train.prep", 1, 5, A), _s("train.save", 9, 12, A))
    tl.spans(SpanBatch("r", 9 * MS, 0, "main", anchor, batch))
    tl.run_finished(RunFinished("r", 9 * MS, 0, "ok", None))
    # the set-up window is [0, 9): [1,5) is its; [9,12) starts at the finish
    assert tl.ledger.where["setup"] == [1, 4 * MS]
    assert tl.ledger.where["teardown"] == [1, 3 * MS]


# -- overhead kept for an open iteration's late spans ------------------------------------


def _late_rollout_run(out_dir: Path) -> Path:
    """``finalise_lag`` 0, boundaries at 0 and 100 ms, the finish at 200 ms. Iteration 1's
    rollout runs on the engine thread from 50 to 120 ms, across boundary 1, and an
    overhead span [60,61) on that thread (the engine publishing) is published before the
    boundary; the rollout itself arrives at 125 ms, after window 0 was finalised."""
    run, clock = manual_session(out_dir, "late-rollout", _config(0))
    bus, anchor = run.bus, run.bus.anchor

    def spans(*ss: Span) -> None:
        bus.publish_spans("main", anchor, list(ss))

    bus.iteration_started(0)
    bus.samples(iteration=0, phase="rollout", lengths=[20, 20], groups=1)
    bus.samples(iteration=0, phase="train", lengths=[39])
    bus.optimizer_step(iteration=0, step=1, samples=2)
    clock.set(99 * MS)
    spans(
        _s("generate", 0, 40, B, iteration=0),
        _s("train.fwd", 0, 80, A),
        _over(30, 32, A),  # inside train.fwd
        _over(60, 61, B),  # inside iteration 1's rollout, still running
    )
    clock.set(100 * MS)
    bus.iteration_started(1)  # finalises window 0 at once (lag 0)
    clock.set(125 * MS)
    spans(_s("generate", 50, 120, B, iteration=1))  # late: [50,100) is in no window
    bus.samples(iteration=1, phase="rollout", lengths=[69, 69], groups=1)
    bus.samples(iteration=1, phase="train", lengths=[39])
    bus.optimizer_step(iteration=1, step=2, samples=2)
    clock.set(199 * MS)
    spans(_s("train.fwd", 100, 180, A), _over(150, 152, A))
    clock.set(200 * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


@pytest.fixture(scope="module")
def late_rollout_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _late_rollout_run(tmp_path_factory.mktemp("late-rollout"))


def test_a_late_span_of_an_open_iteration_deducts_overhead_published_before_it(
    late_rollout_run: Path,
) -> None:
    t = _values(late_rollout_run, "timing", "iteration")
    # iteration 1's rollout [50,120) whole: 70 ms, less the overhead [60,61) on its
    # thread B: 69 ms
    assert _ms(t[1]["attributed_rollout_seconds"]) == 70
    assert _ms(t[1]["attributed_rollout_logical_seconds"]) == 69
    # its training [100,180) less [150,152) on A: 78
    assert _ms(t[1]["attributed_train_logical_seconds"]) == 78
    # iteration 0: rollout [0,40) (the overhead on B at 60 is outside it); training
    # [0,80) less [30,32) on A
    assert _ms(t[0]["attributed_rollout_logical_seconds"]) == 40
    assert _ms(t[0]["attributed_train_logical_seconds"]) == 78
    rollout = _values(late_rollout_run, "rollout", "iteration")
    # 69 + 69 = 138 tokens over 0.069 s on one device: 2,000 tokens/s (not 138 / 0.070)
    assert (rollout[1]["tokens"], rollout[1]["seconds"]) == (138, 0.069)
    assert rollout[1]["tokens_per_s_per_device"] == pytest.approx(2000, rel=1e-12)
    assert rollout[0]["tokens_per_s_per_device"] == pytest.approx(40 / 0.04, rel=1e-12)


def test_the_late_span_is_still_late_in_the_window_view(late_rollout_run: Path) -> None:
    t = _values(late_rollout_run, "timing", "iteration")
    # window 0 [0,100): rollout [0,40) only (the late rollout's [50,100) is in no
    # window), training [0,80) less [30,32), overhead [30,32) u [60,61) = 3
    assert _ms(t[0]["window_rollout_seconds"]) == 40
    assert _ms(t[0]["window_train_logical_seconds"]) == 78
    assert _ms(t[0]["window_overhead_seconds"]) == 3
    # window 1 [100,200): the rollout's [100,120), no overhead on B there
    assert _ms(t[1]["window_rollout_seconds"]) == 20
    assert _ms(t[1]["window_rollout_logical_seconds"]) == 20
    assert _ms(t[1]["window_overhead_seconds"]) == 2
    run = _values(late_rollout_run, "timing", "run")[1]
    assert (run["late_spans"], _ms(run["late_seconds"])) == (1, 50)  # [50,100)
    spans = orjson.loads((late_rollout_run / "summary.json").read_bytes())["spans"]
    # attributed to its open iteration, not attributed-late: 40 + 80 + 70 + 80 ms
    assert spans["attributed"]["iterations"] == {"spans": 4, "seconds": 0.27}
    assert spans["attributed"]["late"] == {"spans": 0, "seconds": 0.0}


def test_overhead_kept_for_late_spans_replays_byte_for_byte(
    late_rollout_run: Path, tmp_path: Path
) -> None:
    _replays_byte_for_byte(late_rollout_run, tmp_path)


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_overhead_kept_for_late_spans_stays_bounded(lag: int) -> None:
    anchor = ClockAnchor(0, 0, 1, "h")
    tl = Timeline()
    config = {"phases": {"train": ["train.*"]}, "finalise_lag": lag}
    tl.run_started(RunStarted("r", 0, 0, anchor, config))
    kept = []
    for it in range(1_000):
        t = (it + 1) * 100
        tl.iteration_started(IterationStarted("r", t, 0, it))
        batch = (
            Span("train.fwd", t + 10, t + 40, A, 1, {}, None),
            Span("twinkle.observe", t + 1, t + 2, A, 1, {}, None),
        )
        tl.spans(SpanBatch("r", t + 50, 0, "main", anchor, batch))
        if it in (100, 999):
            kept.append(len(tl.overhead))
    # one overhead span a window: the finalise_lag + 2 newest windows' (the newest
    # finalised one, for late spans of the open iterations, and those not finalised)
    assert kept == [lag + 2, lag + 2]


def test_a_resumed_segments_active_time_starts_no_earlier_than_its_set_up() -> None:
    """A worker span of a resumed segment placed before the previous segment's tail
    (95 ms, the tail at 100) is clipped there, and so is where its work starts: the
    segment's set-up before its first work is 0 ms, not -5 ms (which would grow the
    active time)."""
    from twinkle.events import IterationStarted, RunFinished, RunResumed, RunStarted, SpanBatch
    from twinkle.observers.timeline import Timeline
    from twinkle.perf import ClockAnchor, Span

    ms, wall = 1_000_000, 1_700_000_000_000_000_000
    anchor = ClockAnchor(0, wall, 1, "h")
    config = {"phases": {"rollout": ["generate"]}}

    def batch(start: int, end: int) -> SpanBatch:
        span = Span("generate", start * ms, end * ms, 1, 1, {}, None)
        return SpanBatch(
            "r", end * ms, wall + end * ms, source="main", anchor=anchor, spans=(span,)
        )

    tl = Timeline()
    tl.run_started(RunStarted("r", 0, wall, anchor=anchor, config=config))
    tl.iteration_started(IterationStarted("r", 10 * ms, wall + 10 * ms, iteration=0))
    tl.spans(batch(10, 100))
    tl.run_finished(RunFinished("r", 100 * ms, wall + 100 * ms))
    tl.run_resumed(
        RunResumed("r", 101 * ms, wall + 101 * ms, anchor=anchor, segment=1, config=config)
    )
    tl.spans(batch(95, 120))
    tl.iteration_started(IterationStarted("r", 130 * ms, wall + 130 * ms, iteration=1))
    tl.spans(batch(130, 200))
    tl.run_finished(RunFinished("r", 200 * ms, wall + 200 * ms))
    run = tl.run
    assert run is not None
    # set-up 0-10 and 100-130 (40), the loop 10-100 and 130-200 (160); before the first
    # work: 0-10 only
    assert (run.setup.wall_ns, run.loop.wall_ns) == (40 * ms, 160 * ms)
    assert run.active_wall_ns == 190 * ms


# -- an iteration attribute that names no iteration -------------------------------------


def test_an_iteration_attribute_that_is_no_number_goes_by_time_and_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Boundaries at 0 and 10 ms. ``iteration="0"`` (a str) and ``iteration=-1`` on
    spans starting in iteration 1's window go to iteration 1 by their start, as spans
    without one: 3 + 2 ms of its train, none of iteration 0's; each (source, name) is
    named once, however many spans carry it."""
    anchor = ClockAnchor(0, 0, 1, "h")
    tl = Timeline()
    tl.run_started(RunStarted("r", 0, 0, anchor, {"phases": {"train": ["train.*"]}}))
    done = tl.iteration_started(IterationStarted("r", 0, 0, 0))
    tl.spans(SpanBatch("r", 1 * MS, 0, "main", anchor, (_s("train.a", 0, 4, A, iteration=0),)))
    done += tl.iteration_started(IterationStarted("r", 10 * MS, 0, 1))
    batch = (
        _s("train.step", 11, 14, A, iteration="0"),
        _s("train.step", 14, 15, A, iteration=1.0),  # (named already: train.step, main)
        _s("train.b", 15, 16, A, iteration=-1),
    )
    tl.spans(SpanBatch("r", 16 * MS, 0, "main", anchor, batch))
    done += tl.run_finished(RunFinished("r", 20 * MS, 0, "ok", None))
    got = {f.data.iteration: f.attributed.phase_sum_ns["train"] for f in done}
    assert got == {0: 4 * MS, 1: 5 * MS}
    said = [r.getMessage() for r in caplog.records if "no iteration number" in r.getMessage()]
    assert said == [
        "span 'train.step' from 'main' has iteration='0' (str), which is no iteration number "
        "(a whole number >= 0): it is placed by its start, as a span without one; pass the "
        "iteration as an int",
        "span 'train.b' from 'main' has iteration=-1 (int), which is no iteration number "
        "(a whole number >= 0): it is placed by its start, as a span without one; pass the "
        "iteration as an int",
    ]
