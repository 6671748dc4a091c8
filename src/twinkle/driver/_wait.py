"""Real waiting for the driver: deadlines on ``time.monotonic``, waits cut into polls.

Timeouts are real waiting, never the bus clock (a manual clock would never run out).
Every wait on the driver's condition lasts at most :data:`POLL_S`, a safety net: every
change of state notifies the condition, so a waiter wakes at once anyway.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["POLL_S", "deadline_after", "poll_s", "time_left"]

#: the longest one wait lasts before its waiter looks again
POLL_S: Final = 0.05


def deadline_after(seconds: float | None) -> float | None:
    """The ``time.monotonic`` reading ``seconds`` from now (``None``: no deadline)."""
    return None if seconds is None else time.monotonic() + seconds


def time_left(deadline: float | None) -> float | None:
    """Seconds until ``deadline``, never below 0 (``None``: no deadline, wait as long as
    it takes)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def poll_s(deadline: float | None) -> float | None:
    """How long the next wait may last: :data:`POLL_S`, less when ``deadline`` is nearer;
    ``None`` once ``deadline`` has passed (the waiter gives up)."""
    if deadline is None:
        return POLL_S
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    return min(POLL_S, remaining)
