"""Finish a run when the process is asked to stop.

Python turns Ctrl-C (SIGINT) into :class:`KeyboardInterrupt`, which unwinds ``with
RunSession(...)`` blocks: the run ends with ``run_finished`` (status ``error``), its
``summary.json`` and a complete ``trace.json``. SIGTERM (``kill``, a batch scheduler's
time limit, ``docker stop``) and SIGHUP (the terminal closed) kill the process outright
instead, leaving a log without its end, no summary and an empty trace. Inside
:func:`finish_on_signals` all three unwind the same way::

    from twinkle.run import RunSession, finish_on_signals

    with finish_on_signals(), RunSession(out_dir="runs", config=config) as run:
        train(run)

Policy, signal by signal (SIGINT, SIGTERM and SIGHUP unless ``signals=`` says otherwise):

* only a signal whose handler is the default one is taken over: ``SIG_DFL``, or Python's
  own :func:`signal.default_int_handler` for SIGINT. A handler of your own, and a signal
  set to be ignored (``nohup`` ignores SIGHUP, a shell's background job SIGINT), are left
  as they are;
* the first signal raises :class:`SignalInterrupt` (a :class:`KeyboardInterrupt`, so
  code that already cleans up after Ctrl-C does so after ``kill`` too) in the main thread;
* every later one, while that exception unwinds and the run writes its summary and
  trace, is ignored with a one-line message on stderr, so a second Ctrl-C cannot abort
  the finish half-way; SIGQUIT (Ctrl-\\) or SIGKILL still end the process at once. This
  holds until the ``with`` block exits, also when your code catches the exception;
* a first signal whose exception Python drops (its handler ran inside a ``__del__``, a
  weakref or garbage-collector callback, where an exception is only printed as
  "Exception ignored in ...") is sent again to the main thread, so that it raises where
  the code runs: without it the run would train on with every later signal ignored;
* on exit the previous handlers are restored (a handler you installed inside the block
  is kept).

Python delivers signals to the main thread only, so the context manager must be entered
there (:class:`~twinkle.errors.TwinkleError` otherwise).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import Any, final

from twinkle.errors import InvalidArgumentError, TwinkleError

__all__ = ["DEFAULT_SIGNALS", "SignalGuard", "SignalInterrupt", "finish_on_signals"]

#: The signals :func:`finish_on_signals` turns into :class:`SignalInterrupt` by default.
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
_UNCATCHABLE = frozenset(getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n))


class SignalInterrupt(KeyboardInterrupt):
    """The process got a signal that asks it to stop (SIGINT, SIGTERM, SIGHUP).

    ``signum`` is the signal; :attr:`exit_code` the shell's convention for a process it
    ended (128 + the signal number: 130, 143, 129).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"{self.signal_name} (signal {self.signum}): the process was asked to stop"


def signal_name(signum: int) -> str:
    """``'SIGTERM'`` for 15; ``'signal 99'`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _is_default(signum: int, handler: Any) -> bool:
    if handler == signal.SIG_DFL:
        return True
    return signum == signal.SIGINT and handler is signal.default_int_handler


def _check_signals(signals: Iterable[int]) -> tuple[int, ...]:
    if isinstance(signals, int | str | bytes) or not isinstance(signals, Iterable):
        raise InvalidArgumentError(
            f"finish_on_signals: signals must be an iterable of signal numbers, got "
            f"{signals!r}; pass e.g. signals=[signal.SIGTERM]"
        )
    checked: list[int] = []
    valid = set(signal.valid_signals())
    for s in signals:
        if isinstance(s, bool) or not isinstance(s, int) or s not in valid:
            raise InvalidArgumentError(
                f"finish_on_signals: {s!r} is not a signal number; pass members of "
                "signal.Signals such as signal.SIGTERM"
            )
        if s in _UNCATCHABLE:
            raise InvalidArgumentError(
                f"finish_on_signals: {signal_name(s)} cannot be caught by any process; leave it out"
            )
        if s not in checked:
            checked.append(s)
    return tuple(checked)


def _say(message: str) -> None:
    # A signal handler may run while the main thread is inside a write to sys.stderr;
    # writing to the file descriptor avoids re-entering that buffer.
    with contextlib.suppress(OSError):
        os.write(2, message.encode("utf-8", "replace"))


@final
class SignalGuard:
    """The context manager :func:`finish_on_signals` returns.

    ``handled``: the signals it took over (see the module's policy); ``received``: the
    first of them the process got (None: none yet); ``ignored``: how many came after it.
    """

    __slots__ = (
        "_entered",
        "_hook",
        "_previous",
        "_signals",
        "handled",
        "ignored",
        "received",
    )

    def __init__(self, signals: Iterable[int]) -> None:
        self._signals = _check_signals(signals)
        self._previous: dict[int, Any] = {}
        self._entered = False
        #: the unraisable hook this guard wraps while it is entered
        self._hook: Any = None
        self.handled: tuple[int, ...] = ()
        self.received: int | None = None
        self.ignored = 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            raise SignalInterrupt(signum)
        self.ignored += 1
        _say(
            f"twinkle: {signal_name(signum)} again, ignored: the run is finishing (writing "
            f"its summary and trace); Ctrl-\\ (SIGQUIT) or kill -9 {os.getpid()} abandons it\n"
        )

    def _unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook`` while entered: this guard's interrupt dropped where
        Python cannot raise is sent again, from another thread (here, in that callback,
        it would be dropped again); anything else goes to the hook it wraps."""
        exc = unraisable.exc_value
        if not isinstance(exc, SignalInterrupt) or exc.signum != self.received:
            self._hook(unraisable)
            return
        self.received = None  # (it never reached the code: the next one raises)
        _say(
            f"twinkle: {exc.signal_name} arrived where Python drops exceptions "
            f"({unraisable.err_msg or 'Exception ignored in'} {unraisable.object!r:.80}); "
            "sending it again\n"
        )
        _resend(exc.signum)

    def __enter__(self) -> SignalGuard:
        if self._entered:
            raise TwinkleError("this finish_on_signals() guard was entered already; make a new one")
        if threading.current_thread() is not threading.main_thread():
            raise TwinkleError(
                "finish_on_signals() must be entered in the main thread: Python delivers "
                "signals only there; enter it around the main thread's run"
            )
        self._entered = True
        handled = []
        try:
            for signum in self._signals:
                current = signal.getsignal(signum)
                if _is_default(signum, current):
                    signal.signal(signum, self._handle)
                    self._previous[signum] = current
                    handled.append(signum)
        except BaseException:
            self._restore()
            raise
        self.handled = tuple(handled)
        if handled:
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:  # not replaced inside the block
                signal.signal(signum, previous)
        self._previous.clear()
        if self._hook is not None and sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._hook
        self._hook = None


#: how long after a dropped interrupt it is sent again: the callback that dropped it
#: (a ``__del__``, the hook itself) has returned by then
RESEND_S = 0.05


def _resend(signum: int) -> None:
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(RESEND_S, signal.pthread_kill, (main, signum))
    timer.daemon = True
    timer.start()


def finish_on_signals(signals: Iterable[int] = DEFAULT_SIGNALS) -> SignalGuard:
    """A context manager under which SIGINT, SIGTERM and SIGHUP (or ``signals``) raise
    :class:`SignalInterrupt` in the main thread once, then are ignored with a message
    until it exits, so that ``with RunSession(...)`` blocks inside it finish their run.
    Handlers that are not the defaults are left alone; see the module for the policy."""
    return SignalGuard(signals)
