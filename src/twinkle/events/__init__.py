"""Events: frozen, typed observation values and the signals that carry them.

Publishers (the driver, recorders, the caller's business code) publish through an
:class:`EventBus`; observers are functions of the events they receive.
"""

from twinkle.events._bus import OVERHEAD_SPAN, EventBus
from twinkle.events._codec import (
    dumps_event,
    event_from_dict,
    event_to_dict,
    loads_event,
    read_back,
    validate_event,
)
from twinkle.events._signals import (
    SIGNALS,
    iteration_started,
    memory,
    optimizer_step,
    run_finished,
    run_started,
    samples,
    scalars,
    signal_for,
    snapshot,
    spans,
    weights_published,
)
from twinkle.events._types import (
    EVENT_TYPES,
    EngineAck,
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
    Status,
    WeightsPublished,
)

__all__ = [
    "OVERHEAD_SPAN",
    "EVENT_TYPES",
    "SIGNALS",
    "EngineAck",
    "Event",
    "EventBus",
    "IterationStarted",
    "MemoryReadings",
    "OptimizerStep",
    "RunFinished",
    "RunStarted",
    "SamplesObserved",
    "ScalarsObserved",
    "Snapshot",
    "SpanBatch",
    "Status",
    "WeightsPublished",
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
    "iteration_started",
    "loads_event",
    "read_back",
    "memory",
    "optimizer_step",
    "run_finished",
    "run_started",
    "samples",
    "scalars",
    "signal_for",
    "snapshot",
    "spans",
    "validate_event",
    "weights_published",
]
