"""The driver's small values: the close report, per-producer counters, argument checks."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from twinkle.errors import InvalidArgumentError

__all__ = ["CloseReport", "ProducerTally", "Publication", "check_int", "check_timeout"]


@dataclass(frozen=True, slots=True)
class CloseReport:
    """What :meth:`StreamingDriver.close` could not stop within its timeout.

    ``hung_producers`` names producers still running; ``hung_publishing`` describes weight
    publications (or engine loads) still running. Their threads are daemons, so they
    cannot block interpreter exit.
    """

    hung_producers: tuple[str, ...] = ()
    hung_publishing: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """Every thread stopped."""
        return not self.hung_producers and not self.hung_publishing


class ProducerTally:
    """One producer's mutable counters and state (guarded by the driver's condition)."""

    __slots__ = (
        "blocked_since_ns",
        "buffered",
        "consumed",
        "dropped",
        "idle_ns",
        "name",
        "produced",
        "state",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.produced = 0  # items returned and accounted (buffered or dropped)
        self.consumed = 0
        self.buffered = 0
        self.dropped = 0  # too stale
        self.idle_ns = 0  # blocked on a full buffer
        self.blocked_since_ns: int | None = None
        self.state = "new"


class Publication:
    __slots__ = ("acked", "thread", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.acked: list[str] = []
        self.thread: threading.Thread | None = None


def check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_timeout(name: str, value: object) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgumentError(
            f"{name} must be None (wait forever) or a finite number of seconds >= 0, got {value!r}"
        )
    return float(value)
