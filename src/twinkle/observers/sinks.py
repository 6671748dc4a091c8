"""Built-in sinks: the raw records, the WebUI flat file, the event log and the trace.

Sinks write what the run produced; they compute nothing. Every JSONL file goes through
the one :class:`~twinkle.reporting.JsonlWriter`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from twinkle.errors import RecordError, ReporterError, WriteError
from twinkle.events import (
    Event,
    IterationStarted,
    RunFinished,
    RunStarted,
    SpanBatch,
    WeightsPublished,
    dumps_event,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._config import ObserverConfig
from twinkle.perf import ClockAnchor
from twinkle.reporting import (
    Backend,
    BatchWriter,
    JsonlBackend,
    JsonlWriter,
    WebUIFlatBackend,
    WriterStats,
)

__all__ = [
    "EVENTS_FILE",
    "EventLogSink",
    "RAW_FILE",
    "RawRecordsSink",
    "TRACE_FILE",
    "TraceSink",
    "WEBUI_FILE",
    "WebUISink",
]

EVENTS_FILE = "events.jsonl"
RAW_FILE = "metrics_raw.jsonl"
WEBUI_FILE = "metrics.jsonl"
TRACE_FILE = "trace.json"


class RawRecordsSink:
    """Every record, as written by the run's reporter, in ``metrics_raw.jsonl``."""

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Backend] | None:
        if context.out_dir is None:
            return None
        return [JsonlBackend(context.out_dir / RAW_FILE)]


class WebUISink:
    """One flat numeric object per iteration in ``metrics.jsonl`` (``ts``, ``step``,
    ``total_steps``, ``iteration``, then ``<kind>/<key>`` values)."""

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Backend] | None:
        if context.out_dir is None:
            return None
        config = ObserverConfig.parse(context.config)
        # An iteration's timing and throughput come lag + 1 boundaries after it began.
        return [
            WebUIFlatBackend(
                context.out_dir / WEBUI_FILE,
                total_steps=config.total_steps,
                hold=config.finalise_lag + 2,
            )
        ]


