"""Events: frozen, typed observation values and the signals that carry them.

Publishers (the driver, recorders, the caller's business code) publish through an
:class:`EventBus`; observers are functions of the events they receive.
"""

from twinkle.events._bus import OVERHEAD_SOURCE, OVERHEAD_SPAN, EventBus
from twinkle.events._codec import (
    dumps_event,
    event_from_dict,
    event_to_dict,
    loads_event,
    read_back,
    validate_event,
)
from twinkle.events._columns import span_rows
from twinkle.events._frozen import FrozenDict, FrozenList, freeze
from twinkle.events._report import publish_report
from twinkle.events._signals import (
    SIGNALS,
    backends_closed,
    iteration_started,
    memory,
    optimizer_step,
    run_finished,
    run_resumed,
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
    BackendsClosed,
    EngineAck,
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
    Status,
    WeightsPublished,
)

__all__ = [
    "OVERHEAD_SOURCE",
    "OVERHEAD_SPAN",
    "EVENT_TYPES",
    "SIGNALS",
    "BackendsClosed",
    "EngineAck",
    "Event",
    "EventBus",
    "IterationStarted",
    "MemoryReadings",
    "OptimizerStep",
    "FrozenDict",
    "FrozenList",
    "RunFinished",
    "RunResumed",
    "RunStarted",
    "SamplesObserved",
    "ScalarsObserved",
    "Snapshot",
    "SpanBatch",
    "Status",
    "WeightsPublished",
    "backends_closed",
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
    "freeze",
    "iteration_started",
    "loads_event",
    "read_back",
    "memory",
    "optimizer_step",
    "run_finished",
    "run_resumed",
    "run_started",
    "samples",
    "scalars",
    "signal_for",
    "snapshot",
    "span_rows",
    "spans",
    "publish_report",
    "validate_event",
    "weights_published",
]
