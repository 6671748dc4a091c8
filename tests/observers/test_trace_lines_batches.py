"""The trace's lines of a worker's batch of spans are those of the same spans sent one
per batch: the batch's shortcuts (a thread's first lane and track looked up once, the
budget handed the lines together) decide nothing differently. (A process's name is
written as the batch naming it first is, ahead of the batch's other lines.)"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from twinkle.events import IterationStarted, RunStarted, SpanBatch
from twinkle.observers._trace_lines import TraceLines
from twinkle.perf import ClockAnchor, Span

RUN = "batches"
ANCHOR = ClockAnchor(monotonic_ns=1_000, wall_ns=5, pid=7, hostname="node0")
NAMES = ("generate", "train.step", "weights.load", "twinkle.observe")


@st.composite
def _spans(draw: Any) -> list[Span]:
    out = []
    for _ in range(draw(st.integers(0, 40))):
        start = draw(st.integers(1_000, 60_000))
        attrs: dict[str, Any] = {}
        if draw(st.booleans()):
            attrs = {
                "engine": draw(st.sampled_from(["e0", "e1"])),
                "version": draw(st.integers(-1, 3)),
            }
        out.append(
            Span(
                draw(st.sampled_from(NAMES)),
                start,
                start + draw(st.integers(0, 9_000)),
                draw(st.sampled_from([1, 2])),  # thread
                draw(st.sampled_from([7, 8])),  # pid: the run's, a worker's
                attrs,
                None,
            )
        )
    return out


def _lines(batches: list[list[Span]], budget_mb: float | None) -> tuple[list[bytes], ...]:
    """The trace's lines: the processes' names, then the others, each in order."""
    trace = TraceLines()
    config = {"trace": {"budget_mb": budget_mb}, "phases": {"train": ["train.*"]}}
    out: list[bytes] = []
    trace.add(RunStarted(RUN, 1_000, 5, ANCHOR, config), out)
    trace.add(IterationStarted(RUN, 20_000, 6, 0), out)
    for spans in batches:
        trace.add(SpanBatch(RUN, 70_000, 7, "main", ANCHOR, tuple(spans)), out)
    lines = [*out, *trace.tail().split(b",\n")]
    named = [line for line in lines if b'"process_name"' in line]
    return named, [line for line in lines if b'"process_name"' not in line]


@given(st.lists(_spans(), max_size=4), st.sampled_from([None, 0.0005, 0.002]))
def test_a_batch_of_spans_makes_the_lines_of_its_spans_one_by_one(
    batches: list[list[Span]], budget_mb: float | None
) -> None:
    one_by_one = [[span] for spans in batches for span in spans]
    assert _lines(batches, budget_mb) == _lines(one_by_one, budget_mb)
