"""Routing a run's events to the observers' hooks, one event at a time, in order.

:class:`Dispatcher` delivers the events a run submits to their hooks (:func:`hook_name`),
inline or on one dispatch thread, through the run's :class:`~twinkle.plugins.HookCalls`
(each observer called in isolation), and hands the observers' records to the run's
reporter. :func:`merge_summary` merges the observers' parts of ``summary.json``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from twinkle.errors import TwinkleError, WriteError
from twinkle.events import EVENT_TYPES, Event, IterationStarted
from twinkle.plugins._hookcalls import REPORTER_FAILURES, HookCalls
from twinkle.reporting import BatchWriter, MetricRecord
from twinkle.threads import acting_ident

__all__ = [
    "HOOK_FOR_EVENT",
    "Dispatcher",
    "hook_name",
    "merge_summary",
]

# (a plugin's hook thread acts for the thread dispatching: twinkle.threads)
_get_ident = acting_ident


def hook_name(event_type: type[Event]) -> str:
    """The hook an event type is delivered to: ``twinkle_<TYPE>``."""
    return f"twinkle_{event_type.TYPE}"


HOOK_FOR_EVENT: dict[type[Event], str] = {cls: hook_name(cls) for cls in EVENT_TYPES.values()}
"""The hook of every event type (derived from the type: :func:`hook_name`)."""


class Dispatcher:
    """Delivers every event submitted to its hook on every observer, one at a time.

    Events published concurrently from several threads, or from inside a hook, are queued
    and dispatched in order by whichever thread is already dispatching, so observers never
    run concurrently and never re-enter. A hook must therefore not *wait* for another
    thread that publishes: that thread waits for this dispatch to finish.

    ``background=True`` (or :meth:`to_background` later) moves the observers off the
    publishing threads: :meth:`submit` hands the event to one dispatch thread (a
    :class:`~twinkle.reporting.BatchWriter`, at most ``capacity`` events in flight; a
    publisher finding it full waits, counted) that calls the hooks in submit order.
    Events are frozen values, so nothing the publisher holds changes under it; the
    records are those of inline dispatch but for the figures of twinkle's own time
    (below; a replay always dispatches inline, and gives the live run's). A hook that
    publishes is queued behind the current event either way. :meth:`flush` waits until
    every event submitted so far was dispatched. The dispatch thread lags the
    publishers by at most one boundary: an iteration boundary wakes it (it starts on the
    iteration just ended while the next one runs), and is submitted once the boundary
    before it was dispatched (:meth:`wait_boundary`: the publisher waits for that, which
    a loop whose iterations outlast their observers' work does not), so a process killed
    outright loses at most the events since the boundary before the last (the previous
    iteration's and the current one's), besides what the event log has in flight. The
    observers' time is then twinkle's own time on the dispatch thread (``timed``), not
    on the publishing threads (whose phases the timeline deducts only their own
    threads' overhead from).
    An observer raising ``SystemExit`` or ``KeyboardInterrupt`` there is counted and
    skipped like any failure (:class:`HookCalls`), so the dispatch thread goes on; only
    on the main thread (inline dispatch) do they reach the publisher (a Ctrl-C reaches
    the main thread, wherever the observers run).

    ``report`` stamps the records the observers return (the run's reporter) before they
    go to :func:`~twinkle.hookspecs.twinkle_record`. A hook result that is not a list of
    records, and a record the reporter refuses, count as that observer's failures; a
    disk fault the reporter reports (``WriteError``: the record is kept) counts under
    :data:`REPORTER_FAILURES` and never stops the run.
    """

    __slots__ = (
        "_boundary_mark",
        "_capacity",
        "_closed",
        "_event_hook",
        "_hooks",
        "_lock",
        "_owner",
        "_pending",
        "_thread",
        "_timed",
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
        self._closed = False
        self._owner: int | None = None
        self._thread: BatchWriter[Event] | None = None
        self._capacity = capacity
        #: (background) the events queued up to the newest boundary, itself included:
        #: the next boundary is queued once that many were dispatched
        self._boundary_mark = 0
        self._timed: Callable[[str], AbstractContextManager[object]] | None = None
        if background:
            self.to_background()

    def to_background(
        self, timed: Callable[[str], AbstractContextManager[object]] | None = None
    ) -> None:
        """Dispatch on the dispatch thread from now on (a no-op when it does already);
        what is queued inline is dispatched first. The run calls it once its start (or
        its resume's feeding of the log) went by inline. ``timed(what)``: a span of
        twinkle's own time, around each batch the thread dispatches."""
        with self._lock:
            if self._thread is not None:
                return
            self._timed = timed
            self._dispatch_pending()
            self._thread = BatchWriter(
                self._dispatch_batch,
                name="observer dispatch",
                thread_name="dispatch",
                background=True,
                capacity=self._capacity,
                wake_at=min(256, self._capacity),
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
        if type(event) is IterationStarted:
            self.wait_boundary()
        if self.enqueue(event):
            self.drain()

    def enqueue(self, event: Event) -> bool:
        """The first half of :meth:`submit`: queue ``event`` (its place in the order of
        dispatch is taken now); True when the caller must then call :meth:`drain`."""
        thread = self._thread
        me = _get_ident()
        if thread is not None and self._owner != me:
            if type(event) is not IterationStarted:
                thread.put(event)
                return False
            # A boundary (queued once the one before it was dispatched: wait_boundary):
            # the thread starts on the iteration it ends now.
            thread.put(event)
            self._boundary_mark = thread.accepted
            thread.wake()
            return False
        self._pending.append(event)
        return self._owner != me

    def wait_boundary(self) -> None:
        """Before a boundary is submitted (background): wait until the newest boundary
        queued was dispatched, so that the thread lags by at most one boundary. At once
        inline, or on the dispatch thread (an observer publishing)."""
        thread = self._thread
        if thread is not None and self._owner != _get_ident():
            thread.wait_delivered(self._boundary_mark)

    def drain(self) -> None:
        """The second half of :meth:`submit`: dispatch everything queued, in order.
        After :meth:`close`, what another thread queued since is dropped and refused
        (what it queued before was dispatched by whichever thread drained first)."""
        with self._lock:
            if self._closed and self._pending:
                self._pending.clear()
                raise TwinkleError(
                    "the run's observers are closed: an event published while the run "
                    "finished, after its outputs closed, reaches none; publish before finish()"
                )
            self._dispatch_pending()

    def _dispatch_pending(self) -> None:
        """(Lock held) dispatch everything queued inline, in order, on this thread."""
        pending = self._pending
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
        pending = self._pending
        timed = self._timed
        # (the lock: a publisher that found no thread yet may still drain inline)
        with self._lock, nullcontext() if timed is None else timed("dispatch"):
            self._owner = _get_ident()
            try:
                for event in events:
                    pending.append(event)
                    while pending:
                        self._dispatch_settled(pending.popleft())
            finally:
                self._owner = None

    def _dispatch_settled(self, event: Event) -> None:
        self._dispatch(event)
        if self.settled is not None and not self._pending:
            self.settled(event)

    def flush(self) -> None:
        """Wait until every event submitted so far was dispatched (a no-op inline)."""
        if self._thread is not None:
            self._thread.flush()

    def close(self) -> None:
        """Dispatch what is queued and stop the dispatch thread (idempotent). Inline, it
        waits for a dispatch in flight on another thread (whose records must reach the
        outputs before they close); an event queued after it is refused (:meth:`drain`)."""
        if self._thread is not None:
            self._thread.close()
            return
        with self._lock:
            self._closed = True
            self._dispatch_pending()

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
