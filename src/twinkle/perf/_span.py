"""The span value (``Span``) and the context manager that records one (``SpanContext``).

Why the hot path looks the way it does: entering and leaving a span must cost about as
much as the two clock readings it is made of (``bench/bench_perf.py`` holds it to a
multiple of them). So a ``SpanContext`` is a three-slot object whose concrete class is
made per recorder, with the clock and the queue's ``append`` bound in a closure: no
attribute look-ups on the way in or out, no thread-locals. On exit it queues one plain
tuple (a :data:`Record`); :class:`Span` values are built only when a recorder drains.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self, cast

import msgspec

from twinkle.checks import Count, Int64, NonEmpty, convert_checked
from twinkle.errors import InvalidArgumentError

Barrier = Callable[[], object]
"""An explicit measurement barrier, e.g. ``torch.cuda.synchronize``."""

Record = tuple[str, dict[str, Any] | None, int, int, int, type[BaseException] | None]
"""A closed span as queued: (name, attrs or None, start_ns, end_ns, thread_id, exc type)."""

_get_ident = threading.get_ident


def error_name(exc_type: type[BaseException]) -> str:
    """``ValueError`` for builtins, ``package.module.Qual.Name`` otherwise."""
    module = exc_type.__module__
    if module == "builtins":
        return exc_type.__qualname__
    return f"{module}.{exc_type.__qualname__}"


def check_name(name: object, argument: str = "name") -> str:
    """A span name: a non-empty str (a str subclass such as StrEnum becomes a plain str)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(
            f"{argument} must be a non-empty str, got {name!r}; "
            'name the span after what it measures, e.g. span("generate")'
        )
    # str.__str__, not str(): str() of a (str, Enum) member is "Phase.GENERATE".
    return str.__str__(name)


def check_sync(sync: object) -> Barrier | None:
    """A barrier: a zero-argument callable, or None."""
    if sync is not None and not callable(sync):
        raise InvalidArgumentError(
            f"sync must be a zero-argument callable or None, got {sync!r}; "
            "pass the barrier itself, e.g. sync=torch.cuda.synchronize (not its result)"
        )
    return cast("Barrier | None", sync)


class Span(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One finished span, as returned by :meth:`TimeRecorder.drain`.

    A frozen :mod:`msgspec` struct: building one costs a tenth of a dataclass, and the
    field types (with their bounds) are what a span in the event log is checked against.
    """

    name: NonEmpty
    start_ns: Int64  # reading of the recorder's monotonic clock
    end_ns: Int64
    thread_id: Count  # threading.get_ident() of the thread that closed it
    pid: Count
    attrs: dict[str, Any]  # the caller's JSON-able attributes (may be empty)
    error: str | None  # qualified exception type name if it ended by exception

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict[str, Any]:
        """Plain fields for serialisation (``attrs`` copied into a plain dict)."""
        return {**msgspec.structs.asdict(self), "attrs": dict(self.attrs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Span:
        """Rebuild a span written by :meth:`to_dict`; every field is checked."""
        return convert_checked(data, cls)


class SpanContext:
    """The context manager ``span()`` returns.

    Entering reads the clock; leaving reads it again and queues the span in its
    recorder, whether the block ended normally or by exception (which propagates).
    It may be entered again after it left (each use is one span), but not inside itself.
    """

    __slots__ = ("_attrs", "_name", "_start_ns")

    _name: str
    _attrs: dict[str, Any] | None
    _start_ns: int

    @property
    def name(self) -> str:
        """The span's name."""
        return self._name

    def set(self, **attrs: Any) -> None:
        """Add attributes learned inside the block (the tokens a generation produced):
        they are kept with the span when the block ends. Called after it ended, they
        go with the span's next use only."""
        self._attrs = {**self._attrs, **attrs} if self._attrs else attrs

    def __enter__(self) -> Self:
        raise NotImplementedError  # pragma: no cover - concrete classes: span_types()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise NotImplementedError  # pragma: no cover

    def __repr__(self) -> str:
        return f"<SpanContext {self._name!r}>"


class BarrierSpanContext(SpanContext):
    """A :class:`SpanContext` that calls its ``sync`` barrier before each clock reading."""

    __slots__ = ("_sync",)

    _sync: Barrier


def span_types(
    clock: Callable[[], int], append: Callable[[Record], None]
) -> tuple[type[SpanContext], type[BarrierSpanContext]]:
    """One recorder's two SpanContext classes (plain, barrier), bound to its clock and queue."""

    class _Span(SpanContext):
        __slots__ = ()

        def __enter__(self) -> Self:
            self._start_ns = clock()
            return self

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> None:
            append((self._name, self._attrs, self._start_ns, clock(), _get_ident(), exc_type))

    class _BarrierSpan(BarrierSpanContext):
        __slots__ = ()

        def __enter__(self) -> Self:
            self._sync()
            self._start_ns = clock()
            return self

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> None:
            try:
                self._sync()
            except BaseException as barrier_error:
                # The span still closes: it ended by the body's error, else the barrier's.
                failure = exc_type or type(barrier_error)
                append((self._name, self._attrs, self._start_ns, clock(), _get_ident(), failure))
                raise
            append((self._name, self._attrs, self._start_ns, clock(), _get_ident(), exc_type))

    return _Span, _BarrierSpan
