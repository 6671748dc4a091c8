"""The built-in trace sink: ``trace.json``, a Chrome/Perfetto trace of the run's spans
within a size budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from twinkle.errors import RecordError, ReporterError, WriteError
from twinkle.events import (
    Event,
    IterationStarted,
    MemoryReadings,
    RunFinished,
    RunResumed,
    RunStarted,
    SpanBatch,
    WeightsPublished,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._trace_lines import TraceLines
from twinkle.observers._trace_tracks import PathSlices
from twinkle.observers.timeline import TIMELINE
from twinkle.reporting import BatchWriter, ReplacingFile

__all__ = ["TRACE_FILE", "TraceSink"]

TRACE_FILE = "trace.json"


class TraceSink(BuiltinObserver):
    """A Chrome/Perfetto trace of every span (``trace.json``), streamed as it arrives.

    What the lines say (times, processes, tracks and lanes, weight arrows, memory
    counters, the size budget) is :class:`~twinkle.observers._trace_lines.TraceLines`'s;
    this sink owns the file, its writer thread and the trace's checkpoints.

    The hooks only hand their (immutable) events to a
    :class:`~twinkle.reporting.BatchWriter`, whose thread formats and writes them in
    order, so the publishing thread neither formats a span nor waits on the disk; at most
    ``MAX_EVENTS_IN_FLIGHT`` events wait for it (a hand-over beyond that waits, counted in
    its stats). A replay writes inline. A write error is raised by the next hand-over (the
    observer's failure, logged and counted) or at close.

    The trace is streamed into a temporary file beside ``trace.json``
    (:class:`~twinkle.reporting.ReplacingFile`), fsynced and renamed into place at
    close, once ``run_finished`` went by and every write succeeded: a reader never sees
    half a trace, and a run that crashes, never finished (a start or resume that
    failed) or met a write error leaves the previous ``trace.json`` (or none) as it
    was. A resumed run rebuilds it whole from the re-fed events. A ``trace.json`` that
    is a symlink is refused
    (:class:`~twinkle.errors.ReporterError`); no link is ever written through.
    """

    MAX_EVENTS_IN_FLIGHT = 256
    #: events queued before the writer thread wakes (else every ``interval_s``): waking
    #: it per event would make it fight the publisher for the GIL at every boundary
    WAKE_AT = 32

    _HEAD = b"[\n"  # JSON array form: Perfetto and chrome://tracing accept it
    _END = b'{"name": "end", "ph": "M", "pid": 0, "args": {}}\n]\n'

    def __init__(self) -> None:
        self.path: Path | None = None
        self._out: ReplacingFile | None = None
        self._finished = False  # run_finished arrived: there is a whole trace to put in place
        self._broken: OSError | None = None  # a write failed: the file lacks lines
        self._lines = TraceLines()  # what the trace says so far
        self._batches: BatchWriter[Event | PathSlices] | None = None
        self._context: RunContext | None = None  # (its stash holds the run's timeline)
        self._written = 0  # bytes written into the file so far (its tail not yet)

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self._context = context
        if context.out_dir is not None:
            self.path = context.out_dir / TRACE_FILE
            # The trace a checkpoint marks (a killed segment's unfinished one, maybe),
            # opened before the new file's opening removes what dead writers left
            head = None
            if context.checkpoint is not None:
                head = (context.out_dir / context.checkpoint.files[TRACE_FILE].path).open("rb")
            try:
                self._out = ReplacingFile(self.path)
            except BaseException:
                if head is not None:
                    head.close()
                raise
            try:
                if head is None:
                    self._out.write(self._HEAD)
                    self._written = len(self._HEAD)
                else:
                    with head:
                        self._written = self._copy(head, context.checkpoint.files[TRACE_FILE].size)
                self._batches = BatchWriter(
                    self._write_events,
                    name=f"trace {str(self.path)!r}",
                    thread_name="trace",
                    background=not context.replay,
                    capacity=self.MAX_EVENTS_IN_FLIGHT,
                    wake_at=self.WAKE_AT,
                )
            except BaseException:
                self._out.discard()
                self._out = None
                raise

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # A segment begins: the trace is whole again only once it finishes (a resume
        # interrupted while its log is re-fed leaves the trace there was).
        self._finished = False
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        self._finished = True
        self._put_path()
        if self._batches is not None:
            self._batches.put(event)

    def _put_path(self) -> None:
        """The critical path of the windows the timeline just finalised (none when no
        timeline observer runs), for its track."""
        timeline = None if self._context is None else self._context.stash.get(TIMELINE)
        if self._batches is None or timeline is None:
            return
        for done in timeline.finished:
            if done.window.path_slices:
                self._batches.put(PathSlices(done.window.path_slices))

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        if self._batches is not None and event.spans:
            self._batches.put(event)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        if self._batches is not None:
            self._batches.put(event)
            self._put_path()

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        if self._batches is not None:
            self._batches.put(event)

    @hookimpl
    def twinkle_memory(self, event: MemoryReadings) -> None:
        if self._batches is not None and event.readings:
            self._batches.put(event)

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        batches, self._batches = self._batches, None
        try:
            if batches is not None:
                batches.close()  # writes what is in flight; raises a held write error
        finally:
            out, self._out = self._out, None
            if out is not None and self._broken is not None:
                out.discard()
                raise WriteError(
                    self._broken.errno,
                    f"{str(out.path)!r} was not written: a write failed "
                    f"({self._broken.strerror or self._broken}) and the trace lacks lines; "
                    "the previous trace (if any) is kept; rebuild it with twinkle replay",
                )
            if out is not None and self._finished:
                try:
                    # The tail the budget held, what it left out; the tracks' names last:
                    # only now is every span of the run known (viewers read metadata
                    # wherever it is in the file).
                    out.write(self._lines.tail() + self._END)
                except OSError as exc:
                    out.discard()
                    raise WriteError(
                        exc.errno,
                        f"cannot write {str(out.path)!r}: {exc.strerror or exc}; the "
                        "previous trace (if any) is kept",
                    ) from exc
                out.commit()  # fsync, then rename into place
            elif out is not None:
                out.discard()  # the run never finished (its start failed): keep what was

    # -- checkpoints -----------------------------------------------------------------------

    #: what a checkpoint does not carry: the file, its writer, the run's frame
    _RUNTIME = frozenset({"path", "_out", "_finished", "_broken", "_batches", "_context"})

    def checkpoint_state(self) -> dict[str, Any]:
        """What the trace holds so far, for a checkpoint (taken after :meth:`head`: its
        writer has turned every event into lines)."""
        return {k: v for k, v in vars(self).items() if k not in self._RUNTIME}

    def head(self) -> tuple[Path, int] | None:
        """The file the trace is written to now (its temporary file while the run
        runs) and its bytes before the tail, handed to the OS once its writer turned
        every event into lines: what a checkpoint marks. None when there is none, or a
        write or an event failed (its error stays for the run to see)."""
        out = self._out
        if out is None or out.closed or self._broken is not None or self._batches is None:
            return None
        if not self._batches.settle():
            return None
        out.flush()
        return out.tmp, self._written

    def restore(self, state: dict[str, Any]) -> None:
        """Take :meth:`checkpoint_state` back (the file's head was copied at configure)."""
        written = self._written
        vars(self).update(state)
        if written != self._written:
            raise ReporterError(
                f"the trace's head holds {written} bytes, its checkpoint says "
                f"{self._written}: start the run again"
            )

    def _copy(self, head: BinaryIO, size: int) -> int:
        """Copy the first ``size`` bytes of ``head`` into the new file."""
        assert self._out is not None
        left = size
        while left > 0 and (chunk := head.read(min(left, 1 << 20))):
            self._out.write(chunk)
            left -= len(chunk)
        if left:
            raise ReporterError(
                f"{head.name!r} is shorter than the checkpoint it resumes from says: it "
                "changed while the run resumed; start the run again"
            )
        return size

    # -- the writer's side -----------------------------------------------------------------

    def _write_events(self, events: list[Event | PathSlices]) -> None:
        lines: list[bytes] = []
        failed: list[str] = []
        for event in events:
            try:
                self._lines.add(event, lines)
            except TypeError as exc:  # orjson's JSONEncodeError: a value that is not JSON
                failed.append(f"{event.TYPE!r}: {exc}")
        if lines and self._out is not None and self._broken is None:
            lines.append(b"")  # every line ends with ",\n"
            data = b",\n".join(lines)
            try:
                self._out.write(data)  # one (buffered) write per batch
                self._written += len(data)
            except OSError as exc:
                self._broken = exc  # part of the batch may be in: never commit this file
                raise
        if failed:
            raise RecordError(
                f"{len(failed)} event(s) could not be written to the trace "
                f"{str(self.path)!r} ({'; '.join(failed)[:500]}); the others were written"
            )