class EventLogSink:
    """The run's full event stream in ``events.jsonl``: the log everything replays from.

    The file is opened in append mode (a resumed run keeps its earlier events; a torn
    last line is recovered). Events are batched and handed to the run's event-log
    :class:`~twinkle.reporting.BatchWriter` at every iteration boundary (and every
    ``BATCH_EVENTS`` events); its thread writes them, so the publishing thread never
    waits on the disk, at a boundary or elsewhere. At most ``MAX_BATCHES_IN_FLIGHT``
    batches are handed over and not yet written; only a hand-over that finds that many
    waits (for the oldest to be written), and each such wait is counted
    (``stats.waits``) and logged. So a process killed outright (SIGKILL, OOM killer)
    loses at most the events published since the last hand-over plus the (at most
    ``MAX_BATCHES_IN_FLIGHT``) batches handed over before it and not yet written (in
    practice the writer keeps up and only the current iteration's events are at risk);
    an exception loses none
    (:meth:`RunSession.finish` flushes). A replay writes inline.

    A write error (disk full) surfaces at the next hand-over or at close; the events it
    concerns stay in the writer's memory and go out first with the next batch (see
    :class:`JsonlWriter`), so a passing fault loses nothing.
    """

    BATCH_EVENTS = 256
    MAX_BATCHES_IN_FLIGHT = 16

    def __init__(self) -> None:
        self.writer: JsonlWriter | None = None
        self._pending: list[Event] = []
        self._batches: BatchWriter[list[Event]] | None = None
        #: events that could not be serialised at all (logged; 0 for validated events)
        self.unwritable = 0

    @property
    def stats(self) -> WriterStats | None:
        """The event-log writer's counters (batches), None when no log is written."""
        return None if self._batches is None else self._batches.stats

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is not None:
            writer = JsonlWriter(context.out_dir / EVENTS_FILE, append=True)
            self.writer = writer
            self._batches = BatchWriter(
                lambda batches: self._write(writer, batches),
                name=f"event log {str(writer.path)!r}",
                thread_name="eventlog",
                # Replays write inline: nothing to overlap, and byte order stays obvious.
                background=not context.replay,
                capacity=self.MAX_BATCHES_IN_FLIGHT,
            )

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        if self._batches is None:
            return
        # Events are frozen values: the writer thread encodes them, not the publisher.
        self._pending.append(event)
        if isinstance(event, IterationStarted | RunFinished) or (
            len(self._pending) >= self.BATCH_EVENTS
        ):
            self.flush()

    def flush(self) -> None:
        """Hand the pending events to the writer (never waiting for it to write them,
        unless ``MAX_BATCHES_IN_FLIGHT`` batches are in flight); raises an earlier
        write's error (after handing over, so the pending events are never lost to it)."""
        if self._batches is None or not self._pending:
            return
        batch, self._pending = self._pending, []
        self._batches.put(batch)

    def _write(self, writer: JsonlWriter, batches: list[list[Event]]) -> int:
        events = batches[0] if len(batches) == 1 else [e for b in batches for e in b]
        lines: list[bytes] = []
        bad: list[str] = []
        for event in events:
            try:
                lines.append(dumps_event(event) + b"\n")
            except RecordError as exc:  # never for a validated event; logged, counted
                self.unwritable += 1
                bad.append(f"{event.TYPE!r}: {exc}")
        written = writer.write_bytes_lines(lines) if lines else 0
        if bad:
            raise RecordError(
                f"{len(bad)} event(s) could not be written to {str(writer.path)!r} and are "
                f"missing from the log ({'; '.join(bad)[:500]}); the other {written} were "
                "written"
            )
        return written

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        if self.writer is None or self._batches is None:
            return
        batches, self._batches = self._batches, None
        error: BaseException | None = None
        try:
            try:
                if self._pending:
                    batch, self._pending = self._pending, []
                    batches.put(batch)
            except Exception as exc:
                error = exc
            try:
                batches.close()  # writes what is in flight
            except Exception as exc:
                error = error or exc
            lost = batches.stats.lost
            if lost and error is None:
                error = ReporterError(
                    f"{lost} batch(es) of events never reached {str(self.writer.path)!r}: "
                    f"the event-log writer stopped ({batches.failure})"
                )
        finally:
            writer, self.writer = self.writer, None
            writer.close()  # raises if lines stay unwritten (a fault that did not pass)
        # A write error whose lines went out later (close succeeded) lost nothing.
        if error is not None and not isinstance(error, WriteError):
            raise error


