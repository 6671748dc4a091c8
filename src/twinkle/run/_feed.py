"""Feeding a run's logged events to a :class:`~twinkle.run.Run`: what a replay does with
a whole log and a resuming session with the log its earlier segments wrote."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Final, final

from twinkle.events import Event, RunFinished
from twinkle.run._run import Run

__all__ = ["PROGRESS_EVERY_S", "FeedProgress", "LogFeeder"]

#: seconds between two lines of a long feed's progress
PROGRESS_EVERY_S: Final = 10.0
progress_log = logging.getLogger("twinkle.progress")


@final
class FeedProgress:
    """How far a long feed of a log is, said every :data:`PROGRESS_EVERY_S` on the
    logger ``twinkle.progress`` (INFO): the events fed, the share of the log's bytes
    read, the pace and the time left at it. ``events`` is the log's reader (its
    ``offset``: the bytes read so far), ``size`` the log's bytes."""

    __slots__ = ("_before", "_began", "_clock", "_due", "_first", "events", "size", "what")

    def __init__(
        self,
        what: str,
        events: object,
        size: int,
        *,
        fed_before: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.events, self.size = what, events, size
        self._before = fed_before  # (the events a checkpoint stands for)
        self._clock = clock
        self._began = clock()
        self._due = self._began + PROGRESS_EVERY_S
        self._first = self._offset()  # (a checkpoint's tail begins past it)

    def note(self, count: int) -> None:
        """``count`` events fed so far: say so when it is time."""
        now = self._clock()
        if now < self._due:
            return
        self._due = now + PROGRESS_EVERY_S
        read, pace = self._offset(), (count - self._before) / max(now - self._began, 1e-9)
        done = read - self._first
        left = (self.size - read) * (now - self._began) / done if done > 0 else None
        progress_log.info(
            "%s: %s events, %.0f%% of its %s, %s events/s%s",
            self.what,
            f"{count:,}",
            100 * read / self.size if self.size else 100,
            _size(self.size),
            f"{pace:,.0f}",
            "" if left is None else f", about {_duration(left)} left",
        )

    def _offset(self) -> int:
        offset = getattr(self.events, "offset", 0)
        return offset if isinstance(offset, int) else 0


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 10**9 else f"{n / 1e6:.1f} MB"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


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
        progress: FeedProgress | None = None,
    ) -> int:
        """Submit ``events`` (at most ``limit`` in all, counting those fed before),
        calling ``after_each`` once the run took each and saying how far it is through
        ``progress``; returns how many in all."""
        for event in events:
            if self.count == limit:
                break
            self.run.submit(event)
            self.count += 1
            self.last = event
            if after_each is not None:
                after_each()
            if progress is not None and not self.count & 63:
                progress.note(self.count)
        return self.count

    def close_unfinished(self, error: str, *, ns: int, wall_ns: int) -> bool:
        """When the run's last segment has no ``run_finished``, submit one with status
        ``error`` and ``error`` at ``ns`` (run clock) and ``wall_ns``; True if it did."""
        if self.run.finished is not None:
            return False
        self.run.submit(RunFinished(self.run.run_id, ns, wall_ns, status="error", error=error))
        return True
