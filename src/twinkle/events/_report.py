"""A worker's report published as one: its span batch and its memory readings are both
checked before either reaches the run, so a report refused is refused whole (nothing of
it in the log or the figures), and the caller's error names what to fix."""

from __future__ import annotations

from twinkle.checks import caller_source
from twinkle.errors import RecordError
from twinkle.events._build import items
from twinkle.events._bus import EventBus
from twinkle.events._codec import loggable_spans
from twinkle.events._types import Event, MemoryReadings, SpanBatch
from twinkle.perf import Span, WorkerReport

__all__ = ["publish_report"]


def publish_report(bus: EventBus, report: WorkerReport, iteration: int | None) -> None:
    """Publish ``report`` on ``bus``: its spans as a batch from source ``report.worker``
    on its own clock anchor (counting the spans it dropped), and its readings as taken
    during ``iteration``. A span that ends before it starts, or a field the events'
    checks refuse, refuses the whole report with a :class:`RecordError`."""
    source = caller_source(report.worker, "report.worker")
    spans = loggable_spans(tuple(report.spans), source)  # (attrs as the log reads them)
    backwards = [s for s in spans if type(s) is Span and s.end_ns < s.start_ns]
    if backwards:
        named = ", ".join(f"{s.name!r} ({s.start_ns} -> {s.end_ns})" for s in backwards[:5])
        more = f" and {len(backwards) - 5} more" if len(backwards) > 5 else ""
        raise RecordError(
            f"the report of worker {source!r} was refused, nothing of it published: "
            f"span(s) ending before they start: {named}{more}; the worker's clock went "
            "backwards (its recorder's clock must be monotonic: time.perf_counter_ns)"
        )
    mono, wall = bus.times()
    events: list[Event] = []
    if spans or report.spans_dropped:
        events.append(
            SpanBatch(
                bus.run_id,
                mono,
                wall,
                source,
                report.anchor,
                spans,
                report.spans_dropped,
                report.sent_anchor,
            )
        )
    if report.readings:
        readings = items(MemoryReadings, "readings", report.readings, "MemoryReading values")
        events.append(MemoryReadings(bus.run_id, mono, wall, iteration, readings))
    if events:
        bus.publish_all(events, "worker_report")
