"""The producers' threads: one daemon thread per producer runs it with the current
weight version and offers each item to the buffer.

An item more than ``max_staleness`` versions behind when it arrives is dropped and
counted; a producer finding the buffer full blocks (counted as its idle time) until the
trainer consumes or the driver closes. ``StopIteration`` ends a producer (exhausted),
any other exception fails the driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from twinkle.driver._core import DriverCore
from twinkle.driver._state import ProducerState, ProducerTally
from twinkle.driver._types import Item
from twinkle.driver._wait import POLL_S

__all__ = ["producer_threads"]

T = TypeVar("T")


def producer_threads(
    core: DriverCore[T], produce: Mapping[str, Callable[[int], Any]]
) -> dict[str, threading.Thread]:
    """One daemon thread per producer, not started yet; each producer's state becomes
    ``PRODUCING``. Call with ``core.cond`` held."""
    threads: dict[str, threading.Thread] = {}
    for name, producer in produce.items():
        st = core.tallies[name]
        threads[name] = threading.Thread(
            target=_run_producer,
            args=(core, st, producer),
            name=f"twinkle-producer-{name}",
            daemon=True,
        )
        st.state = ProducerState.PRODUCING
    return threads


def _run_producer(core: DriverCore[T], st: ProducerTally, produce: Callable[[int], Any]) -> None:
    while not core.stop.is_set():
        with core.cond:
            version = core.version
        try:
            payload = produce(version)
        except StopIteration:
            with core.cond:
                st.state = ProducerState.EXHAUSTED
                core.cond.notify_all()
            return
        except BaseException as exc:
            with core.cond:
                st.state = ProducerState.FAILED
                core.set_failure_locked(f"producer {st.name!r}", exc)
            return
        item = Item(payload, version, st.name, core.bus.now_ns())
        if not _offer(core, st, item):
            return


def _offer(core: DriverCore[T], st: ProducerTally, item: Item[T]) -> bool:
    """Buffer ``item`` (or drop it as too stale); False once the driver stops."""
    with core.cond:
        while True:
            if core.stop.is_set():
                core.unblock_locked(st, core.bus.now_ns())
                return False
            if core.version - item.version > core.max_staleness:
                st.produced += 1
                st.dropped += 1
                core.unblock_locked(st, core.bus.now_ns())
                core.cond.notify_all()
                return True
            if len(core.buffer) < core.buffer_size:
                break
            if st.blocked_since_ns is None:
                st.blocked_since_ns = core.bus.now_ns()
                st.state = ProducerState.BLOCKED
                core.cond.notify_all()
            core.cond.wait(POLL_S)
        core.unblock_locked(st, core.bus.now_ns())
        core.buffer.append(item)
        st.produced += 1
        st.buffered += 1
        core.high_water = max(core.high_water, len(core.buffer))
        core.cond.notify_all()
        return True
