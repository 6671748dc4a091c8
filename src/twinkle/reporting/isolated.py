"""``IsolatedBackend``: a backend behind a thread of its own, so that the run never waits.

A third-party backend (a plugin's sink: a tracking server, a W&B service) may be slow,
raise, or hang for ever on a dead server. The run's own files must not wait for it, nor
must ``finish()`` or Ctrl-C. So the reporter hands such a backend its records through a
queue (:class:`~twinkle.reporting.BatchWriter`, on a thread of the backend's own) and
goes on at once:

* **Set-up off the start.** A backend with an ``open()`` method is opened on its thread,
  first: the run starts without waiting for it (a required plugin's start waits:
  :meth:`IsolatedBackend.wait_open`). An ``open()`` that raises leaves the backend out:
  what is handed to it afterwards is counted lost, and why is kept (``setup_error``).
* **A bound per call.** A call (``open``/``write``/``flush``/``close``) that has not
  returned ``timeout_s`` after it began cuts the backend off: the queued records are
  counted lost, nothing more is handed to it, and its thread (a daemon) is abandoned.
  The reporter notices at its next hand-over, and :meth:`IsolatedBackend.close` waits at
  most ``timeout_s`` in all (several backends close side by side:
  :meth:`IsolatedBackend.begin_close`).
* **A bound on memory.** At most ``max_records`` records wait for the backend; beyond
  that they are counted lost for it (the run's own files have them).
* **Nothing silent.** Every failure, cut-off and loss is counted in
  :meth:`IsolatedBackend.health` and logged (logger ``twinkle.reporting``: stderr unless
  the application routes it) the first time, then at the 2nd, 4th, 8th... failure.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, NamedTuple, final

import msgspec

from twinkle.checks import check_seconds
from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, TwinkleError
from twinkle.reporting._health import BackendHealth
from twinkle.reporting._history import History, say_unread
from twinkle.reporting.backends import Backend
from twinkle.reporting.record import MetricRecord
from twinkle.reporting.writer import BatchWriter, WriterState

__all__ = [
    "DEFAULT_BACKEND_TIMEOUT_S",
    "IsolatedBackend",
    "check_backend_timeout",
]

logger = logging.getLogger("twinkle.reporting")

#: how long one call of an isolated backend may take before it is cut off (a metrics
#: sink's call takes milliseconds; a W&B ``finish()`` syncing online, seconds)
DEFAULT_BACKEND_TIMEOUT_S: Final = 30.0
#: records that may wait for one isolated backend
DEFAULT_MAX_RECORDS: Final = 65_536


class _Call(NamedTuple):
    """What the backend's thread is doing now: which call, since when (for the bound)."""

    name: str
    started: float


_OPEN, _FLUSH, _CLOSE = "open", "flush", "close"
#: how often a closing run checks a backend's call against its bound
_POLL_S: Final = 0.05
#: after how long a closing run says which backend it waits for
_SAY_WAITING_S: Final = 1.0
_Item = tuple[MetricRecord, ...] | str | History


