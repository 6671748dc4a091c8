"""Which thread a thread acts for.

A third-party plugin's hook runs on a thread of the plugin's own while the thread that
dispatches the event waits for it (``twinkle.plugins._isolation``). For the time of that
call, the hook's thread is taken for the waiting one by whatever asks which thread
calls (:func:`acting_ident`): the dispatcher queueing an event the hook publishes behind
the current one, a writer refusing a call that would wait for itself. Once the waiting
thread stopped waiting (the call ran past its time, or a signal's exception left the
wait), the hook's thread acts for itself again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["acting_for", "acting_ident", "wait_for_caller"]

_acting = threading.local()


def acting_ident() -> int:
    """The ident of the thread this one acts for (see the module doc), else its own."""
    waiting: tuple[int, threading.Event] | None = getattr(_acting, "waiting", None)
    if waiting is None or waiting[1].is_set():
        return threading.get_ident()
    return waiting[0]


def wait_for_caller(timeout_s: float) -> bool:
    """On a thread acting for another: wait until that one stopped waiting for it (its
    call ran past its time, or a signal's exception left the wait), at most
    ``timeout_s``; whether it did. At once False on a thread acting for none."""
    waiting: tuple[int, threading.Event] | None = getattr(_acting, "waiting", None)
    return waiting is not None and waiting[1].wait(timeout_s)


@contextlib.contextmanager
def acting_for(ident: int, left: threading.Event) -> Iterator[None]:
    """Act for thread ``ident`` while it waits (until ``left`` is set)."""
    _acting.waiting = (ident, left)
    try:
        yield
    finally:
        _acting.waiting = None
