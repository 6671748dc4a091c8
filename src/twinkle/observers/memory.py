"""Memory observer: per-worker raw readings reduced across workers.

Each :class:`~twinkle.events.MemoryReadings` event gives one ``memory`` record (scope
``iteration``): for every field, max/min/mean/sum over the workers' latest readings in
bytes, how many workers reported it, and (in ``attrs``) which worker holds the max.
The summary keeps the run's highest reading of every field and its worker. Peaks are
the allocator's lifetime peaks as read; nothing here resets them. A record's step is
the optimizer steps seen so far, as the run's timeline counts them.
"""

from __future__ import annotations

from typing import Any

from twinkle.events import MemoryReadings, RunStarted
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.metric import MEMORY_FIELDS, memory_report
from twinkle.observers.timeline import Timeline, timeline_for
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import MetricRecord, make_record

__all__ = ["MemoryObserver"]


class MemoryObserver:
    """Reduces memory readings; a deterministic function of the events."""

    def __init__(self) -> None:
        self.run_id = ""
        #: the run's timeline: its step (optimizer steps so far) is each record's step
        self.timeline = Timeline()
        self.iteration = 0
        self.peaks: dict[str, tuple[int, str]] = {}
        self.readings = 0

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = timeline_for(context, "memory")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id

    @hookimpl
    def twinkle_memory(self, event: MemoryReadings) -> list[MetricRecord]:
        if not event.readings:
            return []
        if event.iteration is not None:
            self.iteration = event.iteration
        peaks = self.peaks
        latest: dict[str, MemoryReading] = {}
        for reading in event.readings:
            worker = reading.worker_id
            latest[worker] = reading
            for name in MEMORY_FIELDS:
                value = getattr(reading, name)
                if value is not None:
                    peak = peaks.get(name)
                    if peak is None or value > peak[0]:
                        peaks[name] = (value, worker)
        self.readings += len(event.readings)
        report = memory_report(list(latest.values()), unit="B")
        return [
            make_record(
                kind="memory",
                scope="iteration",
                run_id=self.run_id,
                step=self.timeline.step,
                iteration=self.iteration,
                wall_ns=event.wall_ns,
                monotonic_ns=event.monotonic_ns,
                values=report.values,
                attrs={**report.attrs, "workers": sorted(latest)},
            )
        ]

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        return {
            "memory_readings": self.readings,
            "memory_max": {
                name: {"bytes": value, "worker": worker}
                for name, (value, worker) in sorted(self.peaks.items())
            },
        }
