"""Built-in sinks: the event log here; the record files' (the raw records, the WebUI flat
file) in :mod:`twinkle.observers._record_sinks` and the trace's in
:mod:`twinkle.observers.trace`, their names re-exported here.

Sinks write what the run produced; they compute nothing. Every JSONL file goes through
the one :class:`~twinkle.reporting.JsonlWriter`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from twinkle.errors import RecordError, ReporterError, WriteError
from twinkle.events import (
    Event,
    IterationStarted,
    RunFinished,
    RunResumed,
    RunStarted,
    SpanBatch,
    dumps_event,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._held_log import HeldLog, refuse_outputs_without_log
from twinkle.observers._record_sinks import RAW_FILE, WEBUI_FILE, RawRecordsSink, WebUISink
from twinkle.observers.trace import TRACE_FILE, TraceSink
from twinkle.reporting import (
    BatchWriter,
    JsonlWriter,
    WriterStats,
)

__all__ = [
    "EVENTS_FILE",
    "SEQ_KEY",
    "EventLogSink",
    "RAW_FILE",
    "RawRecordsSink",
    "TRACE_FILE",
    "TraceSink",
    "WEBUI_FILE",
    "WebUISink",
]

EVENTS_FILE = "events.jsonl"
#: the first key of every event-log line: the line's 0-based number in its file
SEQ_KEY = "seq"

_log = logging.getLogger("twinkle.observers")


class EventLogSink(BuiltinObserver):
    """The run's full event stream in ``events.jsonl``: the log everything replays from.

    **Format.** One event per line, ``{"seq": N, "type": ..., <fields>}``: ``seq`` is the
    line's 0-based number in the file, consecutive, the first key; the rest is the
    event's JSON form (:func:`~twinkle.events.dumps_event`), so a reader drops ``seq``
    before :func:`~twinkle.events.event_from_dict`. A file that already holds lines
    continues after the ``seq`` of its last one. A log of an older twinkle has no
    ``seq``: new lines continue it from ``RunContext.resumed_events`` (the events the
    resumed run found in it: the file's count) or from 0 when nothing was resumed.
    No line is longer than the writer's limit
    (:data:`~twinkle.reporting.jsonl.MAX_LINE_BYTES`): a span batch that would be is
    written as several span-batch lines (same run, source, anchor and times, its spans
    in order, split where they fit; observers add span batches up, so a replay gives the
    same records); any other event that large is refused with a
    :class:`~twinkle.errors.RecordError` naming it and counted in :attr:`unwritable`.

    **Resuming.** When a live run resumes (``RunContext.resumed_events > 0``) the
    observers are fed the logged events again first: the first ``resumed_events`` events
    this sink receives are in the log already and are not written again; the ``seq`` of
    the file's last line must then be ``resumed_events - 1`` (else the log is not the one
    the run resumed: :class:`~twinkle.errors.ReporterError` at configure).

    **Writing.** The file is opened in append mode (a torn last line is recovered); a
    log that cannot be opened fails the run's start with a
    :class:`~twinkle.errors.ReporterError` naming it. Events are batched and handed to
    the run's event-log :class:`~twinkle.reporting.BatchWriter` at every iteration
    boundary (and every ``BATCH_EVENTS`` events); its thread numbers, encodes and writes
    them, so the publishing thread only appends to a list and never waits on the disk,
    at a boundary or elsewhere. At most ``MAX_BATCHES_IN_FLIGHT`` batches are handed over
    and not yet written; only a hand-over that finds that many waits (for the oldest to
    be written), and each such wait is counted (``stats.waits``) and logged. So a process
    killed outright (SIGKILL, OOM killer) loses at most the events published since the
    last hand-over plus the (at most ``MAX_BATCHES_IN_FLIGHT``) batches handed over
    before it and not yet written (in practice the writer keeps up and only the current
    iteration's events are at risk); an exception loses none (:meth:`RunSession.finish`
    flushes). A replay writes inline. The file is fsynced at close, before the summary.
    A new segment's first event (``run_started``, ``run_resumed``) is written through at
    once and fsynced before the hook returns: a process killed right after
    :meth:`RunSession.start` leaves a log that resumes and replays.

    **The file stays the run's.** Before each batch and at close the sink checks that the
    log's path still leads to the file it writes (:class:`HeldLog`). A log deleted or
    replaced while the run writes it is written back whole from the open file (a file
    found in its place is moved aside to ``events.jsonl.replaced-<ns>``), logged as an
    error and kept in :attr:`failure`: the run then finishes with status ``error`` naming
    it. A truncated log cannot be written back (its bytes are gone); it is named the same
    way. A run directory that holds the sinks' record files but no event log (deleted
    between runs) is refused at configure: its records could not be continued without
    doubling iterations, nor rebuilt.

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
        self._skip = 0  # events of a resumed run still to come that the log holds already
        self._seq = 0  # the next line's seq (the writer's side)
        self._held: HeldLog | None = None  # the log as this run holds it open
        self._resumed = 0  # events the log held when the run began (fed again first)
        self._received = 0  # events this sink received
        self._live = False  # a live run's log (a replay's needs no write-through)
        #: events that could not be written (not serialisable, or over the line limit
        #: and not a span batch that can be split; each logged and raised)
        self.unwritable = 0
        #: why the log on disk is not (or was not for a while) what the run wrote:
        #: deleted, replaced or truncated while it ran, or its last lines never written
        #: (a disk fault that lasted to the close) (None: it is); the run's finish
        #: raises it, so the run's status is ``error``
        self.failure: ReporterError | None = None

    @property
    def logged(self) -> int:
        """The events the log holds: the next line's ``seq`` (once its writer wrote them)."""
        return self._seq

    def sync_point(self) -> int | None:
        """Hand the pending events to the writer and wait until it wrote them (not
        fsynced); the events the log then holds, or None when a write failed or left
        lines in memory (its error stays for the run to see)."""
        if self._batches is None or self.writer is None or self._skip:
            return None  # (no log, or events fed again still to come)
        if not self._batches.settle():
            return None
        batch = self._take_pending()
        if batch:
            self._batches.put(batch)
        if not self._batches.settle() or self.writer.unwritten_records:
            return None
        return self._seq

    @property
    def stats(self) -> WriterStats | None:
        """The event-log writer's counters (batches), None when no log is written."""
        return None if self._batches is None else self._batches.stats

    # First of all the observers: a log that cannot be opened fails the start before any
    # other output exists.
    @hookimpl(tryfirst=True)
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is None:
            return
        path = context.out_dir / EVENTS_FILE
        if not context.replay and not context.resumed_events:
            refuse_outputs_without_log(path, (RAW_FILE, WEBUI_FILE, TRACE_FILE))
        try:
            writer = JsonlWriter(path, append=True)
        except OSError as exc:  # every open failure is a ReporterError: fatal to the start
            if isinstance(exc, ReporterError):
                raise
            raise ReporterError(
                f"cannot open the event log {str(path)!r}: {exc}; the run cannot start "
                "without it: fix the path or its permissions"
            ) from exc
        try:
            self._seq = self._first_seq(writer, context.resumed_events)
            self._held = HeldLog(path)
        except BaseException:
            writer.close()
            raise
        # (from a checkpoint, only the events after it are fed again)
        restored = 0 if context.checkpoint is None else context.checkpoint.events
        self._skip = self._resumed = context.resumed_events - restored
        self._live = not context.replay
        self.writer = writer
        self._batches = BatchWriter(
            self._write,
            name=f"event log {str(writer.path)!r}",
            thread_name="eventlog",
            # Replays write inline: nothing to overlap, and byte order stays obvious.
            background=not context.replay,
            capacity=self.MAX_BATCHES_IN_FLIGHT,
        )

    @staticmethod
    def _first_seq(writer: JsonlWriter, resumed: int) -> int:
        last = writer.last_object()
        seq = None if last is None else last.get(SEQ_KEY)
        if type(seq) is not int or seq < 0:
            return resumed  # a new file (0), or an older twinkle's log: its event count
        if resumed and seq + 1 != resumed:
            raise ReporterError(
                f"{str(writer.path)!r} ends with the event of seq {seq}, but the run "
                f"resumes after {resumed} logged event(s): the log changed since it was "
                "read; start the run again"
            )
        return seq + 1

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        if self._batches is None:
            return
        # Events are frozen values: the writer thread encodes them, not the publisher.
        self._pending.append(event)
        self._received += 1
        if (
            isinstance(event, RunStarted | RunResumed)
            and self._live
            and self._received > self._resumed
        ):
            self._write_through()  # a new segment begins (not a logged one fed again)
        elif isinstance(event, IterationStarted | RunFinished) or (
            len(self._pending) >= self.BATCH_EVENTS
        ):
            self.flush()

    def _write_through(self) -> None:
        """Write the pending events now, and fsync them: once the start returns, a kill
        leaves a log that holds the segment's first event (it resumes and replays)."""
        self.flush()
        if self._batches is not None and self._held is not None:
            self._batches.flush()  # (waits for the writer thread; raises its error)
            self._held.sync()

    def flush(self) -> None:
        """Hand the pending events to the writer (never waiting for it to write them,
        unless ``MAX_BATCHES_IN_FLIGHT`` batches are in flight); raises an earlier
        write's error (after handing over, so the pending events are never lost to it)."""
        if self._batches is None or not self._pending:
            return
        batch = self._take_pending()
        if batch:
            self._batches.put(batch)

    def _take_pending(self) -> list[Event]:
        """The pending events, less those a resumed run's log holds already."""
        batch, self._pending = self._pending, []
        if self._skip:
            logged = min(self._skip, len(batch))
            self._skip -= logged
            del batch[:logged]
        return batch

    def _checked_writer(self) -> JsonlWriter:
        """The log's writer, once the log's path was checked to lead to the file it
        writes; when it does not, the log is written back (and written on through a
        writer of the file now at its path) and :attr:`failure` says what happened."""
        writer, held = self.writer, self._held
        if writer is None or held is None:  # pragma: no cover - only called while open
            raise ReporterError("the event log is closed")
        damage = held.check()
        if damage is None:
            return writer
        log = f"the event log {str(held.path)!r} was {damage.what} while the run wrote it"
        if not damage.restorable:
            self._fail(
                f"{log}: the events before are missing from it (the run cannot be resumed "
                "or replayed from it); keep the run directory out of reach of cleaners"
            )
            return writer
        try:
            aside = held.restore()
            restored = JsonlWriter(held.path, append=True)
        except (ReporterError, OSError) as exc:
            self._fail(f"{log}, and writing it back failed: {exc}")
            return writer  # (the open file gets the events; tried again next batch)
        writer.close()
        self.writer = restored
        moved = "" if aside is None else f"; the file found in its place is now {aside.name!r}"
        self._fail(
            f"{log}; twinkle wrote it back whole from the file it held open, nothing is "
            f"lost{moved}. Find what deletes or replaces files in {str(held.path.parent)!r}"
        )
        return restored

    def _lost(self, path: Path, lines: int, exc: WriteError) -> None:
        """The log's last ``lines`` lines never reached it (a write fault that lasted to
        the close): the events from the seq they begin at are missing from the run."""
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        self._fail(
            f"the event log {str(path)!r} lost its last {lines} line(s), the events from "
            f"seq {self._seq - lines} on ({why}): the run's log, its replay and a resume "
            "end before them; free disk space (or fix the file's permissions) for the next run"
        )

    def _fail(self, message: str) -> None:
        """Keep ``message`` as the run's failure (the run ends in ``error``), logged."""
        self.failure = ReporterError(message)
        _log.error("%s", message)

    def _write(self, batches: list[list[Event]]) -> int:
        writer = self._checked_writer()
        events = batches[0] if len(batches) == 1 else [e for b in batches for e in b]
        limit = writer.max_line_bytes
        lines: list[bytes] = []
        bad: list[str] = []
        seq = self._seq
        for event in events:
            try:
                body = dumps_event(event)
            except RecordError as exc:  # never for a validated event; logged, counted
                self.unwritable += 1
                bad.append(f"{event.TYPE!r}: {exc}")
                continue
            # seq spliced in as the first key: b'{"type":...' -> b'{"seq":N,"type":...'
            line = b'{"seq":%d,%b\n' % (seq, body[1:])
            if len(line) <= limit:
                lines.append(line)
                seq += 1
                continue
            try:
                pieces = _split_line(event, seq, limit)
            except RecordError as exc:
                self.unwritable += 1
                bad.append(str(exc))
                continue
            lines.extend(pieces)
            seq += len(pieces)
        # Numbers are taken once the lines are handed over: a write error keeps them in
        # the writer's memory, to be written with these numbers.
        self._seq = seq
        written = writer.write_bytes_lines(lines) if lines else 0
        if self._held is not None:
            self._held.wrote(sum(map(len, lines)))
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
                batch = self._take_pending()
                if batch:
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
            self._checked_writer()  # (deleted after the last batch: written back now)
        finally:
            writer, self.writer = self.writer, None
            held, self._held = self._held, None
            try:
                writer.close()  # fsyncs; raises if lines stay unwritten (a fault that lasted)
            except WriteError as exc:
                if exc.lost_lines:  # the run's last events: the run's failure, named
                    self._lost(writer.path, exc.lost_lines, exc)
                raise
            finally:
                if held is not None:
                    held.close()
        # A write error whose lines went out later (close succeeded) lost nothing.
        if error is not None and not isinstance(error, WriteError):
            raise error


