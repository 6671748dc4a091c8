"""What the driver's threads share: the buffer, the tallies, the version, the first
failure and the close report, all behind one ``threading.Condition``.

Methods ending in ``_locked`` expect the caller to hold :attr:`DriverCore.cond`. Every
change of state notifies it, so a waiting trainer (or monitor) wakes at once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from twinkle.driver._state import (
    CloseReport,
    DriverState,
    ProducerState,
    ProducerStats,
    ProducerTally,
    Publication,
)
from twinkle.driver._types import Item
from twinkle.errors import DriverError
from twinkle.events import EventBus

__all__ = ["DriverCore"]

_log = logging.getLogger("twinkle.driver")

T = TypeVar("T")


class DriverCore(Generic[T]):
    """The state a :class:`~twinkle.driver.StreamingDriver` shares with its threads.

    Measured times (idle and wait seconds) are read from ``bus.now_ns()``, so a manual
    clock makes them deterministic.
    """

    __slots__ = (
        "buffer",
        "buffer_size",
        "bus",
        "closed",
        "cond",
        "failure",
        "failure_surfaced",
        "first_iteration",
        "high_water",
        "max_staleness",
        "next_iteration",
        "publication",
        "report",
        "stop",
        "tallies",
        "trainer_waiting",
        "version",
        "wait_ns",
    )

    def __init__(
        self,
        bus: EventBus,
        producers: Iterable[str],
        *,
        buffer_size: int,
        max_staleness: int,
        version: int,
        first_iteration: int,
    ) -> None:
        self.bus = bus
        self.cond = threading.Condition(threading.Lock())
        #: set by close(): producers and publications stop at their next look
        self.stop = threading.Event()
        self.buffer: deque[Item[T]] = deque()
        self.buffer_size = buffer_size
        self.max_staleness = max_staleness
        self.tallies = {name: ProducerTally(name) for name in producers}
        self.version = version
        self.publication: Publication | None = None
        self.first_iteration = first_iteration
        self.next_iteration = first_iteration
        self.high_water = 0
        self.wait_ns = 0  # finished next_batch waits, bus clock
        self.trainer_waiting = False
        #: the first failure, ``(where, exception)``; later ones are only logged
        self.failure: tuple[str, BaseException] | None = None
        self.failure_surfaced = False  # a driver call raised it already
        self.closed = False
        self.report: CloseReport | None = None

    # -- failures -----------------------------------------------------------------------

    def set_failure_locked(self, where: str, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = (where, exc)
        else:
            _log.error("StreamingDriver: %s also failed: %r", where, exc)
        self.cond.notify_all()

    @property
    def unreported(self) -> bool:
        """A failure no driver call has raised yet."""
        return self.failure is not None and not self.failure_surfaced

    def raise_failure_locked(self) -> None:
        if self.failure is None:  # pragma: no cover - callers check
            return
        where, exc = self.failure
        self.failure_surfaced = True
        raise DriverError(
            f"{where} raised {type(exc).__qualname__}: {exc}; the driver cannot continue: "
            "fix the cause (chained below) and close() the driver"
        ) from exc

    def check_usable_locked(self) -> None:
        if self.failure is not None:
            self.raise_failure_locked()
        if self.closed:
            raise DriverError("the driver is closed; build a new StreamingDriver")

    def check_usable(self) -> None:
        with self.cond:
            self.check_usable_locked()

    # -- the buffer and the tallies -----------------------------------------------------

    @staticmethod
    def unblock_locked(st: ProducerTally, now_ns: int) -> None:
        """End ``st``'s block on a full buffer, if any, adding it to its idle time."""
        if st.blocked_since_ns is not None:
            st.idle_ns += now_ns - st.blocked_since_ns
            st.blocked_since_ns = None
            if st.state is ProducerState.BLOCKED:
                st.state = ProducerState.PRODUCING

    def take_locked(self, n: int) -> list[Item[T]]:
        """The ``n`` oldest items, out of the buffer and counted as consumed."""
        batch = [self.buffer.popleft() for _ in range(n)]
        for item in batch:
            st = self.tallies[item.producer]
            st.buffered -= 1
            st.consumed += 1
        self.cond.notify_all()
        return batch

    def set_version_locked(self, version: int) -> None:
        """Make ``version`` current and drop the buffered items now too stale."""
        self.version = version
        fresh: deque[Item[T]] = deque()
        for item in self.buffer:
            if version - item.version > self.max_staleness:
                st = self.tallies[item.producer]
                st.buffered -= 1
                st.dropped += 1
            else:
                fresh.append(item)
        self.buffer = fresh

    # -- state ----------------------------------------------------------------------------

    def producer_states_locked(self) -> dict[str, str]:
        return {name: st.state.value for name, st in self.tallies.items()}

    def _producer_stats_locked(self) -> dict[str, ProducerStats]:
        now = self.bus.now_ns()
        producers: dict[str, ProducerStats] = {}
        for name, st in self.tallies.items():
            idle = st.idle_ns
            if st.blocked_since_ns is not None:
                idle += now - st.blocked_since_ns
            producers[name] = {
                "produced": st.produced,
                "consumed": st.consumed,
                "buffered": st.buffered,
                "dropped": st.dropped,
                "idle_seconds": idle / 1e9,
                "state": st.state,
            }
        return producers

    def state_locked(self) -> DriverState:
        producers = self._producer_stats_locked()
        report = self.report
        hung = [] if report is None else [*report.hung_producers, *report.hung_publishing]
        failure: str | None = None
        if self.failure is not None:
            where, exc = self.failure
            failure = f"{where}: {type(exc).__qualname__}: {exc}"
        return {
            "version": self.version,
            "iterations_started": self.next_iteration - self.first_iteration,
            "buffer_size": self.buffer_size,
            "buffered": len(self.buffer),
            "high_water_mark": self.high_water,
            "max_staleness": self.max_staleness,
            "produced": sum(p["produced"] for p in producers.values()),
            "consumed": sum(p["consumed"] for p in producers.values()),
            "dropped": sum(p["dropped"] for p in producers.values()),
            "trainer_wait_seconds": self.wait_ns / 1e9,
            "trainer_waiting": self.trainer_waiting,
            "publishing": None if self.publication is None else self.publication.version,
            "failure": failure,
            "hung": hung,
            "producers": producers,
        }
