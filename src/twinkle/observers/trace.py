"""The built-in trace sink: ``trace.json``, a Chrome/Perfetto trace of the run's spans
within a size budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from twinkle.checks import OWN_SOURCE_PREFIX
from twinkle.errors import ConfigError, RecordError, ReporterError, WriteError
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
from twinkle.metric import convert_bytes
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._config import TRACE_BUDGET_MB, ClockSkewTolerance, ObserverConfig
from twinkle.observers._trace_budget import TraceBudget
from twinkle.observers._trace_tracks import (
    ARROW_MEMORY,
    ITERATIONS_TRACK,
    PATH_TRACK,
    WEIGHTS_TRACK,
    PathSlices,
    Track,
    nest,
    training_phase,
)
from twinkle.observers.placement import place_batch
from twinkle.observers.timeline import TIMELINE
from twinkle.perf import ClockAnchor
from twinkle.reporting import BatchWriter, ReplacingFile

__all__ = ["TRACE_FILE", "TraceSink"]

TRACE_FILE = "trace.json"


class TraceSink(BuiltinObserver):
    """A Chrome/Perfetto trace of every span (``trace.json``), streamed as it arrives.

    Times are microseconds since the run started, on the run's timeline (spans of other
    processes moved through their clock anchors, or a skewed worker's by their arrival,
    as the timeline places them: :mod:`~twinkle.observers.placement`). Iteration starts
    are instant events on the run process's ``iterations`` track, weight publishes
    slices on its ``weights`` track; a segment's resume (``segment 1 resumed``) an instant
    event across every track.

    **Tracks.** Every process is named (the run's by its run id, a worker's by its span
    source). A thread's track is named by the role of the spans it carries, decided
    over the whole run (names are written at close, so a thread is never named after
    whatever span happened to come first):

    * ``trainer``: the track carries a span of the run's training phase (the config's
      ``streaming.training``, else its phase ``train``), whatever else it carries (a
      trainer also publishes, loads engines' weights, waits on rollouts);
    * else the role most of its spans have (a tie: the one seen first). A span's role is
      the ``engine`` it served (its ``engine`` attribute: an engine's producer thread),
      else its phase under the config's ``phases``, else its source (``main``);
      twinkle's own spans (sources starting ``twinkle.``) do not count;
    * else (twinkle's spans only) the source of twinkle's first span there, e.g.
      ``twinkle.observers``: twinkle's own work.

    The name ends in the thread's ident: ``trainer (thread 1402...)``. Spans that overlap
    on one thread without nesting (spans opened and closed by hand) go to a lane of
    their own, a track named by the same rule over its own spans (``..., lane 1``), so
    a viewer never nests them wrongly. Track ids are small numbers per process, in order
    of first use (viewers such as Perfetto read a ``tid`` as 32 bits; a Python thread
    ident is wider). A publish is joined by a flow arrow to each engine's
    ``weights.load`` of that version; an arrow is written only once both its ends are
    (a load no publish announced, such as an engine's initial weights, has none), and
    its id is a number (Perfetto reads a string id as hex). Memory readings are counter
    tracks (MiB) in the process that took them.

    **Budget.** The windows' lines go through a
    :class:`~twinkle.observers._trace_budget.TraceBudget` (``config.trace.budget_mb``):
    a long run's trace shows its tail and its notable windows in full, older ones in
    outline or not at all, and ends with a ``trace_budget`` line saying what it left out.

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
        self._origin: ClockAnchor | None = None
        self._skew = ClockSkewTolerance()  # the run's, from its run_started
        self._config: ObserverConfig | None = None  # the run's phases (None: unreadable)
        self._training: str | None = None  # the run's training phase
        self._processes: set[int] = set()
        # per (pid, thread or marker track): its lanes, each its outermost spans as
        # (start, end), in order
        self._lanes: dict[tuple[int, int | str], list[list[tuple[int, int]]]] = {}
        # per (pid, thread or marker track, lane), in order of first use
        self._tracks: dict[tuple[int, int | str, int], Track] = {}
        self._last_tid: dict[int, int] = {}  # per pid: the last track id given
        # the ends of weight arrows waiting for the other end, by (version, engine):
        # (pid, tid, ts) of a publish, of a load
        self._sends: dict[tuple[int, str], tuple[int, int, float]] = {}
        self._loads: dict[tuple[int, str], tuple[int, int, float]] = {}
        self._arrows = 0  # arrows written (the last one's id)
        #: which windows the trace shows in full, in outline, or leaves out
        self._budget = TraceBudget(TRACE_BUDGET_MB * 10**6)
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
                    out.write(self._tail() + self._track_names() + self._END)
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
                self._event_lines(event, lines)
            except TypeError as exc:  # orjson's JSONEncodeError: a value that is not JSON
                failed.append(f"{event.TYPE!r}: {exc}")
            # each event's own lines, then those it decided: the same order however the
            # events are batched (live or in replay)
            lines += self._budget.ready()
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

    def _on_path(self, path: PathSlices, lines: list[bytes]) -> None:
        """A window's critical path: a slice per stretch on the ``critical path`` track
        (the stretches tile the windows, so they share one lane)."""
        pid = self._origin.pid if self._origin else 0
        first = path.slices[0]
        tid = self._track(pid, PATH_TRACK, first[1], first[2]).tid
        for kind, start, end in path.slices:
            slice_ = {"name": kind, "ph": "X", "cat": "critical path", "pid": pid, "tid": tid}
            slice_ |= {"ts": self._us(start), "dur": (end - start) / 1e3}
            self._budget.add(start, orjson.dumps(slice_), outline=True)

    def _marker(self, name: str, at_ns: int, scope: str = "t") -> bytes:
        """An instant event on the run process's ``iterations`` track (``scope`` "g":
        a line across every track, as a segment's start and end are)."""
        pid = self._origin.pid if self._origin else 0
        track = self._track(pid, ITERATIONS_TRACK, at_ns, at_ns)
        marker = {"name": name, "ph": "i", "s": scope, "pid": pid, "tid": track.tid}
        return orjson.dumps({**marker, "ts": self._us(at_ns)})

    def _event_lines(self, event: Event | PathSlices, lines: list[bytes]) -> None:
        """Append ``event``'s run-level trace lines to ``lines``; hand its windows'
        lines to the budget (through the formatter of its type, if it has one)."""
        formatter = _FORMATTERS.get(type(event))
        if formatter is not None:
            formatter(self, event, lines)

    def _on_iteration(self, event: IterationStarted, lines: list[bytes]) -> None:
        at = event.monotonic_ns
        self._budget.open(at, iteration=True)
        self._budget.add(at, self._marker(f"iteration {event.iteration}", at), outline=True)

    def _on_resumed(self, event: RunResumed, lines: list[bytes]) -> None:
        self._budget.open(event.monotonic_ns, iteration=False)
        lines.append(self._marker(f"segment {event.segment} resumed", event.monotonic_ns, "g"))

    def _on_finished(self, event: RunFinished, lines: list[bytes]) -> None:
        self._budget.segment_finished(event.monotonic_ns)

    def _on_weights(self, event: WeightsPublished, lines: list[bytes]) -> None:
        pid = self._origin.pid if self._origin else 0
        ts = self._us(event.start_ns)
        track = self._track(pid, WEIGHTS_TRACK, event.start_ns, event.end_ns)
        slice_ = {
            "name": f"weights v{event.version}",
            "ph": "X",
            "cat": "weights",
            "pid": pid,
            "tid": track.tid,
            "ts": ts,
            "dur": (event.end_ns - event.start_ns) / 1000.0,
            "args": {a.engine: self._us(a.acked_ns) for a in event.acks},
        }
        self._budget.add(event.start_ns, orjson.dumps(slice_), outline=True)
        for ack in event.acks:  # an arrow from the publish to each engine's load
            self._arrow_end((event.version, ack.engine), (pid, track.tid, ts), True)

    def _on_memory(self, event: MemoryReadings, lines: list[bytes]) -> None:
        ts = self._us(event.monotonic_ns)
        for r in event.readings:
            mib = {"host_rss_MiB": convert_bytes(r.host_rss_bytes, "MiB")}
            if r.device_allocated_bytes is not None:
                mib["device_allocated_MiB"] = convert_bytes(r.device_allocated_bytes, "MiB")
            if r.device_reserved_bytes is not None:
                mib["device_reserved_MiB"] = convert_bytes(r.device_reserved_bytes, "MiB")
            line = {"name": f"memory {r.worker_id}", "ph": "C", "pid": r.pid, "tid": 0}
            self._budget.add(event.monotonic_ns, orjson.dumps({**line, "ts": ts, "args": mib}))

    def _on_started(self, event: RunStarted, lines: list[bytes]) -> None:
        self._origin = event.anchor
        self._skew = ClockSkewTolerance.parse(event.config)
        try:
            self._config = ObserverConfig.parse(event.config)
        except ConfigError:
            # The run refuses such a config at its start (the timeline names the key);
            # a trace of it names tracks by engine and source only.
            self._config = None
        self._training = training_phase(self._config)
        self._budget = TraceBudget(
            TRACE_BUDGET_MB * 10**6 if self._config is None else self._config.trace_budget_bytes
        )
        self._budget.open(event.monotonic_ns, iteration=False)
        name = {"name": f"{event.run_id} ({event.anchor.hostname})"}
        process = {"name": "process_name", "ph": "M", "pid": event.anchor.pid, "args": name}
        lines.append(orjson.dumps(process))

    def _us(self, ns: int) -> float:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        return (ns - origin) / 1000.0

    def _span_lines(self, event: SpanBatch, lines: list[bytes]) -> None:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        # Onto the run, from its start: where the timeline puts them (a skewed worker's
        # by their arrival).
        offset = place_batch(event, self._origin, self._skew).shift_ns - origin
        source = event.source
        own = source.startswith(OWN_SOURCE_PREFIX)
        config, training = self._config, self._training
        for span in event.spans:
            pid = span.pid
            if pid not in self._processes and (self._origin is None or pid != self._origin.pid):
                self._processes.add(pid)
                name = f"{source} ({event.anchor.hostname}, pid {pid})"
                lines.append(
                    orjson.dumps(
                        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
                    )
                )
            track = self._track(pid, span.thread_id, span.start_ns, span.end_ns)
            engine = span.attrs.get("engine")
            if own:
                track.own = track.own or source
            else:
                phase = config.phase_of(span.name) if config is not None else None
                if phase is not None and phase == training:
                    track.trainer = True
                else:
                    role = str(engine) if engine else phase or source
                    track.roles[role] = track.roles.get(role, 0) + 1
            args = span.attrs if span.error is None else {**span.attrs, "error": span.error}
            ts = (span.start_ns + offset) / 1000.0
            line = orjson.dumps(
                {
                    "name": span.name,
                    "cat": source,
                    "ph": "X",
                    "pid": pid,
                    "tid": track.tid,
                    "ts": ts,
                    "dur": (span.end_ns - span.start_ns) / 1000.0,
                    "args": args,
                }
            )
            self._budget.add(span.start_ns + offset + origin, line, span=True)
            version = span.attrs.get("version")
            if (
                span.name == "weights.load"
                and isinstance(engine, str)
                and type(version) is int
                and version >= 0
            ):  # the end of the publish's arrow to this engine
                self._arrow_end((version, engine), (pid, track.tid, ts), False)

    def _arrow_end(
        self,
        key: tuple[int, str],
        end: tuple[int, int, float],
        send: bool,
    ) -> None:
        """One end of the arrow of weight version ``key[0]`` to engine ``key[1]``: the
        publish's (``send``) or the engine's load. The arrow is written once both ends
        arrived (in either order: a worker's load may come after the publish); a second
        load of one version by one engine draws none, nor does an end that waited while
        :data:`ARROW_MEMORY` others came."""
        waiting, other = (self._sends, self._loads) if send else (self._loads, self._sends)
        match = other.pop(key, None)
        if match is None:
            waiting.setdefault(key, end)
            if len(waiting) > ARROW_MEMORY:  # e.g. a publisher whose engines time no load
                del waiting[next(iter(waiting))]  # the end that has waited longest
            return
        start, finish = (end, match) if send else (match, end)
        self._arrows += 1
        arrow = {"name": "weights", "cat": "weights", "id": self._arrows}
        # (both ends in the window of its start: the budget keeps or drops them together)
        at = round(start[2] * 1000) + (self._origin.monotonic_ns if self._origin else 0)
        for end_line in (
            {**arrow, "ph": "s", "pid": start[0], "tid": start[1], "ts": start[2]},
            {**arrow, "ph": "f", "bp": "e", "pid": finish[0], "tid": finish[1], "ts": finish[2]},
        ):
            self._budget.add(at, orjson.dumps(end_line))

    def _track(self, pid: int, thread: int | str, start: int, end: int) -> Track:
        """The track an interval ``[start, end)`` of ``thread`` (a thread ident, or a
        marker track's name) in process ``pid`` is drawn on: the thread's, or a lane of
        it when the interval overlaps one there without nesting. A new track gets the
        process's next track id (its name is written at close)."""
        lanes = self._lanes.get((pid, thread))
        if lanes is None:
            lanes = self._lanes[(pid, thread)] = []
        number = 0  # the first lane it nests in (a loop: this runs once per span)
        while number < len(lanes) and not nest(lanes[number], start, end):
            number += 1
        if number == len(lanes):
            lanes.append([(start, end)])
        key = (pid, thread, number)
        track = self._tracks.get(key)
        if track is None:
            tid = self._last_tid[pid] = self._last_tid.get(pid, 0) + 1
            if isinstance(thread, str):  # a marker track: named by what it shows
                track = Track(tid, thread, f"lane {number}" if number else None)
            else:
                where = f"thread {thread}, lane {number}" if number else f"thread {thread}"
                track = Track(tid, None, where)
            self._tracks[key] = track
        return track

    def _tail(self) -> bytes:
        """The windows the budget still holds, and a ``trace_budget`` metadata line:
        what the trace shows of the run's windows and what it left out (each ending
        ``,\n``)."""
        pid = self._origin.pid if self._origin else 0
        lines = self._budget.finish()
        note = {"name": "trace_budget", "ph": "M", "pid": pid, "args": self._budget.note()}
        return b"".join(line + b",\n" for line in [*lines, orjson.dumps(note)])

    def _track_names(self) -> bytes:
        """A ``thread_name`` line (each ending ``,\\n``) per track, in order of first use."""
        return b"".join(
            orjson.dumps(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": track.tid,
                    "args": {"name": track.title()},
                }
            )
            + b",\n"
            for (pid, _, _), track in self._tracks.items()
        )


#: one formatter per type of what the sink writes lines for (the others write none)
_FORMATTERS: dict[type, Callable[[TraceSink, Any, list[bytes]], None]] = {
    PathSlices: TraceSink._on_path,
    SpanBatch: TraceSink._span_lines,
    IterationStarted: TraceSink._on_iteration,
    RunResumed: TraceSink._on_resumed,
    RunFinished: TraceSink._on_finished,
    WeightsPublished: TraceSink._on_weights,
    MemoryReadings: TraceSink._on_memory,
    RunStarted: TraceSink._on_started,
}
