"""The checkpoints one :class:`~twinkle.run.Run` takes: a running segment's, at an
iteration boundary every :data:`CHECKPOINT_EVERY` events (and a resumed one's as it
began), and a finished segment's, at its end (docs/metrics.md, "Resuming from a
checkpoint"); the file format and the reading back are :mod:`twinkle.run._checkpoint`'s."""

from __future__ import annotations

import copy
import logging
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from twinkle.errors import PluginError
from twinkle.events import Event, IterationStarted, RunStarted
from twinkle.observers import (
    EVENTS_FILE,
    RAW_FILE,
    TRACE_FILE,
    WEBUI_FILE,
    ClockSkewTolerance,
    EventLogSink,
    RawRecordsSink,
    TraceSink,
    WebUISink,
)
from twinkle.observers.placement import LatestTime
from twinkle.reporting import Backend, IsolatedBackend
from twinkle.run._checkpoint import Checkpoint, FileMark, mark
from twinkle.run._checkpoint import write as write_checkpoint
from twinkle.run._observer_state import observers_of, restore_observers, snapshot_observers
from twinkle.run._summary import Segment

if TYPE_CHECKING:
    from twinkle.run._run import Run

__all__ = ["CHECKPOINT_EVERY", "RunCheckpoints"]

_log = logging.getLogger("twinkle.run")

#: a running segment's checkpoint is taken at the first iteration boundary after this
#: many events since the last (docs/metrics.md, "Resuming from a checkpoint")
CHECKPOINT_EVERY = 20_000

_S = TypeVar("_S")


#: what a checkpoint keeps of the run besides its observers: its order (last boundary,
#: iteration and step) and its segments
_Standing = tuple[tuple[Any, ...], list[Segment]]


