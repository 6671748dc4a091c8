"""``Run``: the observer runtime of one run, shared by a live session and a replay.

A run owns its plugin manager (fixed for the run), the hook calls and the dispatcher
(complete when built), the reporter, the observers' shared state (the run's timeline,
in :attr:`RunContext.stash`) and the outputs (``runs/<run_id>/``, the summary last).
:class:`~twinkle.run.RunSession` feeds it a live bus; :func:`~twinkle.run.replay` feeds
it a log. The lifecycle of the events is checked here, once, for both
(:class:`~twinkle.run._order.EventOrder`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast, final

import pluggy

from twinkle.errors import (
    PluginError,
    RecordError,
    ReporterError,
    TwinkleError,
)
from twinkle.events import (
    BackendsClosed,
    Event,
    EventBus,
    IterationStarted,
    RunFinished,
    freeze,
)
from twinkle.hookspecs import RunContext
from twinkle.observers import (
    EventLogSink,
)
from twinkle.plugins import (
    DEFAULT_SLOW_CALL_S,
    Dispatcher,
    HookCalls,
    ObserverManager,
)
from twinkle.reporting import (
    DEFAULT_BACKEND_TIMEOUT_S,
    BackendHealth,
    MetricsReporter,
    check_backend_timeout,
    make_dirs,
)
from twinkle.run._checkpoint import (
    Checkpoint,
)
from twinkle.run._checkpointing import RunCheckpoints
from twinkle.run._config import check_config
from twinkle.run._order import ORDERED, EventOrder
from twinkle.run._run_backends import (
    make_reporter,
    plugin_backends,
    required_plugins_of,
    wait_required,
)
from twinkle.run._summary import (
    SUMMARY_FILE,
    Segment,
    build_summary,
    write_summary,
)

__all__ = ["Run", "RunState"]

_log = logging.getLogger("twinkle.run")


class RunState(enum.Enum):
    """Where a run is: NEW → RUNNING → FINISHED; FAILED when starting failed or the run
    was closed without finishing."""

    NEW = "new"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@final
class Run:
    """One run's observers and outputs. :meth:`start`, :meth:`submit` events (or
    :meth:`connect` a bus), :meth:`go_live` once the run's first events (or a resume's
    feed of its log) went by, then :meth:`finish` with the ``run_finished`` event.

    :param pm: a manager from :func:`~twinkle.plugins.make_plugin_manager`; its plugin
        set is fixed from :meth:`start` until the run is closed.
    :param context: the run's id, output directory (``None``: no files), configuration
        and whether the events come from a log.
    :param background: write records on a background thread.
    :param background_dispatch: run the observers on one dispatch thread instead of the
        publishing threads from :meth:`go_live` on (inline until then:
        :class:`~twinkle.plugins.Dispatcher`).
    :param required_plugins: plugins the run cannot go without: one that cannot set up
        fails the start (any other is left out, and the run goes on).
    :param backend_timeout_s: how long one call of a plugin's record backend may take
        before the backend is cut off (:class:`~twinkle.reporting.IsolatedBackend`).
    """

    __slots__ = (
        "_backend_timeout_s",
        "_background",
        "_background_dispatch",
        "_closed",
        "_order",
        "_receivers",
        "_required",
        "_sealed",
        "_slow_call_s",
        "calls",
        "checkpoints",
        "context",
        "dispatcher",
        "pm",
        "reporter",
        "segments",
        "state",
    )

    def __init__(
        self,
        pm: pluggy.PluginManager,
        context: RunContext,
        *,
        background: bool,
        background_dispatch: bool = False,
        slow_call_s: float | None = DEFAULT_SLOW_CALL_S,
        required_plugins: Iterable[str] = (),
        backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
    ) -> None:
        if not isinstance(pm, ObserverManager):
            raise PluginError(
                f"plugin_manager must come from twinkle.plugins.make_plugin_manager(), got "
                f"{type(pm).__qualname__}: twinkle's manager keeps the observers fixed while "
                "a run uses them; pass plugins=[(name, plugin)] to add your own"
            )
        logged = check_config(context.config, pm)
        self.pm = pm
        # Every observer configures from the config as the log carries it, read-only.
        self.context = dataclasses.replace(context, config=freeze(logged))
        self._background = background
        self._background_dispatch = background_dispatch
        self._slow_call_s = slow_call_s
        self._required = required_plugins_of(required_plugins, pm)
        self._backend_timeout_s = check_backend_timeout(backend_timeout_s)
        self.state = RunState.NEW
        self.calls: HookCalls | None = None
        self.dispatcher: Dispatcher | None = None
        self.reporter: MetricsReporter | None = None
        #: each segment: its start (run_started, then every run_resumed), its finish and
        #: what its backends did
        self.segments: list[Segment] = []
        self._order = EventOrder()
        self._receivers: list[EventBus] = []
        self._closed = False
        #: this process's run_finished was queued: a connected bus's events are refused
        self._sealed = False
        #: the checkpoints it takes (docs/metrics.md, "Resuming from a checkpoint")
        self.checkpoints = RunCheckpoints(self)

    @property
    def started(self) -> bool:
        """Whether ``run_started`` went by."""
        return bool(self.segments)

    @property
    def finished(self) -> RunFinished | None:
        """The ``run_finished`` of the current segment; None while it runs."""
        return self.segments[-1].finish if self.segments else None

    @property
    def run_id(self) -> str:
        return self.context.run_id

    def start(self) -> None:
        """Fix the plugin set, configure the observers, open the reporter's backends."""
        if self.state is not RunState.NEW:
            raise TwinkleError(f"run {self.run_id!r} was already started ({self.state.value})")
        self.pm.acquire(self.run_id)
        self.state = RunState.RUNNING
        try:
            if self.context.out_dir is not None:
                make_dirs(self.context.out_dir)
            self.calls = calls = HookCalls(
                self.pm,
                slow_call_s=self._slow_call_s,
                required=self._required,
                hook_timeout_s=self._backend_timeout_s,
            )
            calls.configure(self.context)
            if self.context.checkpoint is not None:
                self._restore(self.context.checkpoint)
            made = calls.make_backends(self.context)
            names, backends = plugin_backends(self.pm, made, self._backend_timeout_s)
            self.reporter = make_reporter(names, backends, self.run_id, self._background)
            wait_required(backends, self._required, self._backend_timeout_s)
            if self.context.checkpoint is not None:  # (once the start cannot fail)
                self.checkpoints.hand_history(backends)
            # Inline until the run goes live (:meth:`go_live`): the start, and a resume's
            # feeding of the log, are dispatched before start() returns.
            self.dispatcher = Dispatcher(calls, self.reporter.report)
            if self.checkpoints.enabled:
                self.dispatcher.seen = self.checkpoints.seen
        except BaseException:
            self.state = RunState.FAILED
            self.close()
            raise

    def restore_order(self, order: tuple[Any, ...]) -> None:
        """The order checks' state as a checkpoint left it."""
        self._order.restore(order)

    @property
    def order(self) -> EventOrder:
        """The order the run's events keep (its checkpoints take it, under its lock)."""
        return self._order

    def _restore(self, checkpoint: Checkpoint) -> None:
        """The run as the checkpoint left it: its segments and order, then the rest
        (:meth:`RunCheckpoints.restore`)."""
        state = checkpoint.state()
        self.segments = state["segments"]
        self.restore_order(state["order"])
        self.checkpoints.restore(checkpoint)

    def go_live(self, timed: Callable[[str], AbstractContextManager[object]] | None) -> None:
        """Once the start (or a resume's feeding of the log) went by: take a running
        segment's checkpoints from now on (:meth:`RunCheckpoints.arm`; a resumed one's
        first at once, :meth:`RunCheckpoints.take_resumed`), and dispatch on
        the dispatch thread when the run was made with ``background_dispatch``, each
        batch of it one span of twinkle's own time (``timed``: the bus's)."""
        if self.dispatcher is None:
            raise TwinkleError(f"run {self.run_id!r} is not started")
        with self._order.lock:  # (no ordered event queued meanwhile)
            if len(self.segments) > 1:  # (resumed: its run_resumed dispatched, inline)
                self.checkpoints.take_resumed()
            if self._background_dispatch:
                self.dispatcher.to_background(timed)
            self.checkpoints.arm()

    def settled_slow_calls(self) -> tuple[dict[str, int] | None, BaseException | None]:
        """The observers' slow calls once every event submitted so far was dispatched
        (what ``run_finished`` says), and the Ctrl-C (or error) that cut that wait short:
        the run finishes with the counts so far, then raises it."""
        interrupted: BaseException | None = None
        try:
            if self.dispatcher is not None:
                self.dispatcher.flush()
        except BaseException as exc:
            interrupted = exc
        return (None if self.calls is None else dict(self.calls.slow)), interrupted

    def close_backends(self) -> dict[str, BackendHealth]:
        """Once ``run_finished`` went by: hand every record to the backends, close the
        plugins' (each within its bound) and say what every backend did with its records
        (what the session publishes as ``backends_closed``)."""
        if self.reporter is None:
            return {}
        if self.dispatcher is not None:
            self.dispatcher.flush()  # (every record of run_finished is reported)
        self.reporter.close_isolated()
        return self.reporter.health()

    def cut_off_backends(self, why: str) -> dict[str, BackendHealth]:
        """Give up on the plugins' backends still open (``why``: what stopped the wait)
        and say what every backend did: :meth:`close_backends` when it was interrupted."""
        if self.reporter is None:
            return {}
        self.reporter.cut_off_isolated(why)
        return self.reporter.health()

    def connect(self, bus: EventBus) -> None:
        """Receive every event ``bus`` publishes (the bus calls :meth:`_receive` directly,
        before its signal's receivers)."""
        if self.dispatcher is None:
            raise TwinkleError(f"run {self.run_id!r} is not started")
        bus.bind(self._receive, many=self._receive_all)
        self._receivers.append(bus)

    def submit(self, event: Event) -> None:
        """Dispatch ``event`` to the observers, after checking it fits the run: its
        ``run_id``; ``run_started`` once and first; ``run_finished`` once per segment
        (events after it — published by an observer while the run finished — still go
        out), then only ``run_resumed`` begins a new segment; iterations and optimizer
        steps only go forward; boundaries never go back in time. A misfit raises
        :class:`~twinkle.errors.RecordError` and reaches no observer. (How a resume or
        a replay feeds the log's events; a connected bus delivers to :meth:`_receive`.)"""
        self._submit(event, live=False)

    def _receive(self, event: Event) -> None:
        """What a connected bus delivers: :meth:`submit`, but once this process's
        ``run_finished`` was queued, only an observer's publish (from inside a dispatch)
        and the session's ``backends_closed`` are taken: another thread's event would
        reach the observers while the summary is made and the backends close, its
        records in the files but not in the summary nor in a backend that had closed."""
        self._submit(event, live=True)

    def _receive_all(self, events: Sequence[Event]) -> None:
        """What a connected bus delivers of :meth:`~twinkle.events.EventBus.publish_all`
        (a worker's report): every event queued in one step, or none (a report half in
        the log when the run began to finish between its spans and its readings)."""
        dispatcher = self._dispatcher_for(events)
        if (
            dispatcher.dispatching_here
            or not self.segments
            or any(type(e) in ORDERED for e in events)
        ):
            for event in events:
                self._submit(event, live=True)
            return
        with self._order.lock:
            if self._sealed:
                self._refuse_sealed(events[0])
            drain = False
            for event in events:
                drain = dispatcher.enqueue(event) or drain
        if drain:
            dispatcher.drain()

    def _dispatcher_for(self, events: Sequence[Event]) -> Dispatcher:
        """The dispatcher, once ``events`` were found to be the running run's."""
        dispatcher = self.dispatcher
        if dispatcher is None or self.state is not RunState.RUNNING:
            raise TwinkleError(
                f"run {self.run_id!r} is not running ({self.state.value}): publish between "
                "its start() and its finish()"
            )
        for event in events:
            if event.run_id != self.context.run_id:
                raise RecordError(
                    f"event {event.TYPE!r} belongs to run {event.run_id!r}, not {self.run_id!r}"
                )
        return dispatcher

    def _refuse_sealed(self, event: Event) -> None:
        """(The order's lock held, the run sealed) refuse a live event: this process's
        run_finished was queued (but the session's backends_closed)."""
        if type(event) is not BackendsClosed:
            raise TwinkleError(
                f"run {self.run_id!r} is finishing: event {event.TYPE!r} came from "
                "another thread after its run_finished and reaches no observer; "
                "publish before finish()"
            )

    def _submit(self, event: Event, *, live: bool) -> None:
        dispatcher = self._dispatcher_for((event,))
        kind = type(event)
        if dispatcher.dispatching_here:
            # An observer publishing from inside a dispatch: no lock (on the dispatch
            # thread, a publisher may hold it while it waits for that very thread).
            if kind in ORDERED or not self.segments:
                self._order.check(event, self.segments, self.run_id)
            dispatcher.submit(event)
            return
        if kind is IterationStarted:
            dispatcher.wait_boundary()  # (never waiting while holding the lock)
        # Checked and queued in one step: the order checked is the order dispatched
        # (and logged), whichever threads publish.
        with self._order.lock:
            if live and self._sealed:
                self._refuse_sealed(event)
            if kind in ORDERED or not self.segments:
                drain = self._enqueue_checked(event, dispatcher)
                self._sealed = self._sealed or (live and kind is RunFinished)
            else:
                drain = dispatcher.enqueue(event)
        if drain:  # (inline: outside the lock, which a running checkpoint takes)
            dispatcher.drain()

    def _enqueue_checked(self, event: Event, dispatcher: Dispatcher) -> bool:
        """(The order's lock held) check ``event`` and queue it; one that cannot be
        queued (refused, or a Ctrl-C while it waited for room) leaves the order as it
        was: it is not the run's. True when the caller must then drain the queue."""
        mark = self._order.mark(self.segments)
        self._order.check(event, self.segments, self.run_id)
        boundary = type(event) is IterationStarted and dispatcher.background
        try:
            if boundary and self.checkpoints.armed:
                # what a checkpoint taken at it keeps of the run, before the
                # publishers move it on
                self.checkpoints.queued(cast(IterationStarted, event))
            drain = dispatcher.enqueue(event)
        except BaseException:
            self._order.roll_back(mark, self.segments)
            self.checkpoints.forget(event)
            raise
        return drain

    def finish(self) -> dict[str, Any]:
        """Close the run (after ``run_finished`` was submitted), then write
        ``summary.json``: the observers' parts are taken while they still run, the
        failures once every output is closed (a sink failing to close its file is in the
        summary). The summary is written last, once every output is closed and synced
        (so it never vouches for records that are not on disk), and durably (synced,
        then renamed into place); when closing raised, it is still written, with status
        ``error`` naming what failed, then that error is raised."""
        try:
            if self.finished is None or self.calls is None:
                raise TwinkleError(f"run {self.run_id!r} has not seen run_finished")
            if self.dispatcher is not None:
                self.dispatcher.flush()  # every observer has seen run_finished
            summary = build_summary(self.finished, self.calls, self.segments)
            snapshot = self.checkpoints.snapshot()
            self.state = RunState.FINISHED
        except BaseException:
            self.close()
            raise
        calls = self.calls
        log_failure: ReporterError | None = None
        try:
            try:
                self.close()
            finally:  # (the log's own failure is named also when another output's is raised)
                log_failure = _event_log_failure(self.pm)
            if log_failure is not None:
                raise log_failure
        except BaseException as exc:
            snapshot = None  # (outputs that did not close are no state to resume from)
            # Records or the log may not be durable: the summary must not say "ok".
            summary["status"] = "error"
            closing = f"closing the run's outputs failed: {type(exc).__name__}: {exc}"
            if log_failure is not None and exc is not log_failure:
                closing = f"{log_failure}; {closing}"
            summary["error"] = closing if not summary["error"] else f"{summary['error']}; {closing}"
            raise
        finally:
            summary["observer_failures"] = dict(sorted(calls.failures.items()))
            out = self.context.out_dir
            if out is not None:
                write_summary(out / SUMMARY_FILE, summary)
        if snapshot is not None:
            self.checkpoints.write(snapshot)
        return summary

    def close(self) -> None:
        """Flush and close the reporter, let every plugin close its files, free the
        plugin manager; a run still running is FAILED (it never finished). Idempotent;
        raises the reporter's error after closing everything."""
        if self.state is RunState.RUNNING:
            self.state = RunState.FAILED
        for bus in self._receivers:
            bus.bind(None)
        self._receivers.clear()
        if self._closed or self.state is RunState.NEW:
            return  # closed already, or never started
        self._closed = True
        calls = self.calls
        try:
            try:
                if self.dispatcher is not None:
                    self.dispatcher.close()  # the observers see every event submitted
            finally:
                if self.reporter is not None:
                    self.reporter.close()
        finally:
            try:
                if calls is not None:
                    calls.call("twinkle_unconfigure", context=self.context)
                    calls.close()
            finally:
                self.pm.release()  # also when the start failed before configuring


def _event_log_failure(pm: pluggy.PluginManager) -> ReporterError | None:
    """Why the run's event log is not (or was not for a while) what the run wrote
    (deleted, replaced or truncated while it ran, or its last lines never written:
    :attr:`EventLogSink.failure`). The log is the run: such a run never finishes ``ok``,
    even when its log was written back."""
    for plugin in pm.get_plugins():
        if isinstance(plugin, EventLogSink) and plugin.failure is not None:
            return plugin.failure
    return None
