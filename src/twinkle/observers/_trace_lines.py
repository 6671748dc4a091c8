"""What ``trace.json`` says: the Chrome/Perfetto lines of each event the trace sink
hands over (processes, tracks and their lanes, spans, markers, weight arrows, memory
counters), through the trace's size budget. No file and no thread here:
:class:`~twinkle.observers.trace.TraceSink` writes what this makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from twinkle.checks import OWN_SOURCE_PREFIX
from twinkle.errors import ConfigError
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
from twinkle.metric import convert_bytes
from twinkle.observers._config import TRACE_BUDGET_MB, ClockSkewTolerance, ObserverConfig
from twinkle.observers._trace_budget import Key, TraceBudget
from twinkle.observers._trace_tracks import (
    ARROW_MEMORY,
    ITERATIONS_TRACK,
    LANE_MEMORY,
    PATH_TRACK,
    WEIGHTS_TRACK,
    PathSlices,
    Track,
    nest,
    training_phase,
    trim,
)
from twinkle.observers.placement import place_batch
from twinkle.perf import ClockAnchor

__all__ = ["TraceLines"]

#: the first of the pids the trace gives a process whose own pid another host's process
#: has in it already (above any pid a system gives: Linux's are below 2**22)
OWN_PIDS = 10**9


class TraceLines:
    """The lines of a run's trace, made event by event in the order the events came.

    Times are microseconds since the run started, on the run's timeline (spans of other
    processes moved through their clock anchors, or a skewed worker's by their arrival,
    as the timeline places them: :mod:`~twinkle.observers.placement`). Iteration starts
    are instant events on the run process's ``iterations`` track, weight publishes
    slices on its ``weights`` track; a segment's resume (``segment 1 resumed``) an instant
    event across every track.

    **Tracks.** Every process is named (the run's by its run id, at its start; a
    worker's by its span source or its readings' worker, its host and its pid, at
    close, when a line of it was written); a process is known by its host and pid, and
    one whose pid another host's process has in the trace gets one of its own from
    :data:`OWN_PIDS` up, so that two are never drawn as one. A thread's
    track is named by the role of the spans it carries, decided over the whole run
    (names are written at close, so a thread is never named after whatever span
    happened to come first; only a track that a written line is on is named):

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
    """

    def __init__(self) -> None:
        self._origin: ClockAnchor | None = None
        self._skew = ClockSkewTolerance()  # the run's, from its run_started
        self._config: ObserverConfig | None = None  # the run's phases (None: unreadable)
        self._training: str | None = None  # the run's training phase
        #: each process's ``process_name`` line, by its pid in the trace, in order of
        #: first use (written at close when a line of the process was; the run's own
        #: process is named at its start: none here)
        self._process_names: dict[int, bytes] = {}
        #: each process's pid in the trace, by (host, pid): its own, unless a process of
        #: another host has that number in the trace already (then one from OWN_PIDS up)
        self._trace_pids: dict[tuple[str, int], int] = {}
        self._next_pid = OWN_PIDS
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

    def add(self, event: Event | PathSlices, lines: list[bytes]) -> None:
        """Append ``event``'s run-level lines to ``lines``, then the windows' lines the
        budget decided to write (the same order however the events are batched)."""
        formatter = _FORMATTERS.get(type(event))
        try:
            if formatter is not None:
                formatter(self, event, lines)
        finally:  # (a line that is not JSON raises: what was decided goes out still)
            lines += self._budget.ready()

    def _on_path(self, path: PathSlices, lines: list[bytes]) -> None:
        """A window's critical path: a slice per stretch on the ``critical path`` track
        (the stretches tile the windows, so they share one lane)."""
        pid = self._origin.pid if self._origin else 0
        first = path.slices[0]
        tid = self._track(pid, PATH_TRACK, first[1], first[2]).tid
        for kind, start, end in path.slices:
            slice_ = {"name": kind, "ph": "X", "cat": "critical path", "pid": pid, "tid": tid}
            slice_ |= {"ts": self._us(start), "dur": (end - start) / 1e3}
            self._budget.add(start, orjson.dumps(slice_), outline=True, key=(pid, tid))

    def _marker(self, name: str, at_ns: int, scope: str = "t") -> tuple[bytes, Key]:
        """An instant event on the run process's ``iterations`` track (``scope`` "g":
        a line across every track, as a segment's start and end are), and its track."""
        pid = self._origin.pid if self._origin else 0
        track = self._track(pid, ITERATIONS_TRACK, at_ns, at_ns)
        marker = {"name": name, "ph": "i", "s": scope, "pid": pid, "tid": track.tid}
        return orjson.dumps({**marker, "ts": self._us(at_ns)}), track.key

    def _on_iteration(self, event: IterationStarted, lines: list[bytes]) -> None:
        at = event.monotonic_ns
        self._budget.open(at, iteration=True)
        line, key = self._marker(f"iteration {event.iteration}", at)
        self._budget.add(at, line, outline=True, key=key)

    def _on_resumed(self, event: RunResumed, lines: list[bytes]) -> None:
        self._budget.open(event.monotonic_ns, iteration=False)
        line, key = self._marker(f"segment {event.segment} resumed", event.monotonic_ns, "g")
        lines.append(line)
        self._budget.shown.add(key)

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
        self._budget.add(event.start_ns, orjson.dumps(slice_), outline=True, key=(pid, track.tid))
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
            pid = self._trace_pid(r.hostname, r.pid, r.worker_id)
            line = {"name": f"memory {r.worker_id}", "ph": "C", "pid": pid, "tid": 0}
            data = orjson.dumps({**line, "ts": ts, "args": mib})
            self._budget.add(event.monotonic_ns, data, key=(pid, 0))

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
        self._trace_pids[(event.anchor.hostname, event.anchor.pid)] = event.anchor.pid
        self._process_names[event.anchor.pid] = b""

    def _us(self, ns: int) -> float:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        return (ns - origin) / 1000.0

    def _span_lines(self, event: SpanBatch, lines: list[bytes]) -> None:
        origin = self._origin.monotonic_ns if self._origin is not None else 0
        # Onto the run, from its start: where the timeline puts them (a skewed worker's
        # by their arrival).
        offset = place_batch(event, self._origin, self._skew).shift_ns - origin
        # (at, line, track) for the budget, a batch at a time
        spans: list[tuple[int, bytes, Key]] = []
        try:
            self._each_span(event, offset, origin, lines, spans)
        finally:  # (a span that is not JSON raises: the lines made before it go out still)
            self._budget.add_spans(spans)

    def _each_span(
        self,
        event: SpanBatch,
        offset: int,
        origin: int,
        lines: list[bytes],
        spans: list[tuple[int, bytes, Key]],
    ) -> None:
        """Each span's line into ``spans`` (a process's name into ``lines``)."""
        source, host = event.source, event.anchor.hostname
        roles = self._roles_of(source)
        pids: dict[int, int] = {}  # (the batch's: a span's pid -> its pid in the trace)
        # the last span's thread, its first lane and that lane's track
        thread: tuple[int, int] | None = None
        first_lane: list[tuple[int, int]] = []
        first_track: Track | None = None
        for span in event.spans:
            # (as drawn: since the run's start, on its timeline; a skewed worker's batches
            # are placed each by its arrival, so its lanes are told on these times)
            pid, start, end = pids.get(span.pid), span.start_ns + offset, span.end_ns + offset
            if pid is None:
                pid = pids[span.pid] = self._trace_pid(host, span.pid, source)
            # (the common case inline: after the spans on the thread's first lane)
            if (
                first_track is not None
                and thread == (pid, span.thread_id)
                and first_lane
                and start >= first_lane[-1][1]
            ):
                first_lane.append((start, end))
                if len(first_lane) > LANE_MEMORY:
                    trim(first_lane)
                track = first_track
            else:
                track = self._track(pid, span.thread_id, start, end)
                thread = (pid, span.thread_id)
                first_lane = self._lanes[thread][0]
                first_track = self._tracks[(pid, span.thread_id, 0)]
            attrs = span.attrs
            engine = attrs.get("engine")
            roles(track, span.name, engine)
            ts = start / 1000.0
            line = orjson.dumps(
                {
                    "name": span.name,
                    "cat": source,
                    "ph": "X",
                    "pid": pid,
                    "tid": track.tid,
                    "ts": ts,
                    "dur": (end - start) / 1000.0,
                    "args": attrs if span.error is None else {**attrs, "error": span.error},
                }
            )
            spans.append((start + origin, line, track.key))
            if span.name == "weights.load":
                self._load_end(engine, attrs.get("version"), (pid, track.tid, ts), spans)

    def _load_end(
        self, engine: object, version: object, end: tuple[int, int, float], spans: list[Any]
    ) -> None:
        """An engine's ``weights.load`` of a version: the end of the publish's arrow to
        it (its lines after the batch's spans so far)."""
        if isinstance(engine, str) and type(version) is int and version >= 0:
            self._budget.add_spans(spans)
            spans.clear()
            self._arrow_end((version, engine), end, False)

    def _trace_pid(self, host: str, pid: int, source: str) -> int:
        """The pid in the trace of process ``pid`` on ``host``, named after ``source``
        (a span batch's, a reading's worker) the first time it is seen: its own pid,
        unless another host's process has that number in the trace already (two
        containers' first processes, both pid 1), which would merge the two."""
        key = (host, pid)
        found = self._trace_pids.get(key)
        if found is not None:
            return found
        found = pid
        while found in self._process_names:
            found, self._next_pid = self._next_pid, self._next_pid + 1
        self._trace_pids[key] = found
        name = {"name": f"{source} ({host}, pid {pid})"}
        line = {"name": "process_name", "ph": "M", "pid": found, "args": name}
        self._process_names[found] = orjson.dumps(line)
        return found

    def _roles_of(self, source: str) -> Callable[[Track, str, object], None]:
        """What a span of ``source`` tells of its track's role (see the class doc)."""
        if source.startswith(OWN_SOURCE_PREFIX):

            def own(track: Track, name: str, engine: object) -> None:
                track.own = track.own or source

            return own
        config, training = self._config, self._training

        def role(track: Track, name: str, engine: object) -> None:
            phase = config.phase_of(name) if config is not None else None
            if phase is not None and phase == training:
                track.trainer = True
            else:
                role = str(engine) if engine else phase or source
                track.roles[role] = track.roles.get(role, 0) + 1

        return role

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
        for (pid, tid, ts), end_line in (
            (start, {**arrow, "ph": "s"}),
            (finish, {**arrow, "ph": "f", "bp": "e"}),
        ):  # (each on the track of its end: named when the line is written)
            end_line |= {"pid": pid, "tid": tid, "ts": ts}
            self._budget.add(at, orjson.dumps(end_line), key=(pid, tid))

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
                track = Track(pid, tid, thread, f"lane {number}" if number else None)
            else:
                where = f"thread {thread}, lane {number}" if number else f"thread {thread}"
                track = Track(pid, tid, None, where)
            self._tracks[key] = track
        return track

    def tail(self) -> bytes:
        """The trace's closing lines (each ending ``,\n``): the windows the budget still
        holds, a ``trace_budget`` metadata line (what the trace shows of the run's
        windows and what it left out) and the names of the processes and tracks that a
        written line is on (a ``process_name`` line per worker process, then a
        ``thread_name`` line per track, in order of first use, within the budget's last
        eighth)."""
        pid = self._origin.pid if self._origin else 0
        lines = self._budget.finish()
        shown = self._budget.shown
        pids = {key[0] for key in shown if key is not None}
        names = [line for p, line in self._process_names.items() if line and p in pids]
        names += [
            orjson.dumps(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": p,
                    "tid": track.tid,
                    "args": {"name": track.title()},
                }
            )
            for (p, _, _), track in self._tracks.items()
            if (p, track.tid) in shown
        ]
        names = self._budget.names(names)  # (first: the note counts those left out)
        note = {"name": "trace_budget", "ph": "M", "pid": pid, "args": self._budget.note()}
        return b"".join(line + b",\n" for line in [*lines, orjson.dumps(note), *names])


#: one formatter per type of what the sink writes lines for (the others write none)
_FORMATTERS: dict[type, Callable[[TraceLines, Any, list[bytes]], None]] = {
    PathSlices: TraceLines._on_path,
    SpanBatch: TraceLines._span_lines,
    IterationStarted: TraceLines._on_iteration,
    RunResumed: TraceLines._on_resumed,
    RunFinished: TraceLines._on_finished,
    WeightsPublished: TraceLines._on_weights,
    MemoryReadings: TraceLines._on_memory,
    RunStarted: TraceLines._on_started,
}