class RunCheckpoints:
    """What ``run``'s checkpoints need besides the run: the latest time its events
    reach on its clock, the events dispatched when the last one was taken, and (with
    background dispatch) how the run stood when each boundary was queued."""

    __slots__ = ("_at", "_queued", "latest", "run", "taken_at")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.taken_at = 0  # events dispatched when the last checkpoint was taken
        self.latest: LatestTime | None = None  # (of the dispatched events)
        #: (background dispatch) per boundary queued, not yet dispatched: the boundary
        #: and how the run stood then, by the boundary's id
        self._queued: dict[int, tuple[Event, _Standing]] = {}
        self._at: tuple[Event, _Standing] | None = None  # the boundary being dispatched

    @property
    def enabled(self) -> bool:
        """Whether the run leaves checkpoints: a live run's with a run directory whose
        observers are all twinkle's, its four sinks among them."""
        run = self.run
        return (
            run.context.out_dir is not None
            and not run.context.replay
            and observers_of(run.pm) is not None
            and all(
                any(isinstance(p, kind) for p in run.pm.get_plugins())
                for kind in (EventLogSink, RawRecordsSink, WebUISink, TraceSink)
            )
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """The latest time, the observers' failures and their states as ``checkpoint``
        left them (the run takes back its segments and order)."""
        run = self.run
        state = checkpoint.state()
        started = run.segments[0].start
        latest = LatestTime(started.anchor, ClockSkewTolerance.parse(started.config))
        latest.ns, latest.wall_ns = checkpoint.scan["last_ns"], checkpoint.scan["last_wall_ns"]
        self.latest = latest
        assert run.calls is not None
        run.calls.failures.update(state["failures"])
        failed = restore_observers(
            run.pm, state["observers"], run.context, leaving=run.calls.left_out, calls=run.calls
        )
        for name, exc in failed.items():
            why = (
                f"its twinkle_restore_state raised {type(exc).__name__}: {exc} (it cannot "
                "go on from the run's checkpoint)"
            )
            if run.calls.essential(name):  # (a required plugin: the start fails)
                raise PluginError(f"required plugin {name!r}: {why}") from exc
            run.calls.leave_out(name, why)

    def hand_history(self, backends: list[Backend]) -> None:
        """A resume from a checkpoint: every plugin's backend gets first the records
        the checkpoint stands for, read back from the record file the run's own sink
        set up for them (the checkpoint's lines, as this segment writes them: its
        observers are fed only the log's tail), so that it gets every record of the
        run, in order, as a resume feeding the whole log hands it. A run that writes no
        files (a follower's copy) has no history to hand."""
        if self.run.context.out_dir is None:
            return
        head = self._sink(RawRecordsSink).head()
        if head is None or head[1] == 0:
            return
        path, lines = head
        size = path.stat().st_size  # (no record of this segment's is written yet)
        for backend in backends:
            if isinstance(backend, IsolatedBackend):
                backend.write_history(path, size, lines)

    def seen(self, event: Event) -> None:
        """Note the latest time the run's events reach (from its run_started on)."""
        if type(event) is IterationStarted and self._queued:
            self._at = self._queued.pop(id(event), None)
        latest = self.latest
        if latest is None:
            if type(event) is not RunStarted:
                return
            tolerance = ClockSkewTolerance.parse(event.config)
            latest = self.latest = LatestTime(event.anchor, tolerance)
        latest.note(event)

    def arm(self) -> None:
        """From now on (once a resume fed the logged events again), take a running
        segment's checkpoints (:meth:`settled`)."""
        dispatcher = self.run.dispatcher
        if dispatcher is not None and self.enabled:
            self.taken_at = dispatcher.events
            dispatcher.settled = self.settled

    def take_resumed(self) -> None:
        """(Inline, the order's lock held) a resumed segment's checkpoint, as soon as it
        began: its resume may have changed files the checkpoint it came from marks (a
        new ``total_steps`` re-plans ``metrics.jsonl``; a killed process's temporary
        trace is removed), so a kill before the segment's first boundary checkpoint
        would leave none that fits them, and the next resume would read the whole log."""
        dispatcher = self.run.dispatcher
        if dispatcher is not None and self.enabled and dispatcher.idle:
            self._try_running(None, "as its segment began")

    @property
    def armed(self) -> bool:
        dispatcher = self.run.dispatcher
        return dispatcher is not None and dispatcher.settled is not None

    def queued(self, boundary: IterationStarted) -> None:
        """(Background dispatch, the order's lock held, armed) ``boundary`` is queued for
        the dispatch thread: how the run stands now (its order and segments, which the
        publishers move on before the boundary is dispatched) is what a checkpoint
        taken at it keeps."""
        self._queued[id(boundary)] = (boundary, self._standing())

    def forget(self, event: Event) -> None:
        """``event`` was not queued after all: no note of it is kept."""
        self._queued.pop(id(event), None)

    def _standing(self) -> _Standing:
        order = self.run.order
        at = (order.last_boundary, order.last_iteration, order.last_step)
        return at, [copy.copy(segment) for segment in self.run.segments]

    # -- a running segment's ------------------------------------------------------------

    def settled(self, event: Event) -> None:
        """After an iteration's boundary (dispatched, with what its hooks published), a
        checkpoint of the running segment once :data:`CHECKPOINT_EVERY` events went by
        since the last: a segment killed outright resumes from it. Inline, taken holding
        the order's lock with nothing left to dispatch; on the dispatch thread, with the
        order and segments noted when the boundary was queued (:meth:`queued`): either
        way the state, the order and the files are all at the same event."""
        dispatcher = self.run.dispatcher
        if type(event) is not IterationStarted or dispatcher is None:
            return
        at, self._at = self._at, None
        if dispatcher.events - self.taken_at < CHECKPOINT_EVERY:
            return
        when = f"at iteration {getattr(event, 'iteration', '?')}"
        if dispatcher.background:
            # On the dispatch thread, which a publisher holding the order's lock may
            # wait for: the run as it stood when the boundary was queued (None: an
            # observer published it, nothing was noted).
            if at is not None and at[0] is event:
                self.taken_at = dispatcher.events
                self._try_running(at[1], when)
            return
        with self.run.order.lock:
            if dispatcher.idle:
                self.taken_at = dispatcher.events
                self._try_running(None, when)

    def _try_running(self, standing: _Standing | None, when: str) -> None:
        """:meth:`_take_running` of the run as it ``standing`` (None: as it stands now),
        or a warning saying why no checkpoint was taken ``when``: a checkpoint is never
        worth the run."""
        try:
            self._take_running(self._standing() if standing is None else standing)
        except Exception as exc:
            _log.warning(
                "run %r: no checkpoint %s (%s); a resume re-reads the log since the last one",
                self.run.run_id,
                when,
                exc,
            )

    def _take_running(self, standing: _Standing) -> None:
        """Write the running segment's checkpoint, the run as it ``standing``, unless a
        write failed (its error is the run's to report) or left lines in memory."""
        run = self.run
        out = run.context.out_dir
        assert out is not None and run.reporter is not None
        logged = self._sink(EventLogSink).sync_point()
        if logged is None or not run.reporter.wait_delivered():
            return
        raw, webui = self._sink(RawRecordsSink).head(), self._sink(WebUISink).head()
        trace = self._sink(TraceSink).head()
        if trace is None or raw is None or webui is None:
            return
        payload = self._state(closing=False, standing=standing)
        log = out / EVENTS_FILE
        files = {EVENTS_FILE: mark(log, log.stat().st_size, logged)}
        for name, (path, lines) in ((RAW_FILE, raw), (WEBUI_FILE, webui)):
            files[name] = mark(path, path.stat().st_size, lines)
        files[TRACE_FILE] = mark(trace[0], trace[1], 0)
        write_checkpoint(out, self._made(logged, files, payload, standing))

    # -- a finished segment's -----------------------------------------------------------

    def snapshot(self) -> tuple[bytes, int, int] | None:
        """The state for the finished segment's checkpoint (the observers saw every
        event, the outputs are still open), the trace's bytes before its tail and the
        events logged; None when the run leaves no checkpoints, a write failed, or
        taking it failed (logged: the run goes on)."""
        if not self.enabled:
            return None
        try:
            with self.run.order.lock:  # (no event checked meanwhile)
                logged = self._sink(EventLogSink).sync_point()
                trace = self._sink(TraceSink).head()
                if logged is None or trace is None:
                    return None  # (the failed write is the run's to report)
                return self._state(closing=True, standing=self._standing()), trace[1], logged
        except Exception as exc:  # (whatever pickling raises)
            _log.warning(
                "run %r: no checkpoint taken (%s); a resume re-reads the log",
                self.run.run_id,
                exc,
            )
            return None

    def write(self, snapshot: tuple[bytes, int, int]) -> None:
        """The checkpoint of the segment that just finished and closed: its
        ``snapshot``, and where the log, the record files and the trace (its part before
        the tail) stand. None is written when events went by after the snapshot (the
        state lacks them); one that cannot be written is logged and left out: a resume
        then feeds the whole log again."""
        out = self.run.context.out_dir
        assert out is not None
        payload, trace, logged = snapshot
        log = self._sink(EventLogSink)
        if log.logged != logged:
            return
        try:
            files = {
                EVENTS_FILE: mark(out / EVENTS_FILE, (out / EVENTS_FILE).stat().st_size, logged)
            }
            for name in (RAW_FILE, WEBUI_FILE):
                path = out / name
                files[name] = mark(path, path.stat().st_size, _count_lines(path))
            files[TRACE_FILE] = mark(out / TRACE_FILE, trace, 0)
            write_checkpoint(out, self._made(logged, files, payload, self._standing()))
        except Exception as exc:  # (a checkpoint is never worth the run: any failure)
            _log.warning(
                "run %r: no checkpoint written (%s); a resume re-reads the log",
                self.run.run_id,
                exc,
            )

    # -- both -------------------------------------------------------------------------

    def _state(self, *, closing: bool, standing: _Standing) -> bytes:
        """The run's state, pickled: its segments and order (as ``standing``), the
        observers' failures, and each observer's state (``closing``: the segment's
        outputs close next, and the WebUI file's open lines go into the file, not into
        the state)."""
        run = self.run
        assert run.calls is not None
        observers = snapshot_observers(run.pm, leaving=run.calls.left_out, calls=run.calls)
        if closing:
            for name, plugin in run.pm.list_name_plugin():
                if isinstance(plugin, WebUISink):
                    observers[name] = {**observers[name], "open": {}}
        order, segments = standing
        state: dict[str, Any] = {
            "segments": segments,
            "order": order,
            "failures": dict(run.calls.failures),
            "observers": observers,
        }
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def _made(
        self, events: int, files: dict[str, FileMark], payload: bytes, standing: _Standing
    ) -> Checkpoint:
        run, latest = self.run, self.latest
        assert latest is not None
        (_, last_iteration, last_step), segments = standing
        scan = {
            "segments": len(segments),
            "last_ns": latest.ns,
            "last_wall_ns": latest.wall_ns,
            "last_iteration": last_iteration,
            "optimizer_steps": last_step,
        }
        names = observers_of(run.pm, leaving=() if run.calls is None else run.calls.left_out)
        assert names is not None
        return Checkpoint(run.run_id, events, files, scan, names, payload)

    def _sink(self, kind: type[_S]) -> _S:
        return next(p for p in self.run.pm.get_plugins() if isinstance(p, kind))


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
