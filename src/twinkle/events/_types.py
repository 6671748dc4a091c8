"""Event values: frozen, typed, units in field names, JSON round-trip.

Every observation travels as one of these values. They carry all the times an observer
needs (monotonic ns of the publishing process, wall ns where a human time is wanted), so
observers never read a clock themselves and replaying the log reproduces every record.

**Each event type is defined once, here**: a frozen :mod:`msgspec` struct whose tag is
its ``TYPE``. Everything else derives from that definition — its signal and its hook
(``twinkle.<TYPE>``, ``twinkle_<TYPE>``), its validation (the field types and their
bounds, checked in C), and its JSON form (``{"type": TYPE, <fields in order>}``). Why
msgspec rather than dataclasses with orjson: docs/architecture.md, "Event values".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from twinkle.checks import INT64_MAX, Count, Int64, NonEmpty, SafeName, Tokens
from twinkle.errors import RecordError
from twinkle.perf import ClockAnchor, Span
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import BackendHealth

__all__ = [
    "EVENT_TYPES",
    "BackendsClosed",
    "EngineAck",
    "Event",
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
]

# A number-only mapping. JSON has no NaN or infinity (they are written as ``null``), so
# the decoder accepts ``null``, and every non-finite value becomes NaN, live and in a
# replay alike (_nonfinite_as_nan). Type checkers see the numbers only.
if TYPE_CHECKING:
    Numbers = dict[str, int | float]
else:
    Numbers = dict[str, Int64 | float | None]

#: How a run ended.
Status = Literal["ok", "error"]


class Event(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    """Base of every event: the run it belongs to and when it was published.

    ``monotonic_ns`` is the publishing process's monotonic clock (the bus clock);
    ``wall_ns`` is unix-epoch nanoseconds read at the same moment.
    """

    #: the event's name: its JSON tag, and the suffix of its signal and hook names
    TYPE: ClassVar[str] = "event"

    run_id: SafeName
    monotonic_ns: Int64
    wall_ns: Count


_E = TypeVar("_E", bound=type[Event])
_TYPES: list[type[Event]] = []


def _event(cls: _E) -> _E:
    """Register an event type (its tag becomes ``TYPE``)."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):  # pragma: no cover - a definition error
        raise TypeError(f"event {cls.__name__} needs a tag")
    cls.TYPE = tag
    _TYPES.append(cls)
    return cls


def _nonfinite_as_nan(event: Event, name: str, values: object) -> None:
    """Every non-finite number of a number map as NaN (JSON ``null`` included), so the
    observers of a live run see what a replay of its log sees."""
    if type(values) is not dict:
        return  # the type check names it
    if any(v is None or (type(v) is float and not math.isfinite(v)) for v in values.values()):
        fixed = {
            k: math.nan if v is None or (type(v) is float and not math.isfinite(v)) else v
            for k, v in values.items()
        }
        msgspec.structs.force_setattr(event, name, fixed)


@_event
class RunStarted(Event, tag="run_started", frozen=True):
    """A run began. ``config`` is the caller's observer configuration (business
    definitions: phases, which samples count, device denominators) as plain JSON data, so
    that a replay rebuilds identical observers. ``anchor`` aligns this process's clock.
    Published once, first. ``plugins``: the names of the observer plugins the run
    loaded, sorted (a replay with another set says so); ``plugins_left_out``: those that
    could not set up (their configure or make-backends hook raised), each with why: the
    run went on without them."""

    anchor: ClockAnchor
    config: dict[str, Any] = {}
    plugins: tuple[NonEmpty, ...] = ()
    plugins_left_out: dict[str, str] = {}


@_event
class RunResumed(Event, tag="run_resumed", frozen=True):
    """The run goes on in a new process (a restarted job resuming its run directory):
    segment ``segment`` (1 for the first resume) begins. It follows the ``run_finished``
    that ended the previous segment (written by the resuming process when the previous
    one stopped without finishing). ``config`` is the configuration the new process
    passed: it may differ from the run's only in ``total_steps`` and the caller's ``x_``
    keys, and the new process's observers (and a replay's) use it. ``anchor`` aligns
    the new process's clock, which
    continues the run's timeline (its readings come after every earlier event's).
    ``plugins`` and ``plugins_left_out``: as in ``run_started``, for the new process."""

    anchor: ClockAnchor
    segment: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
    config: dict[str, Any] = {}
    plugins: tuple[NonEmpty, ...] = ()
    plugins_left_out: dict[str, str] = {}


@_event
class IterationStarted(Event, tag="iteration_started", frozen=True):
    """Iteration ``iteration`` (0-based) began; published by the driver. Every span that
    closed before it has already been published in a span batch."""

    iteration: Count


