"""The driver's small values: producer states, the typed driver state, the close report,
per-producer counters, argument checks."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from twinkle.checks import check_seconds, plain_number
from twinkle.errors import InvalidArgumentError

__all__ = [
    "CloseReport",
    "DriverState",
    "ProducerState",
    "ProducerStats",
    "ProducerTally",
    "Publication",
    "check_int",
    "check_timeout",
    "plain_state",
]


class ProducerState(StrEnum):
    """Where a producer's thread is.

    A ``StrEnum`` because the state travels in ``snapshot`` events as its string value;
    the values are part of the event log and must not change.
    """

    #: built; :meth:`StreamingDriver.start` has not run yet
    NEW = "new"
    #: running its producer, or about to
    PRODUCING = "producing"
    #: holding an item, waiting for room in the full buffer (counted as idle time)
    BLOCKED = "blocked"
    #: its producer raised ``StopIteration``
    EXHAUSTED = "exhausted"
    #: its producer raised any other exception
    FAILED = "failed"
    #: :meth:`StreamingDriver.close` stopped it
    STOPPED = "stopped"
    #: still running when :meth:`StreamingDriver.close` stopped waiting for it
    HUNG = "hung"

    @property
    def finished(self) -> bool:
        """The producer will make no more items."""
        return self in _FINISHED


_FINISHED = frozenset(
    {ProducerState.EXHAUSTED, ProducerState.FAILED, ProducerState.STOPPED, ProducerState.HUNG}
)


class ProducerStats(TypedDict):
    """One producer's entry in :attr:`DriverState.producers`."""

    #: items it returned and the driver accounted (buffered or dropped)
    produced: int
    #: its items the trainer took
    consumed: int
    #: its items in the buffer now
    buffered: int
    #: its items dropped as more than ``max_staleness`` versions behind
    dropped: int
    #: bus-clock seconds it spent blocked on a full buffer, a block in progress included
    idle_seconds: float
    #: where its thread is
    state: ProducerState


class DriverState(TypedDict):
    """What :meth:`StreamingDriver.state` returns; ``snapshot`` events carry the same keys
    and values as a plain dict (producer states as their string values)."""

    #: the weight version producers are handed now
    version: int
    #: iterations begun so far
    iterations_started: int
    #: the most items the buffer holds
    buffer_size: int
    #: items in the buffer now
    buffered: int
    #: the most items ever buffered at once
    high_water_mark: int
    #: the most weight versions an item may lag and still be consumed
    max_staleness: int
    #: items produced, summed over producers
    produced: int
    #: items the trainer took, summed over producers
    consumed: int
    #: items dropped as too stale, summed over producers
    dropped: int
    #: bus-clock seconds of finished ``next_batch`` waits
    trainer_wait_seconds: float
    #: a ``next_batch`` call is waiting for items now
    trainer_waiting: bool
    #: the weight version being published now (``None``: no publication in flight)
    publishing: int | None
    #: ``"where: Type: message"`` of the first failure (``None``: no failure)
    failure: str | None
    #: what :meth:`StreamingDriver.close` left running: producer names, publication labels
    hung: list[str]
    #: per producer, in declaration order
    producers: dict[str, ProducerStats]


def plain_state(state: DriverState) -> dict[str, object]:
    """``state`` with plain ``str`` producer states, keys in the same order: the payload
    of a ``snapshot`` event, identical to what a replay reads back from the log."""
    producers = {name: {**p, "state": p["state"].value} for name, p in state["producers"].items()}
    return {**state, "hung": list(state["hung"]), "producers": producers}


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
        self.state: ProducerState = ProducerState.NEW


class Publication:
    __slots__ = ("acked", "thread", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.acked: list[str] = []
        self.thread: threading.Thread | None = None


def check_int(name: str, value: object, minimum: int) -> int:
    value = plain_number(value)  # numpy or torch: its plain int
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_timeout(name: str, value: object) -> float | None:
    """A driver timeout: like every number the driver takes, a numpy or torch scalar is
    read as its plain number first."""
    return check_seconds(name, plain_number(value), none_ok=True, none_means="to wait forever")
