"""A plugin's hook calls on a thread of its own, each bounded in time.

A third-party observer's hook that never returns (a lock the trainer holds, a server
that never answers) would hold the dispatch thread, and with it every iteration
boundary, forever. So :class:`HookRunner` makes each call of one plugin's hooks on that
plugin's own thread, while the calling thread (the dispatch thread, or a publisher
dispatching inline) waits for it, at most ``timeout_s``: the calls still run one at a
time, in order, and their results come back as before, so the records, the log and a
replay are what they were. A call past its time raises :class:`HookTimeout` on the
waiting thread (the plugin is then cut off: :class:`~twinkle.plugins.HookCalls`); the
call itself runs on, on its own thread, and whatever it does after is ignored.

While a hook runs on its plugin's thread, that thread *acts for* the dispatching one
(:func:`twinkle.threads.acting_ident`) as long as that one waits: a hook publishing an
event is queued behind the current one, as when it ran on the dispatching thread
itself. A wait a signal's exception leaves (Ctrl-C) gives up on the call too: the
plugin's next call fails at once, naming the hook that did not return. A
``SystemExit`` or ``KeyboardInterrupt`` the plugin raises there comes back as
:class:`PluginExit`, a failure like any other: it is the plugin's, not a signal's (a
signal reaches the main thread, waiting here, as it did before). A child process a
hook forks has this thread as its only one: it ends when its hook exits or returns,
never serving the parent's calls.

Thread-safety: one caller at a time (the dispatcher calls observers one at a time).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from twinkle.threads import acting_for, acting_ident

__all__ = ["HookRunner", "HookTimeout", "PluginExit"]


class HookTimeout(Exception):
    """A plugin's hook call did not return within its time."""


class PluginExit(Exception):
    """A plugin's hook raised ``SystemExit`` or ``KeyboardInterrupt`` on its own thread."""


class _Call:
    __slots__ = ("args", "done", "error", "function", "ident", "left", "result")

    def __init__(self, function: Callable[..., Any], args: tuple[Any, ...], ident: int) -> None:
        self.function, self.args, self.ident = function, args, ident
        self.done = threading.Event()
        self.left = threading.Event()  # the caller stopped waiting
        self.result: Any = None
        self.error: BaseException | None = None


class HookRunner:
    """The hook calls of plugin ``plugin``, on its thread (started at its first call,
    again in a forked child), each waited for at most ``timeout_s`` seconds."""

    __slots__ = ("_calls", "_pid", "abandoned", "plugin", "timeout_s")

    def __init__(self, plugin: str, timeout_s: float) -> None:
        self.plugin = plugin
        self.timeout_s = timeout_s
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._pid: int | None = None  # the process its thread runs in
        #: the hook whose call was given up on (its time ran out, or a signal's
        #: exception left the wait): its thread is left to it, no call is made again
        self.abandoned: str | None = None

    def call(self, hook: str, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``, the plugin's ``hook``, on the plugin's thread: its result,
        or what it raised (:class:`PluginExit` for an exit); :class:`HookTimeout` past
        ``timeout_s``, or at once after a call that was given up on."""
        if self.abandoned is not None:
            raise HookTimeout(f"its {self.abandoned} never returned")
        if self._pid != os.getpid():
            self._start()
        call = _Call(function, args, acting_ident())
        self._calls.put(call)
        try:
            done = call.done.wait(self.timeout_s)
        finally:
            call.left.set()
            if not call.done.is_set():  # (past its time, or a signal's exception)
                self.abandoned = hook
        if not done:
            raise HookTimeout(f"its {hook} did not return within {self.timeout_s:g} s")
        if call.error is not None:
            raise call.error
        return call.result

    def close(self) -> None:
        """Let the plugin's thread end (once its call in progress, if any, returns)."""
        if self._pid == os.getpid():
            self._calls.put(None)
            self._pid = None

    def _start(self) -> None:
        self._calls = queue.SimpleQueue()  # (a forked child's: its parent's thread is gone)
        self._pid = os.getpid()
        name = f"twinkle plugin {self.plugin}"
        threading.Thread(target=self._serve, args=(self._calls,), name=name, daemon=True).start()

    def _serve(self, calls: queue.SimpleQueue[_Call | None]) -> None:
        pid = os.getpid()
        while (call := calls.get()) is not None:
            try:
                with acting_for(call.ident, call.left):
                    call.result = call.function(*call.args)
            except (SystemExit, KeyboardInterrupt) as exc:
                if os.getpid() != pid:
                    _end_child(exc)  # (a child the hook forked, exiting: as it asked)
                call.error = PluginExit(f"{type(exc).__name__}({exc}) on its own thread")
            except BaseException as exc:
                call.error = exc
            if os.getpid() != pid:
                _end_child(None)  # (a child the hook forked, its hook done: it ends)
            call.done.set()
            if self.abandoned:
                return  # (its call came too late: nothing more is asked of it)


def _end_child(exc: BaseException | None) -> NoReturn:
    """End a child process a plugin's hook forked, on this thread, its only one: with
    the status its ``SystemExit`` asked for (130 for a ``KeyboardInterrupt``; 0 once the
    hook returned), its output flushed. It never serves the parent's hook calls."""
    code = 0
    if isinstance(exc, KeyboardInterrupt):
        code = 130
    elif isinstance(exc, SystemExit) and exc.code is not None:
        code = exc.code if isinstance(exc.code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
