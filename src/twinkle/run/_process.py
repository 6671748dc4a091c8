"""What ties a started :class:`~twinkle.run.RunSession` to the process that started it:
a run still going when the interpreter exits is finished (with an ``error`` status),
and a forked child's copy forgets the run (the parent owns its files, threads and
lock; :mod:`twinkle.forks`)."""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from twinkle.forks import forget_in_child

__all__ = ["tie"]

log = logging.getLogger("twinkle.session")


class _Tied(Protocol):
    run_id: str

    def _running_here(self) -> bool: ...

    def finish(self, *, status: Any = ..., error: str | None = ...) -> Any: ...

    def _forget_in_child(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()


def tie(session: _Tied) -> Callable[[], None]:
    """Tie ``session`` (started) to this process; returns the function that unties it
    (once it finished, or in a forked child)."""
    ref = weakref.ref(session)

    def finish_at_exit() -> None:
        run = ref()
        if run is None or not run._running_here():
            return
        try:
            run.finish(status="error", error="the process exited without finishing the run")
        except Exception:
            log.exception("run %r: finishing at interpreter exit failed", run.run_id)

    def untie() -> None:
        atexit.unregister(finish_at_exit)
        tied = ref()
        if tied is not None:
            _live.discard(tied)

    atexit.register(finish_at_exit)
    forget_in_child(_forget_sessions_in_child)
    _live.add(session)
    return untie


def _forget_sessions_in_child() -> None:
    for session in list(_live):
        session._forget_in_child()
    _live.clear()
