"""The current recorder: which :class:`~twinkle.perf.TimeRecorder` module-level
:func:`span` and :func:`timed` record into.

:func:`use_recorder` selects one for a context (a thread or an asyncio task),
:func:`bind_process_recorder` one for the whole process (a run session binds its own
while it runs); without either, the process default recorder, made on first use. The
look-up itself (:func:`~twinkle.perf.current_recorder`) and the state it reads live in
:mod:`twinkle.perf.timer`, where ``@timed`` needs them too.

:func:`span` and :func:`timed` are hot paths (``bench/bench_perf.py``): ``span``
repeats the look-up and the fast path of :meth:`TimeRecorder.span` inline, since one
more call would cost about a tenth of a span.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ParamSpec, TypeVar, overload

from twinkle.errors import InvalidArgumentError
from twinkle.perf._span import Barrier, SpanContext
from twinkle.perf.timer import (
    TimeRecorder,
    current_var,
    make_process_recorder,
    process_state,
    timed_for,
)

__all__ = [
    "bind_process_recorder",
    "use_recorder",
    "span",
    "timed",
]

P = ParamSpec("P")
R = TypeVar("R")

_current_get = current_var.get


def _rebind() -> None:
    bound = process_state.bound
    process_state.recorder = (
        bound[0] if len(bound) == 1 else None if bound else process_state.default
    )


def bind_process_recorder(recorder: TimeRecorder) -> Callable[[], None]:
    """Route module-level :func:`span`/:func:`timed` to ``recorder`` on every thread that
    has no :func:`use_recorder` of its own, until the returned function is called.

    A run session binds its recorder while it runs, so the convenience functions reach
    the run's log from any thread. While two recorders are bound (two runs in one
    process) a module-level span is ambiguous and raises an error that says how to pick
    the run. Unbinding restores what was current before.
    """
    if not isinstance(recorder, TimeRecorder):
        raise InvalidArgumentError(f"recorder must be a TimeRecorder, got {recorder!r}")
    with process_state.lock:
        process_state.bound.append(recorder)
        _rebind()

    def release() -> None:
        with process_state.lock:
            if recorder in process_state.bound:
                process_state.bound.remove(recorder)
                _rebind()

    return release


def use_recorder(recorder: TimeRecorder) -> AbstractContextManager[TimeRecorder]:
    """Make ``recorder`` the current recorder inside the ``with`` block (this context).

    Contexts are per thread and per asyncio task: tasks created inside the block
    inherit it, threads started inside it do not.
    """
    if not isinstance(recorder, TimeRecorder):
        raise InvalidArgumentError(
            f"recorder must be a TimeRecorder, got {recorder!r}; e.g. use_recorder(TimeRecorder())"
        )
    return _using(recorder)


@contextmanager
def _using(recorder: TimeRecorder) -> Iterator[TimeRecorder]:
    token = current_var.set(recorder)
    try:
        yield recorder
    finally:
        current_var.reset(token)


def span(name: str, /, *, sync: Barrier | None = None, **attrs: Any) -> SpanContext:
    """:meth:`TimeRecorder.span` on the :func:`~twinkle.perf.current_recorder`."""
    recorder = _current_get()
    if recorder is None:
        recorder = process_state.recorder
        if recorder is None:
            recorder = make_process_recorder()
    # The fast path of TimeRecorder.span, repeated: one more call would cost ~10%.
    if name.__class__ is not str or not name or sync is not None:
        return recorder._open(name, sync, attrs)
    context = recorder._span_type()
    context._name = name
    context._attrs = attrs or None
    return context


@overload
def timed(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def timed(
    name: str | None = None, /, *, sync: Barrier | None = None, **attrs: Any
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def timed(
    name: str | Callable[..., Any] | None = None,
    /,
    *,
    sync: Barrier | None = None,
    **attrs: Any,
) -> Any:
    """:meth:`TimeRecorder.timed` recording into the
    :func:`~twinkle.perf.current_recorder` of each call.

    The recorder is looked up when the function is called, not when it is decorated,
    so decorating at import creates nothing.
    """
    return timed_for(None, name, sync, attrs)
