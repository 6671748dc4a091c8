"""``BatchWriter``: the one background writer of twinkle (records and the event log).

Callers :meth:`~BatchWriter.put` items; batches of them go to one ``deliver`` function,
in put order, one call at a time. With ``background=True`` a writer thread delivers, so
the caller only appends to a queue; with ``background=False`` the same code delivers
inline, on the caller's thread, before ``put`` returns (replays, sync reporters).

* **Bound.** At most ``capacity`` items are in flight (put, not yet delivered: the batch
  being delivered included). A ``put`` into a full writer waits for room
  (``on_full="block"``; counted in ``stats.waits`` and logged) or drops the item
  (``"drop"``; counted in ``stats.dropped``): the only wait in ``put``.
* **Batching.** The thread sleeps until ``wake_at`` items are queued, a caller flushes,
  closes or meets a full writer, or ``interval_s`` passes; then it takes the whole queue
  as one batch.
* **One error rule.** ``deliver`` handles what it can (a fan-out counts a failing backend
  and goes on). An ``Exception`` it raises is held and raised once, by the caller's next
  ``put``/``flush``/``close`` (inline: by the call that delivered), after that call's own
  item was accepted; later batches are still delivered. A ``BaseException`` (the thread
  cannot go on) moves the writer to ``FAILED``: what was in flight is counted lost
  (``stats.lost``) and every later ``put`` raises :class:`~twinkle.errors.ReporterError`.
* **Giving up.** A ``deliver`` that never returns (a third-party backend stuck on a dead
  server) would hold the writer for ever: its owner may :meth:`~BatchWriter.cut_off`
  the writer (what is in flight is counted lost, later ``put`` calls are refused and the
  stuck thread, a daemon, is abandoned), and ``close(timeout_s=...)`` does so itself
  when the thread has not finished in time. :meth:`~BatchWriter.begin_close` starts a
  close without waiting, so that several writers can finish side by side.
* **One state machine** (:class:`WriterState`), every transition in :meth:`_move`::

      OPEN --close()--> CLOSING --queue delivered, thread joined--> CLOSED
      OPEN | CLOSING --deliver raised a BaseException--> FAILED --close()--> CLOSED
      OPEN | CLOSING --cut_off(), or close(timeout_s) ran out--> CUT_OFF --close()--> CLOSED

This module reads no clock (``interval_s`` and ``timeout_s`` are waits' timeouts).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, final

from twinkle.checks import check_seconds
from twinkle.errors import InvalidArgumentError, ReporterError
from twinkle.threads import acting_ident

__all__ = ["BatchWriter", "WriterState", "WriterStats"]

logger = logging.getLogger("twinkle.reporting")

T = TypeVar("T")


class WriterState(enum.Enum):
    """Where a :class:`BatchWriter` is in its life."""

    OPEN = "open"  # accepting items
    CLOSING = "closing"  # close() called: no new items; what is queued is being delivered
    CLOSED = "closed"  # done: everything delivered (or counted lost), thread joined
    FAILED = "failed"  # deliver raised a BaseException: nothing more is delivered
    CUT_OFF = "cut off"  # the owner gave up on a deliver that did not return


# The members as module constants: an enum member lookup costs ~100 ns, put() runs per item.
_OPEN = WriterState.OPEN
_CLOSING = WriterState.CLOSING
_CLOSED = WriterState.CLOSED
_FAILED = WriterState.FAILED
_CUT_OFF = WriterState.CUT_OFF

_TRANSITIONS: dict[WriterState, frozenset[WriterState]] = {
    WriterState.OPEN: frozenset({WriterState.CLOSING, WriterState.FAILED, WriterState.CUT_OFF}),
    WriterState.CLOSING: frozenset({WriterState.CLOSED, WriterState.FAILED, WriterState.CUT_OFF}),
    WriterState.FAILED: frozenset({WriterState.CLOSED}),
    WriterState.CUT_OFF: frozenset({WriterState.CLOSED}),
    WriterState.CLOSED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class WriterStats:
    """A snapshot of a writer's counters."""

    state: WriterState
    accepted: int  # items put and kept (not dropped)
    delivered: int  # items handed to deliver (whatever deliver did with them)
    in_flight: int  # accepted, not delivered yet (queued or being delivered)
    dropped: int  # items refused on a full writer (on_full="drop")
    waits: int  # puts that waited for room on a full writer (on_full="block")
    lost: int  # items never delivered because the writer FAILED or was CUT_OFF


