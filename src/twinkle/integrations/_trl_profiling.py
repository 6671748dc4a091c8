"""TRL's ``profiling_context`` with a twinkle span inside, for observed trainers only.

TRL times its hot functions with ``profiling_context(trainer, name)`` (directly, and
through ``profiling_decorator``) and sends the timings only to wandb, mlflow and
trackio. While at least one run observes a trainer, :data:`PROFILING` puts a wrapper in
the place of that function in every loaded ``trl`` module that imported it. For a
trainer carrying an observer (the attribute :data:`OBSERVER_ATTRIBUTE`), the wrapper
opens a span of the same name, inside TRL's own timing. Other trainers get TRL's
context unchanged.

The modules' attributes belong to the whole process, so the wrapper is counted in and
out: the last run to end puts TRL's function back (the one module-level state of
twinkle; docs/architecture.md).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType, TracebackType
from typing import Any, Protocol

from twinkle.perf import SpanContext

__all__ = ["OBSERVER_ATTRIBUTE", "PROFILING", "ProfiledTrainer"]

#: The trainer's attribute holding the run that observes it (while one does).
OBSERVER_ATTRIBUTE = "_twinkle_observed"
_MODULE = "trl.extras.profiling"


class ProfiledTrainer(Protocol):
    """What :data:`OBSERVER_ATTRIBUTE` holds."""

    def profiling_span(self, name: str) -> SpanContext:
        """The span for TRL's profiling context ``name`` (``Trainer.method``)."""
        ...


class _ProfilingPatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._original: Callable[[Any, str], Any] | None = None

    def acquire(self) -> bool:
        """Count one more run in, and wrap every loaded ``trl`` module's
        ``profiling_context`` (modules loaded since the last call too); False when TRL's
        profiling module is not loaded (a plain transformers Trainer)."""
        with self._lock:
            original = self._original or getattr(
                sys.modules.get(_MODULE), "profiling_context", None
            )
            if original is None:
                return False
            self._original = original  # kept once found: a call in flight still uses it
            for module in _trl_modules():
                if getattr(module, "profiling_context", None) is original:
                    setattr(module, "profiling_context", self._context)  # noqa: B010
            self._users += 1
            return True

    def release(self) -> None:
        """Count one run out; the last one puts TRL's function back in every module
        holding the wrapper (also those imported while it was in place)."""
        with self._lock:
            self._users -= 1
            if self._users:
                return
            for module in _trl_modules():
                if getattr(module, "profiling_context", None) == self._context:
                    setattr(module, "profiling_context", self._original)  # noqa: B010

    def _context(self, trainer: Any, name: str) -> Any:
        original = self._original
        if original is None:  # pragma: no cover - only reachable through acquire()
            raise RuntimeError("twinkle's profiling_context wrapper was not installed")
        inner = original(trainer, name)
        observer = getattr(trainer, "__dict__", {}).get(OBSERVER_ATTRIBUTE)
        if observer is None:
            return inner
        return _Profiled(inner, observer.profiling_span(inner.name))


def _trl_modules() -> Iterator[ModuleType]:
    for name, module in list(sys.modules.items()):
        if name == "trl" or name.startswith("trl."):
            yield module


class _Profiled:
    """TRL's profiling context with a twinkle span inside it (same name)."""

    __slots__ = ("_inner", "_span")

    def __init__(self, inner: Any, span: SpanContext) -> None:
        self._inner = inner
        self._span = span

    def __enter__(self) -> Any:
        entered = self._inner.__enter__()
        self._span.__enter__()  # (reads the clock: cannot leave TRL's context open)
        return entered

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        try:
            self._span.__exit__(exc_type, exc, tb)
        finally:
            suppressed = self._inner.__exit__(exc_type, exc, tb)
        return suppressed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


#: The one wrapper of the process.
PROFILING = _ProfilingPatch()