class TraceSink:
    """A Chrome/Perfetto trace of every span (``trace.json``), streamed as it arrives.

    Times are microseconds since the run started, on the run's timeline (spans of other
    processes moved through their clock anchors). Iteration starts and weight publishes
    are instant events.

    The hooks only hand their (immutable) events to a
    :class:`~twinkle.reporting.BatchWriter`, whose thread formats and writes them in
    order, so the publishing thread neither formats a span nor waits on the disk; at most
    ``MAX_EVENTS_IN_FLIGHT`` events wait for it (a hand-over beyond that waits, counted in
    its stats). A replay writes inline. A write error is raised by the next hand-over (the
    observer's failure, logged and counted) or at close.
    """

    MAX_EVENTS_IN_FLIGHT = 256
    #: events queued before the writer thread wakes (else every ``interval_s``): waking
    #: it per event would make it fight the publisher for the GIL at every boundary
    WAKE_AT = 32

    def __init__(self) -> None:
        self.path: Path | None = None
        self._fh: Any = None
        self._origin: ClockAnchor | None = None
        self._named: set[tuple[int, int]] = set()
        self._batches: BatchWriter[Event] | None = None

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is not None:
            self.path = context.out_dir / TRACE_FILE
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            self._fh = self.path.open("wb", buffering=1 << 20)
            # JSON array form: Perfetto and chrome://tracing accept it.
            self._fh.write(b"[\n")
            self._batches = BatchWriter(
                self._write_events,
                name=f"trace {str(self.path)!r}",
                thread_name="trace",
                background=not context.replay,
                capacity=self.MAX_EVENTS_IN_FLIGHT,
                wake_at=self.WAKE_AT,
            )

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        if self._batches is not None and event.spans:
            self._batches.put(event)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        batches, self._batches = self._batches, None
        try:
            if batches is not None:
                batches.close()  # writes what is in flight; raises a held write error
        finally:
            if self._fh is not None:
                self._fh.write(b'{"name": "end", "ph": "M", "pid": 0, "args": {}}\n]\n')
                self._fh.close()
                self._fh = None

    # -- the writer's side -----------------------------------------------------------------

    def _write_events(self, events: list[Event]) -> None:
        lines: list[bytes] = []
        failed: list[str] = []
        for event in events:
            try:
                self._event_lines(event, lines)
            except TypeError as exc:  # orjson's JSONEncodeError: a value that is not JSON
                failed.append(f"{event.TYPE!r}: {exc}")
        if lines and self._fh is not None:
            lines.append(b"")  # every line ends with ",\n"
            self._fh.write(b",\n".join(lines))  # one write per batch
        if failed:
            raise RecordError(
                f"{len(failed)} event(s) could not be written to the trace "
                f"{str(self.path)!r} ({'; '.join(failed)[:500]}); the others were written"
            )

    def _event_lines(self, event: Event, lines: list[bytes]) -> None:
        """Append ``event``'s trace lines to ``lines``."""
        if isinstance(event, SpanBatch):
            self._span_lines(event, lines)
        elif isinstance(event, IterationStarted):
            lines.append(
                orjson.dumps(
                    {
                        "name": f"iteration {event.iteration}",
                        "ph": "i",
                        "s": "g",
                        "pid": self._origin.pid if self._origin else 0,
                        "tid": 0,
                        "ts": self._us(event.monotonic_ns),
                    }
                )
            )
        elif isinstance(event, WeightsPublished):
            lines.append(
                orjson.dumps(
                    {
                        "name": f"weights v{event.version}",
                        "ph": "X",
                        "cat": "weights",
                        "pid": self._origin.pid if self._origin else 0,
                        "tid": 0,
                        "ts": self._us(event.start_ns),
                        "dur": (event.end_ns - event.start_ns) / 1000.0,
                        "args": {a.engine: self._us(a.acked_ns) for a in event.acks},
                    }
                )
            )
        elif isinstance(event, RunStarted):
            self._origin = event.anchor
            lines.append(
                orjson.dumps(
                    {
                        "name": "process_name",
                        "ph": "M",
                        "pid": event.anchor.pid,
                        "args": {"name": f"{event.run_id} ({event.anchor.hostname})"},
                    }
                )
            )

    def _us(self, ns: int) -> float:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        return (ns - origin) / 1000.0

    def _span_lines(self, event: SpanBatch, lines: list[bytes]) -> None:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        offset = event.anchor.shift_onto(self._origin) - origin  # onto the run, from its start
        source = event.source
        named = self._named
        for span in event.spans:
            pid, tid = span.pid, span.thread_id
            if (pid, tid) not in named:
                named.add((pid, tid))
                lines.append(
                    orjson.dumps(
                        {
                            "name": "thread_name",
                            "ph": "M",
                            "pid": pid,
                            "tid": tid,
                            "args": {"name": f"{source}:{tid}"},
                        }
                    )
                )
            args = span.attrs if span.error is None else {**span.attrs, "error": span.error}
            lines.append(
                orjson.dumps(
                    {
                        "name": span.name,
                        "cat": source,
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": (span.start_ns + offset) / 1000.0,
                        "dur": (span.end_ns - span.start_ns) / 1000.0,
                        "args": args,
                    }
                )
            )
