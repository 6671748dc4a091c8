"""Timing observer: where each iteration's time went.

Per iteration it emits one ``timing`` record (scope ``iteration``) with, in seconds:
``wall_seconds`` (between iteration starts), ``overhead_seconds`` (union of the
observers' own spans in the window), ``logical_seconds`` (wall minus overhead, overlap
deducted once), ``busy_seconds`` (union of every phase span), ``overlap_seconds``
(Σ phase unions - busy), and per configured phase ``<phase>_sum_seconds`` (durations
added), ``<phase>_union_seconds`` (their union) and ``<phase>_logical_seconds`` (union
minus overhead on the same threads). Nested or concurrent spans are never simply added
into a total that claims to be wall time.
"""

from __future__ import annotations

from typing import Any

from twinkle.events import (
    IterationStarted,
    RunFinished,
)
from twinkle.hookspecs import hookimpl
from twinkle.metric.reporting import MetricRecord, make_record
from twinkle.observers._timeline import Finished, IterationTiming, TimelineObserver

__all__ = ["TimingObserver", "timing_values"]

_NS = 1e9


def timing_values(t: IterationTiming) -> dict[str, int | float]:
    """Flat record values (seconds) of one iteration's timing."""
    values: dict[str, int | float] = {
        "wall_seconds": t.wall_ns / _NS,
        "overhead_seconds": t.overhead_ns / _NS,
        "logical_seconds": t.logical_ns / _NS,
        "busy_seconds": t.busy_ns / _NS,
        "overlap_seconds": t.overlap_ns / _NS,
        "spans": t.spans,
        "span_errors": t.errors,
    }
    for phase in t.phase_sum_ns:
        values[f"{phase}_sum_seconds"] = t.phase_sum_ns[phase] / _NS
        values[f"{phase}_union_seconds"] = t.phase_union_ns[phase] / _NS
        values[f"{phase}_logical_seconds"] = t.phase_logical_ns[phase] / _NS
        values[f"{phase}_spans"] = t.phase_spans[phase]
    return values


class TimingObserver(TimelineObserver):
    """Per-iteration time accounting; a deterministic function of the events."""

    def __init__(self) -> None:
        super().__init__()
        self.iterations = 0
        self.totals_ns: dict[str, int] = {}

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.iteration_started(event), event.monotonic_ns)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        records = self._emit(self.timeline.run_finished(event), event.monotonic_ns)
        self.timeline.release()
        return records

    def _emit(self, finished: Finished | None, monotonic_ns: int) -> list[MetricRecord]:
        if finished is None:
            return []
        data, timing = finished
        self.iterations += 1
        values = timing_values(timing)
        for key, value in (
            ("wall", timing.wall_ns),
            ("overhead", timing.overhead_ns),
            ("logical", timing.logical_ns),
            ("busy", timing.busy_ns),
            ("overlap", timing.overlap_ns),
            *((f"{p}_sum", v) for p, v in timing.phase_sum_ns.items()),
            *((f"{p}_union", v) for p, v in timing.phase_union_ns.items()),
            *((f"{p}_logical", v) for p, v in timing.phase_logical_ns.items()),
        ):
            self.totals_ns[key] = self.totals_ns.get(key, 0) + value
        return [
            make_record(
                kind="timing",
                scope="iteration",
                run_id=self.run_id,
                step=data.step,
                iteration=data.iteration,
                wall_ns=data.wall_ns,
                monotonic_ns=monotonic_ns,
                values=values,
            )
        ]

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        tl = self.timeline
        return {
            "iterations": self.iterations,
            "seconds": {k: v / _NS for k, v in sorted(self.totals_ns.items())},
            "setup_spans": tl.setup_spans,
            "late_spans": tl.late_spans,
        }
