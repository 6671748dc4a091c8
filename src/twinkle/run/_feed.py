"""Feeding a run's logged events to a :class:`~twinkle.run.Run`: what a replay does with
a whole log and a resuming session with the log its earlier segments wrote."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import final

from twinkle.events import Event, RunFinished
from twinkle.run._run import Run

__all__ = ["LogFeeder"]


@final
class LogFeeder:
    """Submits logged events to ``run`` in order, counting them, and ends a segment the
    log leaves running (a process that died or was killed) with an ``error`` status."""

    __slots__ = ("count", "last", "run")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.count = 0  # the events submitted so far
        self.last: Event | None = None  # the one submitted last

    def feed(
        self,
        events: Iterable[Event],
        *,
        limit: int | None = None,
        after_each: Callable[[], None] | None = None,
    ) -> int:
        """Submit ``events`` (at most ``limit`` in all, counting those fed before),
        calling ``after_each`` once the run took each; returns how many in all."""
        for event in events:
            if self.count == limit:
                break
            self.run.submit(event)
            self.count += 1
            self.last = event
            if after_each is not None:
                after_each()
        return self.count

    def close_unfinished(self, error: str, *, ns: int, wall_ns: int) -> bool:
        """When the run's last segment has no ``run_finished``, submit one with status
        ``error`` and ``error`` at ``ns`` (run clock) and ``wall_ns``; True if it did."""
        if self.run.finished is not None:
            return False
        self.run.submit(RunFinished(self.run.run_id, ns, wall_ns, status="error", error=error))
        return True