def _line(event: Event, seq: int) -> bytes:
    """``event``'s log line, ``seq`` spliced in as the first key:
    ``b'{"type":...}'`` becomes ``b'{"seq":N,"type":...}\\n'``."""
    return b'{"seq":%d,%b\n' % (seq, dumps_event(event)[1:])


def _split_line(event: Event, seq: int, limit: int) -> list[bytes]:
    """The lines of a span batch too long for one line: consecutive runs of its spans,
    in order, each line within ``limit`` (numbered from ``seq``), halved until they fit;
    the first carries the batch's ``dropped`` count, the others 0 (a replay adds them
    up). Any other event, or a single span too long for a line, raises
    :class:`~twinkle.errors.RecordError`."""
    if not isinstance(event, SpanBatch) or not event.spans:
        raise RecordError(
            f"event {event.TYPE!r} is {len(dumps_event(event))} bytes as a line, more than "
            f"the event log's line limit MAX_LINE_BYTES={limit}: it is not written; publish "
            "smaller events (e.g. fewer readings or keys per event)"
        )
    last = seq + len(event.spans)  # a line's seq is at most this: its length bounds them
    runs: list[tuple[int, int]] = []
    todo = [(0, len(event.spans))]
    while todo:
        lo, hi = todo.pop()
        if len(_line(_run(event, lo, hi), last)) <= limit:
            runs.append((lo, hi))
        elif hi - lo == 1:
            raise RecordError(
                f"span {lo} ({event.spans[lo].name!r}) of a span batch from {event.source!r} "
                f"alone makes a line longer than the event log's line limit "
                f"MAX_LINE_BYTES={limit}: the batch is not written; keep span attrs small"
            )
        else:
            mid = (lo + hi) // 2
            todo += [(mid, hi), (lo, mid)]  # (the first half is taken first)
    return [_line(_run(event, lo, hi), seq + i) for i, (lo, hi) in enumerate(runs)]


def _run(batch: SpanBatch, lo: int, hi: int) -> SpanBatch:
    """``batch``'s spans ``lo`` to ``hi`` as a batch: its ``dropped`` count on the first
    run only."""
    return msgspec.structs.replace(
        batch, spans=batch.spans[lo:hi], dropped=batch.dropped if lo == 0 else 0
    )