class EngineAck(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One engine confirmed it loaded weight ``version`` at ``acked_ns`` (bus clock)."""

    engine: NonEmpty
    acked_ns: Int64


@_event
class WeightsPublished(Event, tag="weights_published", frozen=True):
    """Every engine has loaded weight ``version``: the real completion, not the send.

    ``start_ns`` is when publishing began, ``end_ns`` when the last acknowledgement
    arrived; ``acks`` holds one entry per engine."""

    version: Count
    start_ns: Int64
    end_ns: Int64
    acks: tuple[EngineAck, ...]

    def __post_init__(self) -> None:
        if type(self.end_ns) is int and type(self.start_ns) is int and self.end_ns < self.start_ns:
            raise RecordError(
                f"weights_published.end_ns ({self.end_ns}) is before start_ns "
                f"({self.start_ns}); pass the time the last engine acknowledged"
            )


@_event
class Snapshot(Event, tag="snapshot", frozen=True):
    """A plain ``dict`` of driver state (counts, version, queue high-water mark...)."""

    state: dict[str, Any]


@_event
class RunFinished(Event, tag="run_finished", frozen=True):
    """The run ended. ``status`` is ``"ok"`` or ``"error"`` (``error`` names it).

    ``terminal_totals`` are the producers' own end-of-run counts that calibrate the
    summary; ``records_dropped`` counts records the writers could not keep (0 unless a
    bounded queue was configured to drop); ``observer_slow_calls`` the observer calls
    over the run's budget so far, per observer (facts of the live run, carried here so
    that a replay's summary says the same). Published once per segment, last, after a
    final span flush."""

    status: Status = "ok"
    error: str | None = None
    terminal_totals: Numbers = {}
    records_dropped: Count = 0
    process_wall_ns: Count | None = None
    observer_slow_calls: dict[str, Count] = {}

    def __post_init__(self) -> None:
        totals = self.terminal_totals
        if type(totals) is dict:
            for key, value in totals.items():
                if value is None or (type(value) is float and not math.isfinite(value)):
                    raise RecordError(
                        f"run_finished.terminal_totals[{key!r}] = {value!r}: terminal totals "
                        "are the producers' finite end-of-run counts; leave out one you do "
                        "not know"
                    )


@_event
class BackendsClosed(Event, tag="backends_closed", frozen=True):
    """What each record backend of the segment did with its records, by name (the
    plugin that made it): written by the run's process once the plugins' backends were
    closed, after the segment's ``run_finished`` (so that a replay's summary says what
    the live run's backends did, not what the replay's own do). None after a segment
    killed outright."""

    backends: dict[str, BackendHealth]


@_event
class SpanBatch(Event, tag="spans", frozen=True):
    """Spans drained from one :class:`~twinkle.perf.TimeRecorder`.

    ``source`` names the recorder; ``anchor`` is its process's clock anchor so spans of
    other processes can be placed on this run's timeline; ``dropped`` counts the spans
    the source recorded but could not ship (a worker report's bound,
    :class:`~twinkle.perf.WorkerReport`); ``sent_anchor`` is the worker's clocks read as
    it made its report (None for the run's own recorders, and in logs of an older
    twinkle): the event's own ``monotonic_ns`` is the report's arrival, so the two check
    the placement for clock skew (docs/metrics.md)."""

    source: NonEmpty
    anchor: ClockAnchor
    spans: tuple[Span, ...]
    dropped: Count = 0
    sent_anchor: ClockAnchor | None = None

    def __post_init__(self) -> None:
        for i, s in enumerate(self.spans):
            try:
                backwards = s.end_ns < s.start_ns
            except (AttributeError, TypeError):  # not a span yet: the type check names it
                continue
            if backwards:
                raise RecordError(
                    f"spans.spans[{i}] ({s.name!r}) ends before it starts "
                    f"({s.end_ns} < {s.start_ns})"
                )


@_event
class MemoryReadings(Event, tag="memory", frozen=True):
    """Raw per-worker memory readings taken during ``iteration`` (None: outside any)."""

    iteration: Count | None
    readings: tuple[MemoryReading, ...]


@_event
class SamplesObserved(Event, tag="samples", frozen=True):
    """The caller's business observation: samples of ``iteration`` with their token
    lengths (caller-defined: e.g. prompt + response tokens), tagged with a phase name.

    ``groups`` counts the generation groups these samples form (0 when not grouped);
    ``prompt_lengths``, when given, the prompt's tokens of each sample (one per length,
    none longer than it: what generation's FLOPs need to tell prefill from decode).
    Not given, it is left out of the log's line (as logs before it had none)."""

    iteration: Count
    phase: NonEmpty
    lengths: tuple[Tokens, ...]
    groups: Count = 0
    prompt_lengths: tuple[Tokens, ...] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        prompts, lengths = self.prompt_lengths, self.lengths
        if isinstance(prompts, msgspec.UnsetType) or not prompts:
            return  # (none; logs of twinkle 78528b1 to 7490213 wrote [] for none)
        if len(prompts) != len(lengths):
            raise RecordError(
                f"samples.prompt_lengths has {len(prompts)} entries for {len(lengths)} "
                "lengths: give one prompt length per sample (or none)"
            )
        for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
            if type(prompt) is int and type(length) is int and prompt > length:
                raise RecordError(
                    f"samples.prompt_lengths[{i}] = {prompt} is longer than its sample "
                    f"(lengths[{i}] = {length}): a length counts the prompt's tokens too"
                )


@_event
class OptimizerStep(Event, tag="optimizer_step", frozen=True):
    """The trainer took optimizer step ``step`` (1-based count so far) in ``iteration``."""

    iteration: Count
    step: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]  # steps so far, 1-based
    samples: Count = 0


@_event
class ScalarsObserved(Event, tag="scalars", frozen=True):
    """The caller's named per-iteration figures (e.g. ``name="grpo"``, values reward_mean,
    loss, kl): numbers only, keys carry their units or are unitless."""

    iteration: Count
    name: NonEmpty
    values: Numbers

    def __post_init__(self) -> None:
        _nonfinite_as_nan(self, "values", self.values)


EVENT_TYPES: dict[str, type[Event]] = {cls.TYPE: cls for cls in _TYPES}
"""Every event type by its ``TYPE``, in definition order."""
