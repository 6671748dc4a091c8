"""Calling the observers: every hook implementation in isolation, events in order.

:class:`HookCalls` plans each hook's implementations once, from a manager whose plugin
set is fixed for the run (:class:`~twinkle.plugins.ObserverManager`), so it is complete
when built. :class:`Dispatcher` delivers the events a run submits to their hooks, inline
or on one dispatch thread, and hands the observers' records to the run's reporter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import pluggy

from twinkle.checks import check_seconds
from twinkle.errors import InvalidArgumentError, TwinkleError, WriteError
from twinkle.events import EVENT_TYPES, Event
from twinkle.plugins._manager import ObserverManager
from twinkle.reporting import BatchWriter, MetricRecord

__all__ = [
    "DEFAULT_SLOW_CALL_S",
    "HOOK_FOR_EVENT",
    "REPORTER_FAILURES",
    "Dispatcher",
    "HookCalls",
    "check_slow_call_s",
    "hook_name",
    "merge_summary",
]

log = logging.getLogger("twinkle.plugins")
_get_ident = threading.get_ident

#: default of ``HookCalls(slow_call_s=...)``: an observer call taking longer is slow
DEFAULT_SLOW_CALL_S: Final = 1.0


def check_slow_call_s(slow_call_s: object) -> float | None:
    """``slow_call_s`` (as a float) if it is a finite number of seconds >= 0 or None
    (observer calls not timed), else an :class:`InvalidArgumentError` saying so (the
    session checks its option when it is made, not when the run starts)."""
    return check_seconds(
        "slow_call_s",
        slow_call_s,
        none_ok=True,
        means="the time an observer call may take before it is counted slow",
        none_means="to not time observer calls",
    )


#: key of :attr:`HookCalls.failures` (``summary.json`` → ``observer_failures``) counting
#: records the run's reporter could not write at once (a disk fault; they are kept)
REPORTER_FAILURES = "twinkle.reporter"


def hook_name(event_type: type[Event]) -> str:
    """The hook an event type is delivered to: ``twinkle_<TYPE>``."""
    return f"twinkle_{event_type.TYPE}"


HOOK_FOR_EVENT: dict[type[Event], str] = {cls: hook_name(cls) for cls in EVENT_TYPES.values()}
"""The hook of every event type (derived from the type: :func:`hook_name`)."""


class _Never(Exception):
    """Raised by nothing: the default of the failures a hook call lets through."""


# (plugin name, function, argument names) of one hook implementation
_Impl = tuple[str, Callable[..., Any], tuple[str, ...]]


class HookCalls:
    """Calls hooks on every observer of ``pm``, each in isolation.

    The implementations of every hook are looked up once, here, in pluggy's call order
    (last registered first, ``tryfirst``/``trylast`` respected): ``pm`` must keep its
    plugin set while this object is used (an :class:`ObserverManager` in use by a run
    refuses changes). Hook-call monitors of ``pm`` see each hook call (its
    implementations, its arguments, and a :class:`pluggy.Result` of the list of results).

    Failure policy: an observer raising is logged with its name, counted in
    :attr:`failures` and skipped; every other observer still runs. That holds for any
    ``BaseException`` on any thread but the main one — ``SystemExit`` and
    ``KeyboardInterrupt`` included: an observer must not end the dispatch thread nor a
    publisher's. On the main thread ``KeyboardInterrupt`` and ``SystemExit`` are counted,
    then re-raised: Python runs signal handlers (the user's Ctrl-C, a SIGTERM handler
    calling ``sys.exit``) on the main thread, in whatever frame it is running — often an
    observer — and swallowing them would keep a preempted job training.

    Slow observers: each observer call is timed with ``clock`` (integer ns); one taking
    longer than ``slow_call_s`` seconds (default :data:`DEFAULT_SLOW_CALL_S`) is counted
    in :attr:`slow` and logged with the hook and its duration (the 1st, 2nd, 4th...
    time per observer). It is not interrupted: a hook runs to its end. ``None`` turns
    the timing off. The cost is one clock read per observer call (the end of one call
    is the start of the next), none with ``None``.
    """

    __slots__ = (
        "_clock",
        "_plans",
        "_pm",
        "_required",
        "_slow_ns",
        "failures",
        "left_out",
        "slow",
        "slow_call_s",
    )

    def __init__(
        self,
        pm: ObserverManager,
        *,
        slow_call_s: float | None = DEFAULT_SLOW_CALL_S,
        clock: Callable[[], int] = time.perf_counter_ns,
        required: Iterable[str] = (),
    ) -> None:
        check_slow_call_s(slow_call_s)
        if not callable(clock):
            raise InvalidArgumentError(
                f"clock={clock!r} must be a callable returning integer nanoseconds"
            )
        self._pm = pm
        self._plans: dict[str, list[_Impl]] = {
            name: [
                (impl.plugin_name, impl.function, tuple(impl.argnames))
                for impl in reversed(caller.get_hookimpls())
            ]
            for name, caller in vars(pm.hook).items()
            if isinstance(caller, pluggy.HookCaller)
        }
        self.slow_call_s = slow_call_s
        self._slow_ns = None if slow_call_s is None else round(slow_call_s * 1e9)
        self._clock = clock
        #: failures per plugin name (logged as they happen)
        self.failures: Counter[str] = Counter()
        #: observer calls over ``slow_call_s`` per plugin name (logged as they happen)
        self.slow: Counter[str] = Counter()
        self._required = frozenset(required)
        #: plugins left out of the run because they could not set up, with why
        self.left_out: dict[str, str] = {}

    def call(self, hook: str, **kwargs: Any) -> list[Any]:
        """Call ``hook`` on every observer; the non-None results."""
        return [result for _, result in self._calls(hook, kwargs)]

    @property
    def monitored(self) -> bool:
        """Whether hook-call monitors are installed (they see every hook call)."""
        return self._pm.monitored

    def plan(self, hook: str) -> list[_Impl]:
        """The implementations of ``hook``, in call order (empty: nobody implements it)."""
        return self._plans.get(hook, [])

    def configure(self, context: object) -> None:
        """Call ``twinkle_configure``: like :meth:`call`, except that an observer raising
        :class:`~twinkle.errors.TwinkleError` (it cannot run as configured: a missing
        dependency, a bad setting) fails the run's start with that error when it is
        essential (:meth:`essential`); any other such plugin is left out
        (:meth:`leave_out`)."""
        self._calls("twinkle_configure", {"context": context}, TwinkleError)

    def make_backends(self, context: object) -> list[tuple[str, Any]]:
        """Call ``twinkle_make_backends``: the backends every observer provides, each
        with its plugin's name; a :class:`~twinkle.errors.TwinkleError` (a backend's file
        cannot be opened) is handled as in :meth:`configure`."""
        calls = self._calls("twinkle_make_backends", {"context": context}, TwinkleError)
        return [(name, backend) for name, result in calls for backend in result]

    def essential(self, name: str) -> bool:
        """Whether the run cannot go on without plugin ``name``: one of twinkle's own
        observers (its outputs are the run's), or one the caller requires."""
        return name in self._required or self._pm.is_builtin(name)

    def leave_out(self, name: str, why: str) -> None:
        """Call none of plugin ``name``'s hooks from now on; ``why`` is kept in
        :attr:`left_out` and logged (a plugin that could not set up: the run goes on
        without it)."""
        if name in self.left_out:
            return
        self.left_out[name] = why
        # New lists: a hook call iterating the old plan goes on undisturbed.
        self._plans = {
            hook: [impl for impl in plan if impl[0] != name] for hook, plan in self._plans.items()
        }
        log.error(
            "plugin %r left out of the run: %s (the run goes on without it; to stop "
            "instead, require it: RunSession(required_plugins=[%r]), TwinkleCallback(..., "
            "required_plugins=[%r]) or twinkle demo --require-plugin %s)",
            name,
            why,
            name,
            name,
            name,
        )

    def call_named(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Like :meth:`call`, with each result paired with its plugin's name."""
        return self._calls(hook, kwargs)

    def implementers(self, hook: str) -> list[str]:
        """The plugins implementing ``hook``, in call order."""
        return [name for name, _, _ in self._plans.get(hook, ())]

    def count(self, name: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Count a failure of ``name``; log the 1st, 2nd, 4th, 8th... (a lasting fault
        does not flood the log), with the traceback being handled when ``exc_info``."""
        self.failures[name] += 1
        n = self.failures[name]
        if n & (n - 1) == 0:
            log.error(f"observer %r {message} (failure %d)", name, *args, n, exc_info=exc_info)

    def _calls(
        self, hook: str, kwargs: dict[str, Any], fatal: type[Exception] = _Never
    ) -> list[tuple[str, Any]]:
        if self._pm.monitored:
            return self._monitored(hook, kwargs, fatal)
        plan = self._plans.get(hook)
        return self._plain(hook, plan, kwargs, fatal) if plan else []

    def count_slow(self, name: str, hook: str, duration_ns: int) -> None:
        """Count a call of ``name`` over the budget; logged like :meth:`count`."""
        self.slow[name] += 1
        n = self.slow[name]
        if n & (n - 1) == 0:
            log.warning(
                "observer %r took %.3f s in %s, over slow_call_s=%s (slow call %d)",
                name,
                duration_ns / 1e9,
                hook,
                self.slow_call_s,
                n,
            )

    def _plain(
        self, hook: str, plan: list[_Impl], kwargs: dict[str, Any], fatal: type[Exception]
    ) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        budget = self._slow_ns
        if budget is None:
            for name, function, argnames in plan:
                try:
                    result = function(*[kwargs[a] for a in argnames])
                except fatal as exc:
                    self._set_up_failed(name, hook, exc)
                    continue
                except BaseException as exc:
                    self._failed(name, hook, exc)
                    continue
                if result is not None:
                    out.append((name, result))
            return out
        clock = self._clock
        # One clock read per call: the end of one observer's call starts the next one's
        # (what lies between is this loop's own sub-microsecond work).
        start = clock()
        for name, function, argnames in plan:
            try:
                result = function(*[kwargs[a] for a in argnames])
            except fatal as exc:
                self._set_up_failed(name, hook, exc)
                start = clock()
                continue
            except BaseException as exc:
                took = clock() - start
                if took > budget:
                    self.count_slow(name, hook, took)
                self._failed(name, hook, exc)
                start = clock()  # the logging is nobody's call
                continue
            end = clock()
            if end - start > budget:
                self.count_slow(name, hook, end - start)
                end = clock()
            start = end
            if result is not None:
                out.append((name, result))
        return out

    def _set_up_failed(self, name: str, hook: str, exc: BaseException) -> None:
        """A plugin could not set up: the run's failure when it is essential, else the
        plugin is left out."""
        if self.essential(name):
            raise exc
        self.leave_out(name, f"{hook} raised {type(exc).__name__}: {exc}")

    def _failed(self, name: str, hook: str, exc: BaseException) -> None:
        """Count an observer's exception; re-raise the main thread's KeyboardInterrupt
        and SystemExit (a signal handler's, most likely)."""
        if isinstance(exc, KeyboardInterrupt | SystemExit) and threading.current_thread() is (
            threading.main_thread()
        ):
            kind = type(exc).__name__
            self.count(name, "was interrupted in %s (%s); re-raised", hook, kind)
            raise exc
        self.count(name, "failed in %s; skipped", hook, exc_info=True)

    def _monitored(
        self, hook: str, kwargs: dict[str, Any], fatal: type[Exception]
    ) -> list[tuple[str, Any]]:
        monitors = self._pm.monitors
        impls = list(reversed(getattr(self._pm.hook, hook).get_hookimpls()))
        for before, _after in monitors:
            before(hook, impls, kwargs)
        results = self._plain(hook, self._plans.get(hook, []), kwargs, fatal)
        outcome: pluggy.Result[list[Any]] = pluggy.Result([r for _, r in results], None)
        for _before, after in reversed(monitors):
            after(outcome, hook, impls, kwargs)
        return results


class Dispatcher:
    """Delivers every event submitted to its hook on every observer, one at a time.

    Events published concurrently from several threads, or from inside a hook, are queued
    and dispatched in order by whichever thread is already dispatching, so observers never
    run concurrently and never re-enter. A hook must therefore not *wait* for another
    thread that publishes: that thread waits for this dispatch to finish.

    ``background=True`` moves the observers off the publishing threads: :meth:`submit`
    hands the event to one dispatch thread (the run's
    :class:`~twinkle.reporting.BatchWriter`, at most ``capacity`` events in flight; a
    publisher finding it full waits, counted) that calls the hooks in submit order.
    Events are frozen values, so nothing the publisher holds changes under it; records
    and outputs are the same as inline (a replay always dispatches inline). A hook that
    publishes is queued behind the current event either way. :meth:`flush` waits until
    every event submitted so far was dispatched. The price: a process killed outright
    also loses the events still queued for the dispatch thread (they have not reached
    the event log), and the observers' own time is no longer timed as overhead on the
    publishing threads (the timeline deducts only those threads' time). An observer
    raising ``SystemExit`` or ``KeyboardInterrupt`` there is counted and skipped like
    any failure (:class:`HookCalls`), so the dispatch thread goes on; only on the main
    thread (inline dispatch) do they reach the publisher.

    ``report`` stamps the records the observers return (the run's reporter) before they
    go to :func:`~twinkle.hookspecs.twinkle_record`. A hook result that is not a list of
    records, and a record the reporter refuses, count as that observer's failures; a
    disk fault the reporter reports (``WriteError``: the record is kept) counts under
    :data:`REPORTER_FAILURES` and never stops the run.
    """

    __slots__ = (
        "_event_hook",
        "_hooks",
        "_lock",
        "_owner",
        "_pending",
        "_thread",
        "calls",
        "events",
        "report",
        "seen",
        "settled",
    )

    def __init__(
        self,
        calls: HookCalls,
        report: Callable[[MetricRecord], MetricRecord],
        *,
        background: bool = False,
        capacity: int = 4096,
    ) -> None:
        self.calls = calls
        self.report = report
        #: events dispatched so far
        self.events = 0
        # Per event type, its hook's name if any observer implements it (else None), and
        # whether any observer implements twinkle_event: nobody's hooks are not called.
        self._hooks = {
            cls: hook_name(cls) if calls.plan(hook_name(cls)) else None
            for cls in EVENT_TYPES.values()
        }
        self._event_hook = bool(calls.plan("twinkle_event"))
        self._pending: deque[Event] = deque()
        #: called on the dispatching thread after an event, once what its hooks
        #: published was dispatched too (the run's checkpoints)
        self.settled: Callable[[Event], None] | None = None
        #: called with each event before its hooks (what the run notes of every event)
        self.seen: Callable[[Event], None] | None = None
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._thread: BatchWriter[Event] | None = None
        if background:
            self._thread = BatchWriter(
                self._dispatch_batch,
                name="observer dispatch",
                thread_name="dispatch",
                background=True,
                capacity=capacity,
                wake_at=min(256, capacity),
                interval_s=0.05,
            )

    @property
    def background(self) -> bool:
        """Whether the observers run on the dispatch thread."""
        return self._thread is not None

    @property
    def waits(self) -> int:
        """Submits that waited for room on a full dispatch thread (0 inline)."""
        return 0 if self._thread is None else self._thread.stats.waits

    def submit(self, event: Event) -> None:
        """Queue ``event`` and dispatch everything queued, in order.

        From inside a hook (re-entrant publish) the event is only queued: the outer
        dispatch picks it up after the current event. Inline, another thread waits for
        the dispatching thread, then dispatches whatever is still queued; in the
        background, the dispatch thread takes it.
        """
        if self.enqueue(event):
            self.drain()

    def enqueue(self, event: Event) -> bool:
        """The first half of :meth:`submit`: queue ``event`` (its place in the order of
        dispatch is taken now); True when the caller must then call :meth:`drain`."""
        thread = self._thread
        me = _get_ident()
        if thread is not None and self._owner != me:
            thread.put(event)
            return False
        self._pending.append(event)
        return self._owner != me

    def drain(self) -> None:
        """The second half of :meth:`submit`: dispatch everything queued, in order."""
        pending = self._pending
        with self._lock:
            self._owner = _get_ident()
            try:
                while pending:
                    self._dispatch_settled(pending.popleft())
            finally:
                self._owner = None

    @property
    def idle(self) -> bool:
        """Whether no event waits to be dispatched inline."""
        return not self._pending

    @property
    def dispatching_here(self) -> bool:
        """Whether the calling thread is dispatching now (an observer publishing)."""
        return self._owner == _get_ident()

    def _dispatch_batch(self, events: list[Event]) -> None:
        """The dispatch thread's work: each event, then what its hooks published."""
        self._owner = _get_ident()
        pending = self._pending
        for event in events:
            pending.append(event)
            while pending:
                self._dispatch_settled(pending.popleft())

    def _dispatch_settled(self, event: Event) -> None:
        self._dispatch(event)
        if self.settled is not None and not self._pending:
            self.settled(event)

    def flush(self) -> None:
        """Wait until every event submitted so far was dispatched (a no-op inline)."""
        if self._thread is not None:
            self._thread.flush()

    def close(self) -> None:
        """Dispatch what is queued and stop the dispatch thread (idempotent)."""
        if self._thread is not None:
            self._thread.close()

    def _dispatch(self, event: Event) -> None:
        self.events += 1
        if self.seen is not None:
            self.seen(event)
        calls = self.calls
        monitored = calls.monitored
        hook = self._hooks[type(event)]
        if hook is not None or monitored:
            hook = hook or hook_name(type(event))
            for name, result in calls.call_named(hook, event=event):
                try:
                    records = list(result)
                except Exception as exc:  # not iterable, or an iterator that raised
                    calls.count(name, "returned %r, not a list of records (%s)", result, exc)
                    continue
                for record in records:
                    stamped = self._stamp(name, record)
                    if stamped is not None:
                        calls.call("twinkle_record", record=stamped)
        if self._event_hook or monitored:
            calls.call("twinkle_event", event=event)

    def _stamp(self, plugin: str, record: Any) -> MetricRecord | None:
        """The reporter's stamped record, or None when the observer's record is refused."""
        try:
            return self.report(record)
        except WriteError as exc:
            # A disk fault: the record was accepted and is kept in memory (the reporter
            # writes it once the fault is gone). Counted, never fatal to the run.
            self.calls.count(REPORTER_FAILURES, "cannot write records: %s", exc)
            return exc.record if isinstance(exc.record, MetricRecord) else None
        except Exception as exc:  # the observer's record is bad (other run, not a record)
            self.calls.count(plugin, "returned a record the reporter refused: %s", exc)
            return None


def merge_summary(parts: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge observers' summary parts; a key already taken is kept as ``plugin.key``."""
    merged: dict[str, Any] = {}
    for plugin, part in parts:
        for key, value in part.items():
            merged[f"{plugin}.{key}" if key in merged else key] = value
    return merged
