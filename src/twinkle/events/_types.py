"""Event values: frozen, typed, units in field names, JSON round-trip.

Every observation travels as one of these values. They carry all the times an observer
needs (monotonic ns of the publishing process, wall ns where a human time is wanted), so
observers never read a clock themselves and replaying the log reproduces every record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from twinkle.perf import ClockAnchor, Span
from twinkle.perf.stats import MemoryReading

__all__ = [
    "Event",
    "RunStarted",
    "IterationStarted",
    "EngineAck",
    "WeightsPublished",
    "Snapshot",
    "RunFinished",
    "SpanBatch",
    "MemoryReadings",
    "SamplesObserved",
    "OptimizerStep",
    "ScalarsObserved",
    "EVENT_TYPES",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: the run it belongs to and when it was published.

    ``monotonic_ns`` is the publishing process's monotonic clock (the bus clock);
    ``wall_ns`` is unix-epoch nanoseconds read at the same moment.
    """

    TYPE: ClassVar[str] = "event"

    run_id: str
    monotonic_ns: int
    wall_ns: int


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    """A run began. ``config`` is the caller's observer configuration (business
    definitions: phases, which samples count, device denominators) as plain JSON data, so
    that a replay rebuilds identical observers. ``anchor`` aligns this process's clock."""

    TYPE: ClassVar[str] = "run_started"

    anchor: ClockAnchor
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IterationStarted(Event):
    """Iteration ``iteration`` (0-based) began; published by the driver."""

    TYPE: ClassVar[str] = "iteration_started"

    iteration: int


@dataclass(frozen=True, slots=True)
class EngineAck:
    """One engine confirmed it loaded weight ``version`` at ``acked_ns`` (bus clock)."""

    engine: str
    acked_ns: int


@dataclass(frozen=True, slots=True)
class WeightsPublished(Event):
    """Every engine has loaded weight ``version``: the real completion, not the send.

    ``start_ns`` is when publishing began, ``end_ns`` when the last acknowledgement
    arrived; ``acks`` holds one entry per engine."""

    TYPE: ClassVar[str] = "weights_published"

    version: int
    start_ns: int
    end_ns: int
    acks: tuple[EngineAck, ...]


@dataclass(frozen=True, slots=True)
class Snapshot(Event):
    """A plain ``dict`` of driver state (counts, version, queue high-water mark...)."""

    TYPE: ClassVar[str] = "snapshot"

    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    """The run ended. ``status`` is ``"ok"`` or ``"error"`` (``error`` names it).

    ``terminal_totals`` are the producers' own end-of-run counts that calibrate the
    summary; ``records_dropped`` counts records the writers could not keep (0 unless a
    bounded queue was configured to drop)."""

    TYPE: ClassVar[str] = "run_finished"

    status: str = "ok"
    error: str | None = None
    terminal_totals: dict[str, int | float] = field(default_factory=dict)
    records_dropped: int = 0
    process_wall_ns: int | None = None


@dataclass(frozen=True, slots=True)
class SpanBatch(Event):
    """Spans drained from one :class:`~twinkle.perf.TimeRecorder`.

    ``source`` names the recorder; ``anchor`` is its process's clock anchor so spans of
    other processes can be placed on this run's timeline."""

    TYPE: ClassVar[str] = "spans"

    source: str
    anchor: ClockAnchor
    spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class MemoryReadings(Event):
    """Raw per-worker memory readings taken during ``iteration`` (None: outside any)."""

    TYPE: ClassVar[str] = "memory"

    iteration: int | None
    readings: tuple[MemoryReading, ...]


@dataclass(frozen=True, slots=True)
class SamplesObserved(Event):
    """The caller's business observation: samples of ``iteration`` with their token
    lengths (caller-defined: e.g. prompt + response tokens), tagged with a phase name.

    ``groups`` counts the generation groups these samples form (0 when not grouped)."""

    TYPE: ClassVar[str] = "samples"

    iteration: int
    phase: str
    lengths: tuple[int, ...]
    groups: int = 0


@dataclass(frozen=True, slots=True)
class OptimizerStep(Event):
    """The trainer took optimizer step ``step`` (1-based count so far) in ``iteration``."""

    TYPE: ClassVar[str] = "optimizer_step"

    iteration: int
    step: int
    samples: int = 0


@dataclass(frozen=True, slots=True)
class ScalarsObserved(Event):
    """The caller's named per-iteration figures (e.g. ``name="grpo"``, values reward_mean,
    loss, kl): numbers only, keys carry their units or are unitless."""

    TYPE: ClassVar[str] = "scalars"

    iteration: int
    name: str
    values: dict[str, int | float]


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        IterationStarted,
        WeightsPublished,
        Snapshot,
        RunFinished,
        SpanBatch,
        MemoryReadings,
        SamplesObserved,
        OptimizerStep,
        ScalarsObserved,
    )
}


def event_field_names(cls: type[Event]) -> tuple[str, ...]:
    """Field names of an event class in declaration order (the JSON key order)."""
    return tuple(f.name for f in fields(cls))
