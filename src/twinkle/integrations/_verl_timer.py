"""verl's timers with a twinkle span around each, while a run is open in the process.

Every timer of verl (``marked_timer`` in its NVTX, MSTX and plain forms, and
``simple_timer``) times its block with the generator
``verl.utils.profiler.performance._timer``, looked up in that module at each call. While
at least one run is open, :data:`TIMERS` puts a generator of its own in its place: it
opens the newest open run's span of the timer's name (:meth:`VerlTimed.timed`) around
verl's own timing, so the span holds verl's ``timing_s/<name>`` and the microseconds of
verl's bookkeeping. With no run open verl's generator is back in its place.

The module's attribute belongs to the whole process: the open runs are counted in and
out (the one module-level state of twinkle, as TRL's profiling wrapper;
docs/architecture.md).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["TIMERS", "VerlTimed"]

_MODULE = "verl.utils.profiler.performance"


class VerlTimed(Protocol):
    """What :data:`TIMERS` opens a span with: an open run."""

    def timed(self, name: str) -> AbstractContextManager[None]:
        """The span of verl's timer ``name``."""
        ...


class _TimerPatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[VerlTimed] = []
        self._original: Callable[[str, dict[str, float]], Iterator[None]] | None = None

    def acquire(self, run: VerlTimed) -> None:
        """Count ``run`` in; the first puts the wrapper in verl's place."""
        module: Any = importlib.import_module(_MODULE)
        with self._lock:
            if not self._runs:
                self._original = module._timer
                module._timer = self._timer
            self._runs.append(run)

    def release(self, run: VerlTimed) -> None:
        """Count ``run`` out; the last puts verl's generator back."""
        with self._lock:
            if run not in self._runs:
                return
            self._runs.remove(run)
            if not self._runs:
                module: Any = importlib.import_module(_MODULE)
                if module._timer == self._timer:
                    module._timer = self._original

    def _timer(self, name: str, timing_raw: dict[str, float]) -> Iterator[None]:
        original, runs = self._original, self._runs
        if original is None:  # pragma: no cover - only reachable through acquire()
            raise RuntimeError("twinkle's wrapper of verl's timer was not installed")
        if not runs:  # (a timer begun as the last run ended)
            yield from original(name, timing_raw)
            return
        with runs[-1].timed(name):
            yield from original(name, timing_raw)


#: The one wrapper of the process.
TIMERS = _TimerPatch()
