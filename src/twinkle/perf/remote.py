"""Observation in a worker process whose run lives in another one (a Ray actor, a
``torch.distributed`` rank): :class:`WorkerRecorder` records there, :class:`WorkerReport`
carries what it measured to the process that holds the run.

A worker ships a report with its results (the return value of an actor call, a
gather at the iteration's end), so it never waits on the run's process to ship: shipping
is as often as the worker reports, and a report is bounded (``max_spans``). The spans
beyond the bound are dropped, counted in the report (``spans_dropped``) and in the run's
summary. Durations are the worker's own: every span is read off the worker's clock, and
the report's :class:`~twinkle.perf.ClockAnchor` places them on the run's timeline (on
another host through the wall clocks; docs/architecture.md). A report also carries its
clocks read when it was made (``sent_anchor``): the run checks the placement against the
report's arrival, so a worker whose clock is skewed is found (docs/scale-out.md).
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from twinkle.checks import Count, NonEmpty, caller_source, convert_checked
from twinkle.errors import InvalidArgumentError
from twinkle.perf._span import Span
from twinkle.perf.clock import Clock, ClockAnchor, default_clock
from twinkle.perf.dist import all_gather_bytes, initialised_dist
from twinkle.perf.stats import MemoryReading, memory_stats
from twinkle.perf.timer import SpanContext, TimeRecorder

__all__ = ["DEFAULT_MAX_SPANS", "WorkerRecorder", "WorkerReport", "gather_reports"]

#: A report's bound on spans (a demo iteration's worker records a few dozen).
DEFAULT_MAX_SPANS = 65_536


class WorkerReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one worker measured since its previous report.

    ``worker`` names it (the span batch's source; its readings carry it as
    ``worker_id``); ``anchor`` is its process's clock anchor; ``spans`` closed in the
    order they closed; ``spans_dropped`` closed beyond the report's bound and are not
    in it; ``sent_anchor`` is the worker's clocks read as the report was made, after
    every span in it closed (None from a report built by hand or by an older twinkle:
    its clock is then not checked). A report pickles (Ray) and encodes to msgpack bytes
    (:meth:`to_bytes`).
    """

    worker: NonEmpty
    anchor: ClockAnchor
    spans: tuple[Span, ...] = ()
    readings: tuple[MemoryReading, ...] = ()
    spans_dropped: Count = 0
    sent_anchor: ClockAnchor | None = None

    def to_bytes(self) -> bytes:
        """The report as msgpack bytes (what a gather over ``torch.distributed`` sends)."""
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> WorkerReport:
        """A report from :meth:`to_bytes`' bytes; every field is checked."""
        if not isinstance(data, bytes | bytearray | memoryview):
            # A str is the usual slip: the bytes decoded as text on the way (a pipe read
            # in text mode); msgpack bytes never survive that.
            raise InvalidArgumentError(
                f"WorkerReport.from_bytes takes the bytes of WorkerReport.to_bytes(), got "
                f"{type(data).__name__}: {data!r:.60}; pass those bytes as they were sent "
                "(read a pipe or socket in binary mode, never decode them to text)"
            )
        try:
            raw = msgspec.msgpack.decode(data)
        except msgspec.DecodeError as exc:
            raise InvalidArgumentError(
                f"not a worker report's bytes ({len(data)} bytes): {exc}; build them with "
                "WorkerReport.to_bytes()"
            ) from exc
        return convert_checked(
            raw, cls, what="report", fix="pass the bytes of WorkerReport.to_bytes()"
        )


class WorkerRecorder:
    """The spans and memory readings of one worker process, for a run elsewhere.

    :param worker: the worker's name in the run (``"engine0"``, ``"rank1"``).
    :param rank: its ``torch.distributed`` rank, for its memory readings.
    :param max_spans: the most spans one report carries; the rest are dropped and
        counted (a worker reporting every iteration stays far below the default).
    :param clock: the worker's monotonic ns clock; ``wall_clock``: unix ns.
    :param pid, hostname: the identity stamped on its spans, anchors and memory readings
        (default: this process's), as for :class:`~twinkle.perf.TimeRecorder`.

    Record with :meth:`span` (or :attr:`recorder`), then ship :meth:`report`.
    """

    __slots__ = ("_device", "_max_spans", "_rank", "recorder", "worker")

    def __init__(
        self,
        worker: str,
        *,
        rank: int | None = None,
        device: str | None = None,
        max_spans: int = DEFAULT_MAX_SPANS,
        clock: Clock = default_clock,
        wall_clock: Clock = time.time_ns,
        pid: int | None = None,
        hostname: str | None = None,
    ) -> None:
        if not isinstance(worker, str) or not worker:
            raise InvalidArgumentError(
                f"worker must name the worker (a non-empty str, e.g. 'engine0'), got {worker!r}"
            )
        caller_source(worker, "worker")  # (its reports' spans are a batch from `worker`)
        if isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 1:
            raise InvalidArgumentError(f"max_spans must be an int >= 1, got {max_spans!r}")
        self.worker = worker
        self.recorder = TimeRecorder(clock, wall_clock=wall_clock, pid=pid, hostname=hostname)
        self._rank = rank
        self._device = device
        self._max_spans = max_spans

    def span(self, name: str, /, **attrs: Any) -> SpanContext:
        """A span of this worker (see :meth:`TimeRecorder.span`)."""
        return self.recorder.span(name, **attrs)

    def report(self, *, memory: bool = True) -> WorkerReport:
        """Every span closed since the last report (up to ``max_spans``, the oldest
        first; the rest counted as dropped) and, with ``memory``, a reading of this
        process's memory (:func:`~twinkle.perf.memory_stats`); its clocks are read last
        (``sent_anchor``)."""
        spans = self.recorder.drain()
        dropped = max(0, len(spans) - self._max_spans)
        readings: tuple[MemoryReading, ...] = ()
        if memory:
            reading = memory_stats(device=self._device, worker_id=self.worker, rank=self._rank)
            # (under the identity its spans carry: one process in the run, and the trace)
            anchor = self.recorder.anchor
            readings = (msgspec.structs.replace(reading, pid=anchor.pid, hostname=anchor.hostname),)
        return WorkerReport(
            self.worker,
            self.recorder.anchor,
            tuple(spans[: self._max_spans]),
            readings,
            dropped,
            # Read after the drain: every span in the report closed before it, so the
            # run can tell a send placed after its arrival (a clock ahead) for certain.
            self.recorder.read_anchor(),
        )

    def __repr__(self) -> str:
        return f"<WorkerRecorder {self.worker!r} pid={os.getpid()}>"


def gather_reports(report: WorkerReport, *, group: Any = None) -> list[WorkerReport]:
    """Every rank's report, in rank order, over ``torch.distributed``: a collective every
    rank of ``group`` (default: the world) must call, typically at an iteration's end.
    Without an initialised process group, ``[report]``. The reports travel as msgpack
    bytes in uint8 tensors (nothing a peer sent is unpickled) and are checked on
    arrival."""
    if not isinstance(report, WorkerReport):
        raise InvalidArgumentError(
            f"gather_reports: report must be a WorkerReport (WorkerRecorder.report()), got "
            f"{type(report).__name__}"
        )
    dist = initialised_dist()
    if dist is None:
        return [report]
    return [WorkerReport.from_bytes(b) for b in all_gather_bytes(dist, group, report.to_bytes())]