_SLEEP = "how long the writer sleeps at most"


@final
class BatchWriter(Generic[T]):
    """Delivers put items in batches, on a writer thread or inline (see the module
    docstring for the bound, the batching, the error rule and the states).

    ``deliver(batch)`` gets a list it may keep; it is called one batch at a time, in put
    order, and must not put into its own writer. ``name`` appears in errors, logs and the
    thread's name (``twinkle-<thread_name>``). The thread is a daemon: whoever owns the
    writer closes it (at interpreter exit too) so that nothing queued is lost.
    """

    __slots__ = (
        "_accepted",
        "_capacity",
        "_claimed",
        "_cut",
        "_deliver",
        "_deliver_lock",
        "_delivered",
        "_drop",
        "_dropped",
        "_error",
        "_failure",
        "_interval_s",
        "_lock",
        "_lost",
        "_progress",
        "_queue",
        "_room",
        "_sleeping",
        "_state",
        "_thread",
        "_thread_ident",
        "_urgent",
        "_waits",
        "_wake_at",
        "_wakeup",
        "name",
    )

    def __init__(
        self,
        deliver: Callable[[list[T]], object],
        *,
        name: str,
        background: bool,
        capacity: int,
        on_full: Literal["block", "drop"] = "block",
        wake_at: int = 1,
        interval_s: float = 0.2,
        thread_name: str | None = None,
    ) -> None:
        if not callable(deliver):
            raise InvalidArgumentError(f"deliver must be callable (takes a batch), got {deliver!r}")
        if type(capacity) is not int or capacity < 1:
            raise InvalidArgumentError(
                f"capacity must be an int >= 1 (items in flight), got {capacity!r}"
            )
        if on_full not in ("block", "drop"):
            raise InvalidArgumentError(
                f"on_full must be 'block' (wait for room) or 'drop' (drop and count), "
                f"got {on_full!r}"
            )
        if type(wake_at) is not int or not 1 <= wake_at <= capacity:
            raise InvalidArgumentError(
                f"wake_at must be an int in [1, capacity={capacity}] (queued items that wake "
                f"the writer), got {wake_at!r}"
            )
        self.name = name
        self._deliver = deliver
        self._capacity = capacity
        self._drop = on_full == "drop"
        self._wake_at = wake_at
        self._interval_s = check_seconds("interval_s", interval_s, zero_ok=False, means=_SLEEP)
        self._lock = threading.Lock()  # state, queue, counters
        self._deliver_lock = threading.Lock()  # one deliver at a time, in queue order
        self._wakeup = threading.Condition(self._lock)  # the thread: work or a new state
        self._room = threading.Condition(self._lock)  # blocked puts: room or a new state
        self._progress = threading.Condition(self._lock)  # flush: delivered or a new state
        self._state: WriterState = _OPEN
        self._queue: list[T] = []
        self._accepted = 0
        self._delivered = 0
        self._dropped = 0
        self._waits = 0
        self._lost = 0
        self._error: Exception | None = None  # held for the caller's next call
        self._failure: str | None = None  # why the writer FAILED or was CUT_OFF
        self._cut = False  # cut off: a deliver still running counts for nothing
        self._claimed = False  # a close() call owns the closing (begin_close() does not)
        self._sleeping = False
        self._urgent = False
        self._thread_ident: int | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run, name=f"twinkle-{thread_name or name}", daemon=True
            )
            self._thread.start()

    # -- callers -------------------------------------------------------------------------

    def put(self, item: T) -> bool:
        """Queue ``item`` (inline: deliver it); False when it was dropped on a full writer.

        Raises :class:`~twinkle.errors.ReporterError` *before* accepting the item when the
        writer is closing, closed or failed; raises a held ``deliver`` error *after*
        accepting it (see the error rule).
        """
        with self._lock:
            if self._state is not _OPEN:
                raise ReporterError(self._refusal())
            if self._accepted - self._delivered >= self._capacity and not self._make_room():
                self._dropped += 1
                return False
            self._queue.append(item)
            self._accepted += 1
            if self._thread is not None:
                # Waking the thread per item makes it fight the caller for the GIL at
                # every burst: it wakes by itself every interval_s, and now only when a
                # batch is worth writing.
                if self._sleeping and len(self._queue) >= self._wake_at:
                    self._wakeup.notify()
                if self._error is None:
                    return True
        if self._thread is None:
            self._drain()
        self._raise_held()
        return True

    def settle(self) -> bool:
        """Wait until every item put so far was delivered, as :meth:`flush` does, but
        leave a held error for the caller's next call: True when every delivery went
        through (nothing failed, nothing is held), False otherwise."""
        with self._lock:
            if self._state is not _OPEN:
                return False
            self._wait_delivered("settle()")
        if self._thread is None:
            self._drain()
        with self._lock:
            return self._state is _OPEN and self._error is None

    def wait_delivered(self, count: int) -> None:
        """Wait until the thread delivered at least ``count`` items (at once when it did,
        or when the writer is not open); a held error is left for the next call."""
        with self._lock:
            self._wait_delivered("wait_delivered()", count)

    def wake(self) -> None:
        """Have the thread take what is queued now, not at its next interval; never
        waits (inline: a no-op)."""
        with self._lock:
            if self._thread is not None and self._queue:
                self._urgent = True
                if self._sleeping:
                    self._wakeup.notify()

    def _wait_delivered(self, call: str, target: int | None = None) -> None:
        """(Lock held) wait until the thread delivered ``target`` items (None: every item
        put so far)."""
        self._refuse_on_writer_thread(call)
        target = self._accepted if target is None else target
        if self._thread is not None:
            while self._delivered < target and self._state is _OPEN:
                self._urgent = True
                self._wakeup.notify()
                self._progress.wait()

    def flush(self) -> None:
        """Wait until every item put so far was delivered; raise a held error.

        Raises :class:`~twinkle.errors.ReporterError` if the writer FAILED or was cut off
        (or when called from the writer thread). A no-op once closing or closed.
        """
        with self._lock:
            if self._state in (_CLOSING, _CLOSED):
                return
            self._wait_delivered("flush()")
            if self._state is _FAILED or self._state is _CUT_OFF:
                raise ReporterError(self._refusal())
        if self._thread is None:
            self._drain()
        self._raise_held()

    def begin_close(self) -> None:
        """Refuse new items and let the thread deliver what is queued, without waiting
        for it: :meth:`close` then waits (several writers can finish side by side)."""
        with self._lock:
            if self._state is _OPEN:
                self._refuse_on_writer_thread("begin_close()")
                self._move(_CLOSING)

    def cut_off(self, reason: str) -> bool:
        """Give up on the writer: what is in flight is counted lost (``stats.lost``), no
        more is delivered, later ``put`` calls are refused, and a ``deliver`` still
        running is abandoned (the thread is a daemon; what it returns with counts for
        nothing). ``reason`` is kept in :attr:`failure`. False when the writer was
        already done (closed, failed or cut off)."""
        with self._lock:
            if self._state is not _OPEN and self._state is not _CLOSING:
                return False
            self._cut = True
            self._failure = reason
            self._lost += self._accepted - self._delivered - self._lost
            self._queue = []
            self._move(_CUT_OFF)
            return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Deliver what is queued, stop the thread, then raise a held error, if any.

        Returns True for the call that closed the writer, False when another call closed
        it or is closing it (idempotent; :meth:`begin_close` leaves the closing to this
        call). A FAILED or CUT_OFF writer closes without delivering: its lost items stay
        counted in :attr:`stats`. ``timeout_s`` bounds the wait for the writer thread:
        when it has not finished by then, the writer is cut off (:meth:`cut_off`).
        """
        with self._lock:
            if self._state is _CLOSED or self._claimed:
                return False
            self._refuse_on_writer_thread("close()")
            self._claimed = True
            if self._state is _OPEN:
                self._move(_CLOSING)
            done = self._state is not _CLOSING
        if done:
            pass  # failed or cut off: nothing more is delivered
        elif self._thread is not None:
            try:
                self._thread.join(timeout_s)
            except BaseException as exc:  # Ctrl-C while waiting: give up on the thread
                self.cut_off(f"closing {self.name} was interrupted ({type(exc).__name__})")
                with self._lock:
                    self._move(_CLOSED)
                raise
            if self._thread.is_alive():
                self.cut_off(f"{self.name} did not finish writing within {timeout_s:g} s")
        else:
            self._drain()
        with self._lock:
            self._move(_CLOSED)
        self._raise_held()
        return True

    @property
    def state(self) -> WriterState:
        return self._state

    @property
    def failure(self) -> str | None:
        """Why the writer FAILED or was cut off (None while neither happened)."""
        return self._failure

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def accepted(self) -> int:
        """Items put and kept so far."""
        return self._accepted

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(
                state=self._state,
                accepted=self._accepted,
                delivered=self._delivered,
                in_flight=self._accepted - self._delivered - self._lost,
                dropped=self._dropped,
                waits=self._waits,
                lost=self._lost,
            )

    def __repr__(self) -> str:
        mode = "background" if self._thread is not None else "inline"
        return f"BatchWriter({self.name!r}, {mode}, {self._state.name})"

    # -- internals -----------------------------------------------------------------------

    def _move(self, to: WriterState) -> None:
        """The one place the state changes (lock held); wakes everyone waiting on it."""
        if to not in _TRANSITIONS[self._state]:
            raise ReporterError(
                f"{self.name}: writer state {self._state.name} cannot become {to.name} "
                "(a bug in twinkle: please report it)"
            )
        self._state = to
        self._wakeup.notify_all()
        self._room.notify_all()
        self._progress.notify_all()

    def _refusal(self) -> str:
        if self._state is _FAILED:
            return f"{self.name} failed ({self._failure}); nothing more is written"
        if self._cut:
            return f"{self.name} was cut off ({self._failure}); nothing more is written"
        return f"{self.name} is closed; create a new one"

    def _refuse_on_writer_thread(self, call: str) -> None:
        # (a plugin's hook thread, waited for by this writer's thread, acts for it)
        if self._thread is not None and self._thread_ident == acting_ident():
            raise ReporterError(
                f"{call} called on {self.name} from its own writer thread (it would wait "
                "for itself); do not call the writer from deliver"
            )

    def _make_room(self) -> bool:
        """Lock held, writer full: wait for room (True) or, in drop mode, False."""
        if self._drop:
            return False
        self._refuse_on_writer_thread("put() into a full writer")
        self._waits += 1
        if self._waits & (self._waits - 1) == 0:  # the 1st, 2nd, 4th, 8th... wait
            logger.warning(
                "%s: %d item(s) in flight, its bound: the caller waits for the writer "
                "(%d wait(s) so far; the writer thread is behind the producer)",
                self.name,
                self._capacity,
                self._waits,
            )
        while self._accepted - self._delivered >= self._capacity:
            if self._state is not _OPEN:
                raise ReporterError(self._refusal())
            self._urgent = True
            self._wakeup.notify()
            self._room.wait()
        return True

    def _raise_held(self) -> None:
        if self._error is None:
            return
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _drain(self) -> None:
        """Deliver everything queued (inline: the caller's put, flush or close)."""
        while self._deliver_batch():
            pass

    def _deliver_batch(self) -> bool:
        """Take the whole queue and deliver it as one batch; False when it was empty."""
        with self._deliver_lock:
            with self._lock:
                batch, self._queue = self._queue, []
            if not batch:
                return False
            try:
                self._deliver(batch)
            except Exception as exc:
                with self._lock:
                    self._error = self._error or exc
            except BaseException as exc:
                self._fail(exc, len(batch))
                raise
            with self._lock:
                if self._cut:
                    return False  # counted lost when it was cut off
                self._delivered += len(batch)
                self._room.notify_all()
                self._progress.notify_all()
            return True

    def _fail(self, exc: BaseException, undelivered: int) -> None:
        logger.error(
            "%s: delivering stopped (%r); nothing more is written", self.name, exc, exc_info=exc
        )
        with self._lock:
            if self._cut:
                return  # counted lost when it was cut off
            self._failure = repr(exc)
            self._lost += undelivered + len(self._queue)
            self._queue = []
            if self._state is not _FAILED:
                self._move(_FAILED)

    def _run(self) -> None:
        """The writer thread: sleep until there is a batch worth writing, deliver it."""
        self._thread_ident = threading.get_ident()
        while True:
            with self._lock:
                if self._state is _OPEN and not self._urgent and len(self._queue) < self._wake_at:
                    self._sleeping = True
                    self._wakeup.wait(self._interval_s)
                    self._sleeping = False
                self._urgent = False
                if self._state is _FAILED or self._cut:
                    return
                if not self._queue:
                    if self._state is _CLOSING:
                        return
                    continue
            try:
                self._deliver_batch()
            except BaseException:
                return  # the writer is FAILED now, and why was logged
            if self._cut:
                return  # abandoned while delivering: its owner has moved on
