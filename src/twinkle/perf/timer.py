"""Spans: ``TimeRecorder``, ``span`` and ``@timed`` record named intervals of one clock.

A span is opened by ``with recorder.span("name"):`` (or a call of a ``@timed``
function) and recorded when it closes, also when it closes by exception. Finished
spans queue in the recorder until :meth:`TimeRecorder.drain` takes them out.

The queue is a :class:`collections.deque` of plain tuples: its ``append`` and
``popleft`` are atomic, so spans closing on many threads never race with a drain (a
list swap would lose the appends that land between the read and the swap). Nesting is
not tracked: it follows from the thread id and the intervals. See ``_span`` for why
the hot path looks the way it does.

This module also holds what the recorders of a process share (:data:`process_state`,
:data:`current_var`) and the look-up of the current recorder, because
:class:`TimeRecorder`, ``@timed`` and that look-up need each other: a recorder's
``timed`` and the module-level one share one decorator, which falls back to the process
recorder, made here on first use. Choosing the current recorder
(:func:`~twinkle.perf.use_recorder`, :func:`~twinkle.perf.bind_process_recorder`) and
the module-level :func:`~twinkle.perf.span` and :func:`~twinkle.perf.timed` live in
:mod:`twinkle.perf._current`, on top of this module.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast, final, overload

from twinkle.errors import InvalidArgumentError
from twinkle.forks import forget_in_child
from twinkle.perf._span import (
    Barrier,
    Record,
    Span,
    SpanContext,
    check_name,
    check_sync,
    error_name,
    span_types,
)
from twinkle.perf.clock import Clock, ClockAnchor, default_clock

__all__ = [
    "Span",
    "SpanContext",
    "TimeRecorder",
    "current_recorder",
]

P = ParamSpec("P")
R = TypeVar("R")

_get_ident = threading.get_ident


# -- per-process state ----------------------------------------------------------------------
@final
class _ProcessState:
    """What recorders of this process share; mutated in place rather than via ``global``."""

    __slots__ = (
        "bound",
        "default",
        "lock",
        "recorder",
        "recorders",
    )

    def __init__(self) -> None:
        #: what module-level span()/timed() record into outside use_recorder: the one
        #: bound recorder, else the default; None until first use (or while two are bound)
        self.recorder: TimeRecorder | None = None
        self.default: TimeRecorder | None = None  # the process default: made on first use
        self.bound: list[TimeRecorder] = []  # recorders of the runs in progress
        self.lock = threading.Lock()  # guards creating the default recorder
        self.recorders: weakref.WeakSet[TimeRecorder] = weakref.WeakSet()


#: shared with :mod:`twinkle.perf._current`, which binds recorders and reads this too
process_state = _ProcessState()


# A forked child inherits the parent's recorders, their queued spans and their pid. The
# queued spans belong to the parent (which drains them itself), so the child drops its
# copies and stamps its own pid and anchor (registered with the first recorder).
def _register(recorder: TimeRecorder) -> None:
    process_state.recorders.add(recorder)
    forget_in_child(_after_fork_in_child)


def _after_fork_in_child() -> None:
    process_state.lock = threading.Lock()  # another of the parent's threads may have held it
    for recorder in list(process_state.recorders):
        recorder._reset_after_fork()


@final
class TimeRecorder:
    """Records spans of one monotonic clock; thread-safe, cheap to enter and leave.

    Args:
        clock: monotonic integer nanoseconds; inject a
            :class:`~twinkle.perf.ManualClock` for deterministic tests.
        wall_clock: unix-epoch nanoseconds, read once for the :attr:`anchor`.
        pid, hostname: identity stamped on spans and the anchor (default: this process).

    No device is synchronised and no peak is reset: pass ``sync=`` to a span for an
    explicit barrier.
    """

    __slots__ = (
        "__weakref__",
        "_anchor",
        "_barrier_span_type",
        "_clock",
        "_finished",
        "_hostname",
        "_pid",
        "_pid_given",
        "_span_type",
        "_wall_clock",
    )

    def __init__(
        self,
        clock: Clock = default_clock,
        *,
        wall_clock: Clock = time.time_ns,
        pid: int | None = None,
        hostname: str | None = None,
    ) -> None:
        for argument, value in (("clock", clock), ("wall_clock", wall_clock)):
            if not callable(value):
                raise InvalidArgumentError(
                    f"{argument} must be a zero-argument callable returning int nanoseconds, "
                    f"got {value!r}; e.g. time.perf_counter_ns or twinkle.perf.ManualClock()"
                )
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise InvalidArgumentError(f"pid must be a positive int or None, got {pid!r}")
        if hostname is not None and (not isinstance(hostname, str) or not hostname):
            raise InvalidArgumentError(
                f"hostname must be a non-empty str or None, got {hostname!r}"
            )
        self._clock = clock
        self._wall_clock = wall_clock
        self._pid_given = pid is not None
        self._pid = os.getpid() if pid is None else pid
        self._hostname = socket.gethostname() if hostname is None else hostname
        self._anchor = ClockAnchor.read(clock, wall_clock, pid=self._pid, hostname=self._hostname)
        self._finished: deque[Record] = deque()
        self._span_type, self._barrier_span_type = span_types(clock, self._finished.append)
        _register(self)

    @property
    def clock(self) -> Clock:
        """The monotonic clock every span of this recorder reads."""
        return self._clock

    @property
    def anchor(self) -> ClockAnchor:
        """(monotonic ns, wall ns) read once when the recorder was made."""
        return self._anchor

    def read_anchor(self) -> ClockAnchor:
        """A fresh (monotonic ns, wall ns) pair of this recorder's clocks, read now, with
        its identity (:attr:`anchor` stays the one read when it was made)."""
        return ClockAnchor.read(
            self._clock, self._wall_clock, pid=self._pid, hostname=self._hostname
        )

    def now_ns(self) -> int:
        """One reading of :attr:`clock`."""
        return self._clock()

    def span(self, name: str, /, *, sync: Barrier | None = None, **attrs: Any) -> SpanContext:
        """A context manager recording the block as a span called ``name``.

        ``attrs`` are JSON-able attributes kept with the span. ``sync`` is an explicit
        barrier (e.g. ``torch.cuda.synchronize``) called before the start reading and
        before the end reading; default none.
        """
        # Hot path, kept inline (a call to _open would cost ~10% of a span): only a
        # plain, valid name without a barrier gets here; _open validates the rest.
        if name.__class__ is not str or not name or sync is not None:
            return self._open(name, sync, attrs)
        context = self._span_type()
        context._name = name
        context._attrs = attrs or None  # free the empty kwargs dict right away
        return context

    def _open(self, name: object, sync: object, attrs: dict[str, Any] | None) -> SpanContext:
        """span() with every check; the hot paths fall back to it."""
        checked_name = check_name(name)
        barrier = check_sync(sync)
        context: SpanContext
        if barrier is None:
            context = self._span_type()
        else:
            context = barrier_context = self._barrier_span_type()
            barrier_context._sync = barrier
        context._name = checked_name
        context._attrs = attrs or None
        return context

    @overload
    def timed(self, fn: Callable[P, R], /) -> Callable[P, R]: ...

    @overload
    def timed(
        self, name: str | None = None, /, *, sync: Barrier | None = None, **attrs: Any
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def timed(
        self,
        name: str | Callable[..., Any] | None = None,
        /,
        *,
        sync: Barrier | None = None,
        **attrs: Any,
    ) -> Any:
        """Decorate a sync or async function so every call is recorded as a span.

        Use as ``@recorder.timed``, ``@recorder.timed()`` or
        ``@recorder.timed("name", sync=..., **attrs)``; the default name is the
        function's ``module.qualname``. An async function's span runs from the call
        to the end of its awaited body.
        """
        return timed_for(self, name, sync, attrs)

    def drain(self) -> list[Span]:
        """Remove and return the finished spans, in the order they closed.

        Open spans stay open and are returned by a later drain once they close. A span
        closing on another thread while this runs is returned by this drain or the
        next one: never lost, never twice.
        """
        finished = self._finished
        popleft = finished.popleft
        pid = self._pid
        spans: list[Span] = []
        # Take at most what is queued now, so a drain ends even while other threads
        # keep closing spans; those wait for the next drain.
        for _ in range(len(finished)):
            try:
                name, attrs, start_ns, end_ns, thread_id, exc_type = popleft()
            except IndexError:  # another thread drained concurrently
                break
            spans.append(
                # Positional: a frozen dataclass's __init__ is most of a drain's cost.
                Span(
                    name,
                    start_ns,
                    end_ns,
                    thread_id,
                    pid,
                    # A copy: all calls of a @timed function share one attrs dict.
                    dict(attrs) if attrs else {},
                    None if exc_type is None else error_name(exc_type),
                )
            )
        return spans

    def pending(self) -> int:
        """How many finished spans wait for :meth:`drain`."""
        return len(self._finished)

    def first_pending(self) -> str | None:
        """The name of the first span waiting for :meth:`drain` (left there), or None."""
        try:
            return self._finished[0][0]  # (one atomic read, whatever other threads do)
        except IndexError:
            return None

    def _reset_after_fork(self) -> None:
        self._finished.clear()
        if not self._pid_given:
            self._pid = os.getpid()
        self._anchor = self.read_anchor()

    def __repr__(self) -> str:
        return f"<TimeRecorder pid={self._pid} pending={len(self._finished)}>"


def timed_for(
    recorder: TimeRecorder | None,
    name: object,
    sync: object,
    attrs: dict[str, Any],
) -> Any:
    """``timed`` for a recorder, or for the current recorder at each call (None)."""
    if callable(name) and not isinstance(name, str):
        return _decorate(name, None, None, attrs, recorder)  # bare @timed
    span_name = None if name is None else check_name(name)
    barrier = check_sync(sync)

    def decorator(fn: Callable[P, R]) -> Callable[P, R]:
        return _decorate(fn, span_name, barrier, attrs, recorder)

    return decorator


def _decorate(
    fn: Callable[P, R],
    name: str | None,
    sync: Barrier | None,
    attrs: dict[str, Any],
    recorder: TimeRecorder | None,
) -> Callable[P, R]:
    if not callable(fn):
        raise InvalidArgumentError(f"timed decorates a function, got {fn!r}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise InvalidArgumentError(
            f"timed cannot time the generator function {fn!r}: its body runs after the "
            "call returns; wrap the loop that consumes it in span() instead"
        )
    if name is None:
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None) or repr(fn)
        name = f"{module}.{qualname}" if module else qualname
    is_async = inspect.iscoroutinefunction(fn)
    if sync is None:
        if is_async:
            return _async_tuple_wrapper(fn, name, attrs or None, recorder)
        return _tuple_wrapper(fn, name, attrs or None, recorder)
    span_name: str = name
    barrier: Barrier = sync

    # With a barrier the cost of a SpanContext is noise: reuse its barrier logic.
    if is_async:
        async_fn = cast("Callable[P, Any]", fn)

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            target = current_recorder() if recorder is None else recorder
            with target._open(span_name, barrier, attrs):
                return await async_fn(*args, **kwargs)

        return cast("Callable[P, R]", async_wrapper)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        target = current_recorder() if recorder is None else recorder
        with target._open(span_name, barrier, attrs):
            return fn(*args, **kwargs)

    return wrapper


def _async_tuple_wrapper(
    fn: Callable[P, R],
    name: str,
    attrs: dict[str, Any] | None,
    recorder: TimeRecorder | None,
) -> Callable[P, R]:
    """:func:`_tuple_wrapper` for a coroutine function: the span ends with its body."""
    async_fn = cast("Callable[P, Any]", fn)

    @functools.wraps(fn)
    async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        target = current_recorder() if recorder is None else recorder
        clock, append = target._clock, target._finished.append
        start_ns = clock()
        try:
            result = await async_fn(*args, **kwargs)
        except BaseException as error:
            append((name, attrs, start_ns, clock(), _get_ident(), type(error)))
            raise
        append((name, attrs, start_ns, clock(), _get_ident(), None))
        return result

    return cast("Callable[P, R]", async_wrapper)


def _tuple_wrapper(
    fn: Callable[P, R],
    name: str,
    attrs: dict[str, Any] | None,
    recorder: TimeRecorder | None,
) -> Callable[P, R]:
    """Read the clock around the call and queue the record tuple directly (not for a
    coroutine function: :func:`_async_tuple_wrapper`).

    No SpanContext and no ``with``: a decorated call costs little more than its two
    clock readings. ``recorder=None`` looks up the current recorder at each call.
    """
    if recorder is None:

        @functools.wraps(fn)
        def current_wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            target = _current_get()
            if target is None:
                target = process_state.recorder
                if target is None:
                    target = make_process_recorder()
            clock = target._clock
            start_ns = clock()
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                end_ns = clock()
                target._finished.append((name, attrs, start_ns, end_ns, _get_ident(), type(error)))
                raise
            target._finished.append((name, attrs, start_ns, clock(), _get_ident(), None))
            return result

        return current_wrapper

    # A fixed recorder: its clock and queue bound once, in the closure.
    clock, append = recorder._clock, recorder._finished.append

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        start_ns = clock()
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            append((name, attrs, start_ns, clock(), _get_ident(), type(error)))
            raise
        append((name, attrs, start_ns, clock(), _get_ident(), None))
        return result

    return wrapper


# -- the current recorder -----------------------------------------------------------------
#: the recorder :func:`~twinkle.perf.use_recorder` selected in this context, else None
current_var: contextvars.ContextVar[TimeRecorder | None] = contextvars.ContextVar(
    "twinkle_perf_current_recorder", default=None
)
_current_get = current_var.get


def current_recorder() -> TimeRecorder:
    """The recorder module-level :func:`~twinkle.perf.span` and
    :func:`~twinkle.perf.timed` record into.

    That is the one set by :func:`~twinkle.perf.use_recorder` in this context, else this process's
    default recorder, created on first use. New threads start from an empty context,
    so they see the process default unless run in a copied context.
    """
    recorder = _current_get()
    if recorder is None:
        recorder = process_state.recorder
        if recorder is None:
            recorder = make_process_recorder()
    return recorder


def make_process_recorder() -> TimeRecorder:
    """The process recorder (the one bound, else the default, made now on first use): the
    slow path of :func:`current_recorder` and of the module-level ``span()``/``@timed``."""
    with process_state.lock:
        if len(process_state.bound) > 1:
            raise InvalidArgumentError(
                f"{len(process_state.bound)} runs are in progress in this process, so a "
                "module-level span()/timed() cannot tell which run it belongs to; record "
                "on the run's own recorder (run.recorder.span(...)) or select it with "
                "`with twinkle.perf.use_recorder(run.recorder):`"
            )
        if process_state.recorder is None:
            if process_state.default is None:
                process_state.default = TimeRecorder()
            process_state.recorder = process_state.default
        return process_state.recorder