@final
class IsolatedBackend:
    """``backend`` behind a thread of its own, under the bounds of the module docstring.

    It is a :class:`~twinkle.reporting.Backend` whose ``write`` and ``flush`` never wait
    (they queue) and whose ``close`` waits at most ``timeout_s``. ``name`` names it in
    logs and in the run's summary (the plugin that made it); ``clock`` (seconds,
    monotonic) times the calls.
    """

    __slots__ = (
        "_backend",
        "_call",
        "_calls_failed",
        "_clock",
        "_close_called",
        "_closing_at",
        "_cut",
        "_done",
        "_dropped",
        "_flush_queued",
        "_histories",
        "_history_left",
        "_lock",
        "_max_records",
        "_open_ok",
        "_opened",
        "_queued",
        "_records",
        "_records_failed",
        "_setup_error",
        "_slowest",
        "_writer",
        "_written",
        "name",
        "timeout_s",
    )

    def __init__(
        self,
        backend: Backend,
        *,
        name: str,
        timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
        max_records: int = DEFAULT_MAX_RECORDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_backend_timeout(timeout_s)
        if type(max_records) is not int or max_records < 1:
            raise InvalidArgumentError(
                f"max_records must be an int >= 1 (records waiting for the backend), "
                f"got {max_records!r}"
            )
        self.name = name
        self.timeout_s = float(timeout_s)
        self._backend = backend
        self._max_records = max_records
        self._clock = clock
        self._call: _Call | None = None
        self._cut: BackendHealth | None = None  # frozen when it was cut off
        self._close_called = False  # the backend's close() was called (once at most)
        self._setup_error: str | None = None
        self._opened = threading.Event()
        self._done = threading.Event()  # the thread reached the close (did it or skipped it)
        self._open_ok = False  # open() returned (or there is none): close() is due
        self._closing_at: float | None = None
        self._records = 0
        self._dropped = 0  # hand-overs refused on a full queue (for the log)
        self._flush_queued = False
        self._queued = 0  # records handed over, not yet taken by the thread
        self._history_left = 0  # records of a resumed run's history not yet written
        self._histories: list[History] = []  # queued, not yet taken by the thread
        self._written = 0
        self._records_failed = 0
        self._calls_failed = 0
        self._lock = threading.Lock()  # _queued: changed by both threads
        self._slowest = 0.0
        self._writer: BatchWriter[_Item] = BatchWriter(
            self._deliver,
            name=f"backend {name!r}",
            thread_name=f"backend-{name}",
            background=True,
            # Items are batches and markers: the record bound is max_records (above).
            capacity=max_records + 16,
            on_full="drop",
            wake_at=1,
            interval_s=0.2,
        )
        if callable(getattr(backend, "open", None)):
            self._writer.put(_OPEN)
        else:
            self._open_ok = True
            self._opened.set()

    # -- the reporter's side ---------------------------------------------------------

    def write(self, records: Sequence[MetricRecord]) -> None:
        """Queue ``records`` for the backend's thread (never waits)."""
        self._check_stall()
        n = len(records)
        self._records += n
        if self._writer.state is not WriterState.OPEN or self._setup_error is not None:
            return  # cut off, closing or left out: lost for this backend (health says)
        with self._lock:
            full = self._queued + n > self._max_records
            if not full:
                self._queued += n
        if full:
            self._note_full(n)
            return
        try:
            taken = self._writer.put(tuple(records))
        except ReporterError:  # closed or cut off meanwhile (another thread): lost to it
            taken = False
        if not taken:
            with self._lock:
                self._queued -= n

    def write_history(self, path: Path, size: int, lines: int) -> None:
        """Queue the records of a resumed run that its checkpoint stands for: the first
        ``size`` bytes (``lines`` records) of the record file ``path``, read back and
        written on the backend's thread before anything queued after (never waits)."""
        self._records += lines
        try:
            history = History(path, size, lines)
        except OSError as exc:
            say_unread(self.name, lines, exc)
            return
        with self._lock:
            self._history_left += lines
            self._histories.append(history)
        taken = False
        if self._writer.state is WriterState.OPEN:
            with contextlib.suppress(ReporterError):  # (closed meanwhile: lost to it)
                taken = self._writer.put(history)
        if not taken:
            history.close()
            with self._lock, contextlib.suppress(ValueError):  # (cut off: dropped already)
                self._history_left -= lines
                self._histories.remove(history)

    def flush(self) -> None:
        """Ask the backend's thread to flush it (never waits)."""
        self._check_stall()
        if not self._flush_queued:  # (one at a time: a stuck backend's queue stays small)
            self._flush_queued = True
            self._put(_FLUSH)

    def begin_close(self) -> None:
        """Let the thread write what is queued, then close the backend, without waiting:
        :meth:`close` waits, at most ``timeout_s`` after this call."""
        if self._closing_at is not None:
            return
        self._closing_at = self._clock()
        self._put(_CLOSE)
        self._writer.begin_close()

    def close(self) -> None:
        """Write what is queued, close the backend, stop the thread: at most
        ``timeout_s`` after :meth:`begin_close` (called here if it was not), after which
        the backend is cut off. Never raises for the backend (its health says)."""
        self.begin_close()
        began = self._closing_at if self._closing_at is not None else self._clock()
        deadline = began + self.timeout_s
        try:
            # A call already stuck is cut off at its own bound, not a whole bound later.
            said = False
            while not self._done.wait(_POLL_S) and self._cut is None:
                self._check_stall()
                if self._clock() >= deadline:
                    break
                if not said and self._clock() - began >= _SAY_WAITING_S:
                    said = self._say_waiting(deadline)
            self._writer.close(timeout_s=max(0.0, deadline - self._clock()))
        except BaseException as exc:  # Ctrl-C while waiting for it: it is given up on
            if self._cut is None:
                self._cut_off(f"closing was interrupted ({type(exc).__name__})")
            raise
        self._check_stall()  # a call past its bound, or a thread that died, is named
        if self._cut is None and self._writer.state is WriterState.CLOSED and self._writer_cut():
            call, left = self._call, self._queued + self._history_left
            if call is not None and (call.name != "write" or not left):
                doing = f"{call.name}()"
            else:  # (calls that each returned in time: too many records for the bound)
                doing = f"writing what was queued ({left} record(s) left)"
            self._cut_off(f"{doing} did not finish within {self.timeout_s:g} s of closing")

    def _say_waiting(self, deadline: float) -> bool:
        """Say why the run's finish waits (a Ctrl-C user wonders): for which call, how
        long at most."""
        call = self._call
        doing = f"its {call.name}()" if call is not None else "its queued records"
        left = deadline if call is None else min(deadline, call.started + self.timeout_s)
        logger.warning(
            "waiting at most %.0f s more for backend %r to finish %s (its bound, "
            "backend_timeout_s / --backend-timeout); the run's own files are complete",
            max(0.0, left - self._clock()),
            self.name,
            doing,
        )
        return True

    def cut_off(self, why: str) -> None:
        """Give up on the backend now, unless it is closed or cut off already: its
        queued records are counted lost, and its health says ``why``."""
        if self._cut is None and self._writer.state is not WriterState.CLOSED:
            self._cut_off(why)

    def wait_open(self, timeout_s: float | None = None) -> str | None:
        """Wait until the backend's ``open()`` returned (at most ``timeout_s``, default
        the call bound: then it is cut off); why it failed, or None when it is open."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        if not self._opened.wait(wait) and self._cut is None:
            self._cut_off(f"open() did not return within {wait:g} s")
        if self._cut is not None:
            return self._cut.cut_off
        return self._setup_error

    def health(self) -> BackendHealth:
        """What the backend did with its records so far (see :class:`BackendHealth`)."""
        self._check_stall()
        if self._cut is not None:
            return msgspec.structs.replace(
                self._cut,
                records=self._records,
                records_lost=self._records - self._cut.records_written - self._cut.records_failed,
            )
        return self._health(None)

    def __repr__(self) -> str:
        return f"IsolatedBackend({self.name!r}, {self._writer.state.value})"

    def _put(self, item: _Item) -> None:
        """Queue a call for the thread, unless the writer is no longer open (cut off or
        closing: another thread may have got there between a check and the put)."""
        if self._writer.state is WriterState.OPEN:
            with contextlib.suppress(ReporterError):
                self._writer.put(item)

    # -- bounds ------------------------------------------------------------------------

    def _check_stall(self) -> None:
        """Cut the backend off when its current call has run past ``timeout_s``, or its
        thread died (a ``BaseException`` such as ``SystemExit`` out of the backend)."""
        call = self._call
        if self._cut is not None:
            return
        if self._writer.state is WriterState.FAILED:
            self._cut_off(f"its thread died: {self._writer.failure}")
        elif call is not None and self._clock() - call.started > self.timeout_s:
            self._cut_off(f"{call.name}() did not return within {self.timeout_s:g} s")

    def _writer_cut(self) -> bool:
        """Whether the writer gave up on the thread (closing ran out of time)."""
        return self._writer.failure is not None

    def _cut_off(self, why: str) -> None:
        call = self._call
        if call is not None:  # (the stuck call is the slowest, though it never returned)
            self._slowest = max(self._slowest, self._clock() - call.started)
        self._writer.cut_off(why)
        with self._lock:  # (the writer dropped its queue: the thread never takes them)
            dropped, self._histories = self._histories, []
        for history in dropped:
            history.close()
        if not self._opened.is_set() and self._setup_error is None:
            self._setup_error = why  # never opened: the plugin is left out (summary.json)
        self._opened.set()
        self._cut = self._health(why)
        logger.error(
            "backend %r cut off: %s; %d record(s) handed to it were not written (the "
            "run's own files have them; summary.json says which under 'backends')",
            self.name,
            why,
            self._cut.records_lost,
        )

    def _note_full(self, n: int) -> None:
        self._dropped += 1
        if self._dropped & (self._dropped - 1) == 0:  # the 1st, 2nd, 4th... time
            logger.warning(
                "backend %r is %d record(s) behind, its bound (max_records): %d more not "
                "handed to it (the run's own files have them; %d time(s) so far)",
                self.name,
                self._queued,
                n,
                self._dropped,
            )

    def _health(self, cut_off: str | None) -> BackendHealth:
        written, failed = self._written, self._records_failed
        in_flight = 0 if cut_off else self._queued + self._history_left
        return BackendHealth(
            backend=_name_of(self._backend, self.name),
            isolated=True,
            records=self._records,
            records_written=written,
            records_failed=failed,
            records_lost=max(0, self._records - written - failed - in_flight),
            calls_failed=self._calls_failed,
            slowest_call_seconds=self._slowest,
            cut_off=cut_off,
            setup_error=self._setup_error,
        )

    # -- the backend's thread ------------------------------------------------------------

    def _deliver(self, items: list[_Item]) -> None:
        for item in items:
            if self._cut is not None:
                self._close_abandoned()
                return
            if isinstance(item, tuple):
                with self._lock:
                    self._queued -= len(item)
                if self._setup_error is None:
                    self._timed("write", functools.partial(self._backend.write, item), len(item))
            elif isinstance(item, History):
                self._deliver_history(item)
            elif item == _OPEN:
                error = self._timed("open", self._open_backend, 0)
                self._open_ok = error is None
                if self._cut is None:
                    self._setup_error = error
                self._opened.set()
            elif item == _FLUSH:
                self._flush_queued = False
                if self._setup_error is None:
                    self._timed(item, self._backend.flush, 0)
            elif self._setup_error is None:  # (the close)
                self._close_called = True
                self._timed(item, self._backend.close, 0)
            if item == _CLOSE:
                self._done.set()
        if self._cut is not None and items:
            self._close_abandoned()

    def _deliver_history(self, history: History) -> None:
        """Write a resumed run's history, a batch per call; what is not written when
        the backend is left out or cut off, or cannot be read back, is lost to it (its
        health says). A batch is in flight until its call returned."""
        with self._lock, contextlib.suppress(ValueError):  # (cut off: dropped already)
            self._histories.remove(history)
        left = history.lines  # (this history's, not yet written)
        try:
            for batch in history.batches():
                if self._setup_error is not None or self._cut is not None:
                    break
                self._timed("write", functools.partial(self._backend.write, batch), len(batch))
                left -= len(batch)
                with self._lock:
                    self._history_left -= len(batch)
        except (OSError, RecordError) as exc:
            say_unread(self.name, left, exc)
        finally:
            history.close()
            with self._lock:
                self._history_left -= left

    def _close_abandoned(self) -> None:
        """The call that ran past its bound returned after all (on this thread, which the
        run no longer waits for): close the backend once, so that what its ``open()`` set
        up (a tracking run, a service) does not stay open; its failure is only logged."""
        if self._close_called or not self._open_ok:
            return
        self._close_called = True
        try:
            self._backend.close()
        except Exception as exc:
            logger.warning("backend %r, cut off, failed to close afterwards: %s", self.name, exc)

    def _open_backend(self) -> None:
        getattr(self._backend, "open")()  # noqa: B009 - optional in the protocol

    def _timed(self, call: str, fn: Callable[[], object], records: int) -> str | None:
        """Run one call of the backend under the bound; why it failed, or None."""
        started = self._clock()
        self._call = _Call(call, started)
        try:
            fn()
        except Exception as exc:
            if self._cut is None:
                self._failed(call, records, exc)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._call = None
            self._slowest = max(self._slowest, self._clock() - started)
        if self._cut is None:
            self._written += records
        return None

    def _failed(self, call: str, records: int, exc: Exception) -> None:
        """Count a failed call; log it (no traceback for twinkle's own: it says the fix)."""
        self._calls_failed += 1
        self._records_failed += records
        n = self._calls_failed
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th... failure
            logger.error(
                "backend %r failed in %s(%s), skipped (%d failure(s) so far; the run's own "
                "files are unaffected): %s",
                self.name,
                call,
                f"{records} record(s)" if call == "write" else "",
                n,
                exc,
                exc_info=exc if n == 1 and not isinstance(exc, TwinkleError) else None,
            )


def _name_of(backend: object, default: str) -> str:
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) and name else default


def check_backend_timeout(timeout_s: object) -> float:
    """``timeout_s`` as a bound on a backend's call, or an error naming it and the fix."""
    return check_seconds(
        "backend_timeout_s",
        timeout_s,
        zero_ok=False,
        means="how long one call of a plugin's backend may take before it is cut off; "
        "twinkle demo --backend-timeout; e.g. 30",
    )
