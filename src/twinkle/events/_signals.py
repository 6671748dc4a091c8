"""The signals: one private blinker ``Namespace``, one documented signal per event type.

The sender of every send is the :class:`~twinkle.events.EventBus` that published; the
payload is the keyword argument ``event``. Connect to a signal directly to see every
event of every bus (``signal.connect(fn)``), or pass ``sender=bus`` to see one run only.
Receivers run synchronously on the publishing thread, in blinker's order; an exception
raised by a direct receiver propagates to the publisher (observers registered as plugins
are isolated by :mod:`twinkle.plugins` instead).
"""

from __future__ import annotations

from blinker import Namespace, Signal

from twinkle.events._types import (
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
)

__all__ = [
    "run_started",
    "iteration_started",
    "weights_published",
    "snapshot",
    "run_finished",
    "spans",
    "memory",
    "samples",
    "optimizer_step",
    "scalars",
    "SIGNALS",
    "signal_for",
]

_ns = Namespace()

run_started: Signal = _ns.signal(
    "twinkle.run_started", doc="A run began (event: RunStarted). Published once, first."
)
iteration_started: Signal = _ns.signal(
    "twinkle.iteration_started",
    doc="The driver began an iteration (event: IterationStarted). Every span that closed "
    "before it has already been published in a span batch.",
)
weights_published: Signal = _ns.signal(
    "twinkle.weights_published",
    doc="Every engine acknowledged loading new weights (event: WeightsPublished): the real "
    "completion, never the send.",
)
snapshot: Signal = _ns.signal(
    "twinkle.snapshot", doc="A plain dict of driver state (event: Snapshot)."
)
run_finished: Signal = _ns.signal(
    "twinkle.run_finished",
    doc="The run ended (event: RunFinished). Published once, last, after a final span flush.",
)
spans: Signal = _ns.signal(
    "twinkle.spans", doc="A batch of finished spans drained from one recorder (event: SpanBatch)."
)
memory: Signal = _ns.signal(
    "twinkle.memory", doc="Raw per-worker memory readings (event: MemoryReadings)."
)
samples: Signal = _ns.signal(
    "twinkle.samples",
    doc="The caller's samples with per-sample token lengths, tagged with a phase "
    "(event: SamplesObserved).",
)
optimizer_step: Signal = _ns.signal(
    "twinkle.optimizer_step", doc="The trainer took an optimizer step (event: OptimizerStep)."
)

scalars: Signal = _ns.signal(
    "twinkle.scalars",
    doc="The caller's named per-iteration figures, e.g. reward and loss (event: ScalarsObserved).",
)

SIGNALS: dict[type[Event], Signal] = {
    RunStarted: run_started,
    IterationStarted: iteration_started,
    WeightsPublished: weights_published,
    Snapshot: snapshot,
    RunFinished: run_finished,
    SpanBatch: spans,
    MemoryReadings: memory,
    SamplesObserved: samples,
    OptimizerStep: optimizer_step,
    ScalarsObserved: scalars,
}


def signal_for(event: Event) -> Signal:
    """The signal that carries ``event``."""
    return SIGNALS[type(event)]
