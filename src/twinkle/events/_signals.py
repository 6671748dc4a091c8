"""The signals: one private blinker ``Namespace``, one signal per event type, derived
from the type's definition (name ``twinkle.<TYPE>``, doc: the type's docstring).

The sender of every send is the :class:`~twinkle.events.EventBus` that published; the
payload is the keyword argument ``event``. Connect to a signal directly to see every
event of every bus (``signal.connect(fn)``), or pass ``sender=bus`` to see one run only.
Receivers run synchronously on the publishing thread, in blinker's order; an exception
raised by a direct receiver propagates to the publisher (observers registered as plugins
are isolated by :mod:`twinkle.plugins` instead).
"""

from __future__ import annotations

import inspect

from blinker import Namespace, Signal

from twinkle.events._types import (
    EVENT_TYPES,
    BackendsClosed,
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
)

__all__ = [
    "SIGNALS",
    "backends_closed",
    "iteration_started",
    "memory",
    "optimizer_step",
    "run_finished",
    "run_resumed",
    "run_started",
    "samples",
    "scalars",
    "signal_for",
    "snapshot",
    "spans",
    "weights_published",
]

_ns = Namespace()

SIGNALS: dict[type[Event], Signal] = {
    cls: _ns.signal(f"twinkle.{cls.TYPE}", doc=f"{inspect.getdoc(cls)}\n\n(event: {cls.__name__})")
    for cls in EVENT_TYPES.values()
}
"""The signal of each event type."""

# The signals by name, for ``twinkle.events.samples.connect(...)``.
run_started = SIGNALS[RunStarted]
run_resumed = SIGNALS[RunResumed]
iteration_started = SIGNALS[IterationStarted]
weights_published = SIGNALS[WeightsPublished]
snapshot = SIGNALS[Snapshot]
run_finished = SIGNALS[RunFinished]
backends_closed = SIGNALS[BackendsClosed]
spans = SIGNALS[SpanBatch]
memory = SIGNALS[MemoryReadings]
samples = SIGNALS[SamplesObserved]
optimizer_step = SIGNALS[OptimizerStep]
scalars = SIGNALS[ScalarsObserved]


def signal_for(event: Event) -> Signal:
    """The signal that carries ``event``."""
    return SIGNALS[type(event)]
