"""Memory observer: per-worker raw readings reduced across workers, one record per
iteration's window.

A reading belongs to the iteration its event names, or, when it names none, to the
iteration whose window holds the event's time (one in the set-up window belongs to
none). When an iteration is finalised (with its timing and throughput records), one
``memory`` record (scope ``iteration``) reduces each worker's latest reading of it: for
every field, max/min/mean/sum in bytes, how many workers reported it, and (in
``attrs``) which worker holds the max. A worker reading several devices (one process
on two GPUs: a reading per device) has each device's latest reading in the device
fields, and its latest reading of any device in the host fields (its process is
counted once). So a record never holds another window's
readings, nor a part of its own: the flat file's line of an iteration is the reduction
of every worker that reported in it. A reading for an iteration already finalised (or
one that never starts) is *late*: in no record, counted in the summary. The summary
keeps the run's highest reading of every field and its worker, every reading included.
Peaks are the allocator's lifetime peaks as read; nothing here resets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.events import IterationStarted, MemoryReadings, RunFinished, RunStarted
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.metric import MEMORY_FIELDS, memory_report
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers.timeline import Finished, Timeline, timeline_for
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import MetricRecord, make_record

#: the fields of a reading that are peaks: ``summary.json`` ``memory_peaks`` gives each
#: worker's highest
PEAK_FIELDS = ("host_peak_rss_bytes", "device_allocated_peak_bytes", "device_reserved_peak_bytes")
#: the fields of a worker's process (reduced over workers) and those of one of its
#: devices (reduced over each worker's devices)
_HOST_FIELDS = tuple(f for f in MEMORY_FIELDS if f.startswith("host_"))
_DEVICE_FIELDS = tuple(f for f in MEMORY_FIELDS if not f.startswith("host_"))

__all__ = ["PEAK_FIELDS", "MemoryObserver"]


@dataclass(slots=True)
class _Window:
    """An iteration's readings so far: each worker's latest (``host``) and each of its
    devices' latest (``latest``, by worker and device), and the newest event's times
    (the record's)."""

    host: dict[str, MemoryReading] = field(default_factory=dict)
    latest: dict[tuple[str, str], MemoryReading] = field(default_factory=dict)
    readings: int = 0
    wall_ns: int = 0
    monotonic_ns: int = 0


class MemoryObserver(BuiltinObserver):
    """Reduces memory readings per iteration; a deterministic function of the events."""

    def __init__(self) -> None:
        self.run_id = ""
        #: the run's timeline: which window a reading falls in, and when it is finalised
        self.timeline = Timeline()
        self.pending: dict[int, _Window] = {}
        self.peaks: dict[str, tuple[int, str]] = {}
        #: per worker, its highest reading of each peak field it reported
        self.worker_peaks: dict[str, dict[str, int]] = {}
        self.readings = 0
        self.late = 0

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = timeline_for(context, "memory")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id

    @hookimpl
    def twinkle_memory(self, event: MemoryReadings) -> None:
        if not event.readings:
            return
        self.readings += len(event.readings)
        self._peaks(event.readings)
        tl = self.timeline
        iteration = event.iteration
        if iteration is None:
            iteration = tl.iteration_at(event.monotonic_ns)
            if iteration is None:  # the set-up's, or a finalised window's (late)
                if tl.horizon is not None and event.monotonic_ns < tl.horizon:
                    self.late += len(event.readings)
                return
        elif tl.is_finalised(iteration):
            self.late += len(event.readings)
            return
        window = self.pending.get(iteration)
        if window is None:
            window = self.pending[iteration] = _Window()
        for reading in event.readings:
            window.host[reading.worker_id] = reading
            window.latest[(reading.worker_id, reading.device)] = reading
        window.readings += len(event.readings)
        window.wall_ns, window.monotonic_ns = event.wall_ns, event.monotonic_ns

    def _peaks(self, readings: tuple[MemoryReading, ...]) -> None:
        peaks = self.peaks
        for reading in readings:
            mine = self.worker_peaks.get(reading.worker_id)
            if mine is None:
                mine = self.worker_peaks[reading.worker_id] = {}
            for name in PEAK_FIELDS:
                value = getattr(reading, name)
                if value is not None and value > mine.get(name, -1):
                    mine[name] = value
            for name in MEMORY_FIELDS:
                value = getattr(reading, name)
                if value is not None:
                    peak = peaks.get(name)
                    if peak is None or value > peak[0]:
                        peaks[name] = (value, reading.worker_id)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.finished)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        records = self._emit(self.timeline.finished)
        # Readings of iterations that never started: in no window's record.
        self.late += sum(w.readings for w in self.pending.values())
        self.pending = {}
        return records

    def _emit(self, finished: list[Finished]) -> list[MetricRecord]:
        records = []
        for done in finished:
            window = self.pending.pop(done.data.iteration, None)
            if window is None:
                continue
            host = memory_report(list(window.host.values()), unit="B", fields=_HOST_FIELDS)
            devices = memory_report(list(window.latest.values()), unit="B", fields=_DEVICE_FIELDS)
            records.append(
                make_record(
                    kind="memory",
                    scope="iteration",
                    run_id=self.run_id,
                    step=done.data.step,
                    iteration=done.data.iteration,
                    wall_ns=window.wall_ns,
                    monotonic_ns=window.monotonic_ns,
                    values={**host.values, **devices.values},
                    attrs={**host.attrs, **devices.attrs, "workers": sorted(window.host)},
                )
            )
        return records

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        return {
            "memory_readings": self.readings,
            "memory_late_readings": self.late,
            "memory_max": {
                name: {"bytes": value, "worker": worker}
                for name, (value, worker) in sorted(self.peaks.items())
            },
            "memory_peaks": {w: self.worker_peaks[w] for w in sorted(self.worker_peaks)},
        }
