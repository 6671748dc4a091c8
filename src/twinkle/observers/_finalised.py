"""What the run's timeline (:mod:`twinkle.observers.timeline`) hands out: each
iteration it finalises (:class:`Finished`, with its window's flags) and the run-level
figures at the finish (:class:`RunTiming`)."""

from __future__ import annotations

from typing import Any

import msgspec

from twinkle.observers._measure import AttributedTiming, IterationData, WindowTiming
from twinkle.observers._workers import WorkerTiming

__all__ = ["DRAIN", "PARTIAL", "WARMUP", "Finished", "RunTiming"]


#: why an iteration's window is not the loop's steady state (docs/metrics.md)
WARMUP, DRAIN, PARTIAL = "warmup", "drain", "partial"


class Finished(msgspec.Struct, frozen=True):
    """An iteration handed out when it is finalised: its data, both views and its
    window's flags: ``warmup`` (the first of its segment: the pipeline filling), ``drain``
    (the last of a segment that finished ``ok``: nothing left to overlap) or ``partial``
    (the last of one that did not: cut short); none in the steady state."""

    data: IterationData
    attributed: AttributedTiming
    window: WindowTiming
    workers: WorkerTiming
    flags: tuple[str, ...] = ()

    @property
    def steady(self) -> bool:
        return not self.flags

    @property
    def attrs(self) -> dict[str, Any]:
        """What every record computed from the iteration's window carries: its window's
        flags and the optimizer steps the iteration took (``iteration_steps``)."""
        return {"window_flags": list(self.flags), "iteration_steps": self.data.steps}


class RunTiming(msgspec.Struct, frozen=True):
    """The run-level figures: the sum of every window, set-up and tear-down included.

    ``total`` = ``setup`` + ``loop`` (every iteration's window) + ``teardown``, to the
    nanosecond. ``active`` starts at the first span of the loop's work (a phase that is
    not a ``lifecycle`` one) or the first boundary, whichever is first, and ends with the
    loop (the time the run's tokens took, rollouts before the first boundary included;
    starting and stopping the workers, and the tear-down, left out). ``late_ns`` sums the
    time of late spans before the horizon (in no window).
    """

    total: WindowTiming
    setup: WindowTiming
    loop: WindowTiming
    teardown: WindowTiming
    active_wall_ns: int
    active_overhead_ns: int
    late_spans: int
    late_ns: int
