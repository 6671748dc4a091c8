"""The run's timeline keeps O(1) state per iteration once iterations are finalised."""

from __future__ import annotations

from twinkle.events import IterationStarted, RunStarted, SamplesObserved, SpanBatch
from twinkle.observers import Timeline
from twinkle.perf import ClockAnchor, Span

ANCHOR = ClockAnchor(0, 0, 1, "h")


def _sizes(tl: Timeline) -> tuple[int, ...]:
    return (len(tl.windows), len(tl.open), len(tl.future), len(tl.pieces), len(tl.overhead))


def test_finalised_iterations_leave_nothing_behind() -> None:
    tl = Timeline()
    tl.run_started(RunStarted("r", 0, 0, ANCHOR, {"phases": {"gen": ["generate"]}}))
    sizes = []
    for it in range(2_000):
        t = 1_000 + it * 100
        tl.iteration_started(IterationStarted("r", t, t, it))
        span = Span("generate", t + 10, t + 60, 1, 1, {"iteration": it}, None)
        tl.spans(SpanBatch("r", t + 90, t + 90, "main", ANCHOR, (span,)))
        tl.samples(SamplesObserved("r", t + 90, t + 90, it, "gen", (3, 4)))
        if it in (100, 1_999):
            sizes.append(_sizes(tl))
    assert sizes[0] == sizes[1]  # nothing grows with the number of iterations
    assert tl.finalised_upto == 1_998 - tl.config.finalise_lag


def test_a_sample_for_a_finalised_iteration_is_late_not_kept() -> None:
    tl = Timeline()
    tl.run_started(RunStarted("r", 0, 0, ANCHOR, {}))
    for it in range(5):
        tl.iteration_started(IterationStarted("r", 100 * (it + 1), 0, it))
    tl.samples(SamplesObserved("r", 600, 0, 1, "gen", (7, 8, 9)))
    assert tl.late_samples == 3
    assert 1 not in tl.future
