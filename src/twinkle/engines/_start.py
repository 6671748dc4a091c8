"""What an engine and its start see: the ``Engine`` protocol, ``StartContext`` and the
errors of a start.

A factory (:data:`EngineFactory`) receives a :class:`StartContext` from
:class:`~twinkle.engines.EnginePool` and returns an :class:`Engine`; this module holds that
contract, so engine adapters depend on it and not on the pool that runs them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from twinkle.errors import EngineStartError

__all__ = [
    "Engine",
    "EngineFactory",
    "EngineStartCancelled",
    "EngineStartTimeout",
    "StartContext",
]


@runtime_checkable
class Engine(Protocol):
    """What the pool needs of an engine handle: a name and a way to stop it.

    An engine may also have ``kill()``: stop at once, whatever it costs (SIGKILL), from
    any thread, while ``shutdown()`` may still be running. The pool calls it only when
    ``shutdown()`` overran ``shutdown_timeout_s``.
    """

    @property
    def name(self) -> str: ...

    def shutdown(self) -> None:
        """Stop the engine and free what it holds (processes, ports, memory)."""


E = TypeVar("E", bound=Engine)


class EngineStartTimeout(EngineStartError, TimeoutError):
    """An engine did not start within ``start_timeout_s``."""


class EngineStartCancelled(EngineStartError):
    """Raised by a factory that stopped because :attr:`StartContext.cancelled` was set."""


@dataclass(frozen=True, slots=True)
class StartContext:
    """Handed to each factory: which engine to start and when to give up.

    Long initialisations should poll :meth:`check_cancelled` (or wait on
    ``cancelled``) so that a failure elsewhere or a timeout stops them promptly.
    """

    name: str
    index: int  # position of the engine in the mapping given to start()
    cancelled: threading.Event = field(repr=False)
    deadline_monotonic_s: float | None  # time.monotonic() at which the pool gives up

    def remaining_s(self) -> float | None:
        """Seconds left before the start timeout (``None``: no timeout); never negative."""
        if self.deadline_monotonic_s is None:
            return None
        return max(0.0, self.deadline_monotonic_s - time.monotonic())

    def check_cancelled(self) -> None:
        """Raise :class:`EngineStartCancelled` if the pool has given up on this start."""
        if self.cancelled.is_set():
            raise EngineStartCancelled(f"start of engine {self.name!r} was cancelled by the pool")


EngineFactory = Callable[[StartContext], E]
"""Builds and starts one engine; returns once the engine is ready to serve."""
