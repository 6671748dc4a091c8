"""Scenario knobs: the demo made slow on one side on purpose, to see what twinkle says
limits it (docs/metrics.md, "What limits the run"; the README's "Making a bottleneck on
purpose").

Each knob makes a side ``k`` times slower by sleeping ``(k - 1)`` times the time the
side's work took, inside the side's own span, as a slower device would: the sleep
releases the GIL, so the other side goes on meanwhile.

* ``--slow-generation K``: every engine's ``generate``;
* ``--slow-engine NAME:K``: one engine's ``generate`` (a straggler);
* ``--slow-training K``: the trainer's iteration (a ``train.slowdown`` span after its
  last optimizer step: training);
* ``--slow-publish K``: every engine's ``weights.load``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from twinkle.perf import TimeRecorder

T = TypeVar("T")

__all__ = ["slowed", "slowed_training"]


@contextmanager
def slowed(factor: float) -> Iterator[None]:
    """Run the block, then sleep ``factor - 1`` times as long as it took (nothing when
    ``factor`` is 1)."""
    start = time.perf_counter()
    yield
    if factor > 1:
        time.sleep((factor - 1) * (time.perf_counter() - start))


def slowed_training(
    recorder: TimeRecorder, iteration: int, factor: float, work: Callable[[], T]
) -> T:
    """``work()`` (a trainer's iteration), then, when ``factor`` > 1, a
    ``train.slowdown`` span sleeping ``factor - 1`` times as long as it took."""
    started = time.perf_counter()
    result = work()
    if factor > 1:
        with recorder.span("train.slowdown", iteration=iteration):
            time.sleep((factor - 1) * (time.perf_counter() - started))
    return result
