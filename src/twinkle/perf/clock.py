"""Clocks: the monotonic nanosecond protocol, a manual clock for tests, the process anchor.

Every duration twinkle reports is a difference of two readings of one monotonic clock.
A clock is any zero-argument callable returning integer nanoseconds; the default is
:func:`time.perf_counter_ns`. Tests inject a :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import msgspec

from twinkle.checks import Count, Int64, convert_checked
from twinkle.errors import InvalidArgumentError

__all__ = ["Clock", "ClockAnchor", "ManualClock", "default_clock"]

Clock = Callable[[], int]
"""A monotonic clock: a zero-argument callable returning integer nanoseconds."""

default_clock: Final[Clock] = time.perf_counter_ns
"""The clock recorders use unless one is injected (:func:`time.perf_counter_ns`)."""


def _require_int(value: object, argument: str, fix: str) -> int:
    # bool is an int subclass, but True nanoseconds is always a caller mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{argument} must be an int (nanoseconds), got {value!r} "
            f"({type(value).__name__}); {fix}"
        )
    return value


@final
class ManualClock:
    """A clock that moves only when told to, for deterministic tests.

    It never goes backwards: :meth:`advance` takes a non-negative step and :meth:`set`
    refuses an earlier time. Advancing is thread-safe, so several threads may share one.

    >>> clock = ManualClock(100)
    >>> clock.advance(5)
    105
    >>> clock()
    105
    """

    __slots__ = ("_lock", "_now_ns")

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = _require_int(start_ns, "start_ns", "pass e.g. ManualClock(0)")
        self._lock = threading.Lock()

    def __call__(self) -> int:
        """The current reading in nanoseconds."""
        return self._now_ns

    def advance(self, ns: int) -> int:
        """Move the clock forward by ``ns`` >= 0 nanoseconds and return the new time."""
        _require_int(ns, "ns", "pass a whole number of nanoseconds, e.g. advance(1_000)")
        if ns < 0:
            raise InvalidArgumentError(
                f"ns must be >= 0, got {ns!r}: a monotonic clock never goes backwards; "
                "use a non-negative step"
            )
        with self._lock:
            self._now_ns += ns
            return self._now_ns

    def set(self, ns: int) -> None:
        """Jump to ``ns``, which must not be earlier than the current reading."""
        _require_int(ns, "ns", "pass a whole number of nanoseconds")
        with self._lock:
            if ns < self._now_ns:
                raise InvalidArgumentError(
                    f"ns={ns!r} is earlier than the current reading {self._now_ns!r}: "
                    "a monotonic clock never goes backwards; pass a value >= the current one"
                )
            self._now_ns = ns

    def __repr__(self) -> str:
        return f"ManualClock({self._now_ns!r})"


class ClockAnchor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One process's pair of clock readings, taken back to back.

    Monotonic clocks have an arbitrary origin per machine; the anchor lets spans from
    several processes be placed on one wall-clock timeline offline
    (:meth:`to_wall_ns`).
    """

    monotonic_ns: Int64
    wall_ns: Count  # unix epoch ns, read right after monotonic_ns
    pid: Count
    hostname: str

    @classmethod
    def read(
        cls,
        clock: Clock = default_clock,
        wall_clock: Clock = time.time_ns,
        *,
        pid: int | None = None,
        hostname: str | None = None,
    ) -> ClockAnchor:
        """Read ``clock`` then ``wall_clock`` once and stamp the process identity."""
        monotonic_ns = _require_int(
            clock(), "clock()", "a clock must return integer nanoseconds (time.perf_counter_ns)"
        )
        wall_ns = _require_int(
            wall_clock(), "wall_clock()", "a wall clock must return unix ns (time.time_ns)"
        )
        return cls(
            monotonic_ns=monotonic_ns,
            wall_ns=wall_ns,
            pid=os.getpid() if pid is None else pid,
            hostname=socket.gethostname() if hostname is None else hostname,
        )

    def to_wall_ns(self, monotonic_ns: int) -> int:
        """The unix-epoch nanoseconds of a reading of this process's monotonic clock."""
        return self.wall_ns + (monotonic_ns - self.monotonic_ns)

    def shift_onto(self, timeline: ClockAnchor | None) -> int:
        """Nanoseconds to add to this process's monotonic readings to place them on the
        timeline whose anchor is ``timeline``: 0 for the same process (one clock, no
        drift from re-reading the anchors) or without a timeline; else the difference of
        the two processes' wall-minus-monotonic offsets."""
        if timeline is None or (self.pid == timeline.pid and self.hostname == timeline.hostname):
            return 0
        return (self.wall_ns - self.monotonic_ns) - (timeline.wall_ns - timeline.monotonic_ns)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields."""
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClockAnchor:
        """Rebuild an anchor written by :meth:`to_dict`; every field is checked."""
        return convert_checked(data, cls)
