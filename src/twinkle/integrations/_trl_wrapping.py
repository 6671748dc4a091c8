"""What an observed ``train()`` puts into the trainer and takes out again: the methods it
wraps (:class:`MethodWraps`), and the spans of the step in progress that open in one
callback and close in another (:class:`StepSpans`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any

from twinkle.perf import SpanContext

__all__ = ["NO_EXC", "ExcInfo", "MethodWraps", "StepSpans"]

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
NO_EXC: ExcInfo = (None, None, None)
_MISSING = object()


class MethodWraps:
    """Methods of objects (the trainer, its accelerator) replaced by wrappers, each put
    back by :meth:`restore` as it was: the object's own attribute restored, else removed
    (its class's method shows through again)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(
        self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        """``owner.name`` replaced by ``make(owner.name)``."""
        original = getattr(owner, name)
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def restore(self) -> None:
        """Every wrapped method as it was (the last wrapped first)."""
        while self._saved:
            owner, name, saved = self._saved.pop()
            if saved is _MISSING:
                owner.__dict__.pop(name, None)
            else:
                setattr(owner, name, saved)


class StepSpans:
    """The spans of the step in progress, by name. (It holds no reference to the run
    that makes them: the run, and its trainer, are freed when they are dropped.)"""

    #: the step's spans, innermost first (the order :meth:`close` ends them in)
    NAMES = ("train.step", "train.optimizer", "step")

    def __init__(self) -> None:
        self.open: dict[str, SpanContext] = {}

    def enter(self, span: SpanContext) -> None:
        """``span`` entered, until :meth:`leave` (by its name) or :meth:`close`."""
        span.__enter__()
        self.open[span.name] = span

    def leave(self, name: str, exc_info: ExcInfo = NO_EXC) -> None:
        span = self.open.pop(name, None)
        if span is not None:
            span.__exit__(*exc_info)

    def close(self, exc_info: ExcInfo = NO_EXC) -> None:
        """End every span of the step still open, innermost first."""
        for name in self.NAMES:
            self.leave(name, exc_info)
