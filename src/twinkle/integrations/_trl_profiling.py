"""TRL's (and ms-swift's) ``profiling_context`` with a twinkle span inside, for observed
trainers only.

TRL times its hot functions with ``profiling_context(trainer, name)`` (directly, and
through ``profiling_decorator``) and sends the timings only to wandb, mlflow and
trackio; ms-swift has its own function of the same name and use (wandb, swanlab). While
at least one run observes a trainer, :data:`PROFILING` (TRL's) and
:data:`SWIFT_PROFILING` put a wrapper in the place of that function in every loaded
module of the library that imported it. For a trainer carrying an observer (the
attribute :data:`OBSERVER_ATTRIBUTE`), the wrapper opens a span named as the library
names the timing (``<trainer class>.<name>``), inside the library's own timing. Other
trainers get the library's context unchanged.

The modules' attributes belong to the whole process, so each wrapper is counted in and
out: the last run to end puts the library's function back (the one module-level state
of twinkle; docs/architecture.md).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType, TracebackType
from typing import Any, Protocol

from twinkle.perf import SpanContext

__all__ = [
    "OBSERVER_ATTRIBUTE",
    "PROFILING",
    "SWIFT_PROFILING",
    "ProfiledTrainer",
    "ProfilingPatch",
]

#: The trainer's attribute holding the run that observes it (while one does).
OBSERVER_ATTRIBUTE = "_twinkle_observed"


class ProfiledTrainer(Protocol):
    """What :data:`OBSERVER_ATTRIBUTE` holds."""

    def profiling_span(self, name: str) -> SpanContext:
        """The span for TRL's profiling context ``name`` (``Trainer.method``)."""
        ...


class ProfilingPatch:
    """The wrapper of one library's ``profiling_context``: defined in ``module``,
    imported by the modules of ``package``; ``named(context, trainer, name)`` is the
    span's name for a context the library made."""

    def __init__(self, module: str, package: str, named: Callable[[Any, Any, str], str]) -> None:
        self._module = module
        self._package = package
        self._named = named
        self._lock = threading.Lock()
        self._users = 0
        self._original: Callable[[Any, str], Any] | None = None

    def acquire(self) -> bool:
        """Count one more run in, and wrap every loaded module's ``profiling_context``
        (modules loaded since the last call too); False when the library's profiling
        module is not loaded (a plain transformers Trainer)."""
        with self._lock:
            original = self._original or getattr(
                sys.modules.get(self._module), "profiling_context", None
            )
            if original is None:
                return False
            self._original = original  # kept once found: a call in flight still uses it
            for module in self._modules():
                if getattr(module, "profiling_context", None) is original:
                    setattr(module, "profiling_context", self._context)  # noqa: B010
            self._users += 1
            return True

    def release(self) -> None:
        """Count one run out; the last one puts the library's function back in every
        module holding the wrapper (also those imported while it was in place)."""
        with self._lock:
            self._users -= 1
            if self._users:
                return
            for module in self._modules():
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
        return _Profiled(inner, observer.profiling_span(self._named(inner, trainer, name)))

    def _modules(self) -> Iterator[ModuleType]:
        package, prefix = self._package, f"{self._package}."
        for name, module in list(sys.modules.items()):
            if name == package or name.startswith(prefix):
                yield module


class _Profiled:
    """The library's profiling context with a twinkle span inside it (same name)."""

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


#: TRL's wrapper in the process: its contexts carry their name (``Trainer.method``).
PROFILING = ProfilingPatch("trl.extras.profiling", "trl", lambda context, _t, _n: context.name)
#: ms-swift's (a generator context): named as swift names its timing metric.
SWIFT_PROFILING = ProfilingPatch(
    "swift.rlhf_trainers.utils",
    "swift",
    lambda _c, trainer, name: f"{type(trainer).__name__}.{name}",
)
