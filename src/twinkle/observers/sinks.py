"""Built-in sinks: the raw records, the WebUI flat file, the event log and the trace.

Sinks write what the run produced; they compute nothing. Every JSONL file goes through
the one :class:`~twinkle.reporting.JsonlWriter`.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from twinkle.errors import RecordError, WriteError
from twinkle.events import (
    Event,
    IterationStarted,
    RunFinished,
    RunStarted,
    SpanBatch,
    WeightsPublished,
    event_to_dict,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import Backend, JsonlBackend, JsonlWriter, WebUIFlatBackend
from twinkle.observers._config import ObserverConfig
from twinkle.perf import ClockAnchor

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
    last line is recovered). Events are batched and handed to one writer thread at every
    iteration boundary (and every 256 events), so the publishing thread never waits on
    the disk for the current batch. At a boundary it waits for the batches handed over
    before (the writer had a whole iteration for them), so the writer is never more than
    one batch behind there: a process killed outright (SIGKILL, OOM killer) loses at most
    the events published since the previous iteration boundary; an exception loses none
    (:meth:`RunSession.finish` flushes).

    A write error (disk full) surfaces at the next hand-over or at close; the events it
    concerns stay in the writer's memory and go out first with the next batch (see
    :class:`JsonlWriter`), so a passing fault loses nothing.
    """

    _BATCH = 256
    _MAX_IN_FLIGHT = 64  # batches queued for the writer before the publisher waits

    def __init__(self) -> None:
        self.writer: JsonlWriter | None = None
        self._pending: list[dict[str, Any]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: deque[Future[int]] = deque()
        #: events that could not be serialised at all (logged; 0 for validated events)
        self.unwritable = 0

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is not None:
            self.writer = JsonlWriter(context.out_dir / EVENTS_FILE, append=True)
            # Replays write inline: nothing to overlap, and byte order stays obvious.
            if not context.replay:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="twinkle-eventlog")

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        if self.writer is None:
            return
        self._pending.append(event_to_dict(event))
        if isinstance(event, IterationStarted | RunFinished):
            self.flush(boundary=True)
        elif len(self._pending) >= self._BATCH:
            self.flush()

    def flush(self, *, boundary: bool = False) -> None:
        """Hand the pending events to the writer; raises an earlier write's error (after
        handing over, so the pending events are never lost to it).

        ``boundary=True`` also waits for every batch handed over before this one.
        """
        writer = self.writer
        if writer is None:
            return
        if self._pending:
            batch, self._pending = self._pending, []
            if self._pool is None:
                self._write(writer, batch)
                return
            try:
                self._in_flight.append(self._pool.submit(self._write, writer, batch))
            except RuntimeError:
                # The interpreter is exiting (a run finished at exit): the pool takes no
                # more work, so write here, after the batches already handed over.
                try:
                    self._wait_all()
                finally:
                    self._write(writer, batch)  # an earlier batch's error never drops it
                return
        keep = 1 if boundary else self._MAX_IN_FLIGHT
        error: BaseException | None = None
        while self._in_flight and (self._in_flight[0].done() or len(self._in_flight) > keep):
            try:
                self._in_flight.popleft().result()
            except Exception as exc:  # later batches still get written
                error = error or exc
        if error is not None:
            raise error

    def _wait_all(self) -> None:
        error: BaseException | None = None
        while self._in_flight:
            try:
                self._in_flight.popleft().result()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def _write(self, writer: JsonlWriter, batch: list[dict[str, Any]]) -> int:
        try:
            return writer.write(batch)
        except RecordError:
            pass  # one event of the batch is not JSON: write every other one
        written = 0
        bad: list[str] = []
        for obj in batch:
            try:
                written += writer.write([obj])
            except RecordError as exc:
                self.unwritable += 1
                bad.append(f"{obj.get('type')!r}: {exc}")
        raise RecordError(
            f"{len(bad)} event(s) could not be written to {str(writer.path)!r} and are "
            f"missing from the log ({'; '.join(bad)[:500]}); the other {written} were written"
        )

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        if self.writer is None:
            return
        error: BaseException | None = None
        try:
            try:
                self.flush()
            except Exception as exc:
                error = exc
            try:
                self._wait_all()
            except Exception as exc:
                error = error or exc
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
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
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self._fh: Any = None
        self._origin: ClockAnchor | None = None
        self._named: set[tuple[int, int]] = set()

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is not None:
            self.path = context.out_dir / TRACE_FILE
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            self._fh = self.path.open("wb", buffering=1 << 20)
            # JSON array form: Perfetto and chrome://tracing accept it.
            self._fh.write(b"[\n")

    def _write(self, obj: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(orjson.dumps(obj) + b",\n")

    def _us(self, ns: int) -> float:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        return (ns - origin) / 1000.0

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self._origin = event.anchor
        self._write(
            {
                "name": "process_name",
                "ph": "M",
                "pid": event.anchor.pid,
                "args": {"name": f"{event.run_id} ({event.anchor.hostname})"},
            }
        )

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        fh = self._fh
        if fh is None:
            return
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        offset = event.anchor.shift_onto(self._origin) - origin  # onto the run, from its start
        source = event.source
        named = self._named
        lines: list[bytes] = []
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
        if lines:
            lines.append(b"")  # every line ends with ",\n"
            fh.write(b",\n".join(lines))  # one write per batch

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        self._write(
            {
                "name": f"iteration {event.iteration}",
                "ph": "i",
                "s": "g",
                "pid": self._origin.pid if self._origin else 0,
                "tid": 0,
                "ts": self._us(event.monotonic_ns),
            }
        )

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        self._write(
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

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        if self._fh is not None:
            self._fh.write(b'{"name": "end", "ph": "M", "pid": 0, "args": {}}\n]\n')
            self._fh.close()
            self._fh = None
