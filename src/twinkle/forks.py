"""The one after-fork registry: what a forked child forgets of its parent.

A child made by ``fork`` inherits a copy of the parent's run directory locks, time
recorders and run sessions, with their pid, queued spans and threads. None of it is the
child's: the parent still owns the files and drains the spans. Each module that holds
such state registers a *forget* function here the first time it holds some (never at
import); the registry installs one ``os.register_at_fork`` hook with the first one and,
in a forked child, calls each function once, in the order they were registered.

With the process recorder (:mod:`twinkle.perf.timer`) and the integrations' patched
library functions, this registry is the module-level state twinkle keeps
(docs/architecture.md, "Processes").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["forget_in_child"]


class _Registry:
    """The registered functions; mutated in place rather than through ``global``."""

    __slots__ = ("forgets", "lock")

    def __init__(self) -> None:
        self.forgets: list[Callable[[], None]] = []
        self.lock = threading.Lock()


_registry = _Registry()


def forget_in_child(forget: Callable[[], None]) -> None:
    """Call ``forget`` in every child this process forks from now on, after the fork
    (registering the same function again does nothing)."""
    forgets = _registry.forgets
    if forget in forgets:
        return
    with _registry.lock:
        if forget in forgets:
            return
        if not forgets and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        forgets.append(forget)


def _after_fork_in_child() -> None:
    _registry.lock = threading.Lock()  # another of the parent's threads may have held it
    for forget in list(_registry.forgets):
        forget()
