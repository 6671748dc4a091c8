"""Checks that make a malformed event fail loudly, naming the field, before any observer
sees it (a silent wrong figure is worse than an error)."""

from __future__ import annotations

from typing import Any

from twinkle.errors import RecordError
from twinkle.events._types import (
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    SamplesObserved,
    ScalarsObserved,
    SpanBatch,
    WeightsPublished,
)

__all__ = ["validate_event"]


def _int(event: Event, name: str, value: Any, *, minimum: int | None = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(
            f"{event.TYPE}.{name} must be an int, got {value!r} ({type(value).__name__})"
        )
    if minimum is not None and value < minimum:
        raise RecordError(f"{event.TYPE}.{name} must be >= {minimum}, got {value!r}")


def _name(event: Event, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{event.TYPE}.{name} must be a non-empty string, got {value!r}")


def validate_event(event: Event) -> None:
    """Raise :class:`RecordError` naming the first malformed field of ``event``."""
    _name(event, "run_id", event.run_id)
    _int(event, "monotonic_ns", event.monotonic_ns, minimum=None)
    _int(event, "wall_ns", event.wall_ns)
    if isinstance(event, IterationStarted):
        _int(event, "iteration", event.iteration)
    elif isinstance(event, SamplesObserved):
        _int(event, "iteration", event.iteration)
        _name(event, "phase", event.phase)
        _int(event, "groups", event.groups)
        lengths = event.lengths
        # Fast path for the common case (all plain non-negative ints); the slow loop
        # only runs to name the culprit.
        if not (all(type(n) is int for n in lengths) and (not lengths or min(lengths) >= 0)):
            for i, n in enumerate(lengths):
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise RecordError(
                        f"samples.lengths[{i}] must be a non-negative int token count, got {n!r}"
                    )
    elif isinstance(event, OptimizerStep):
        _int(event, "iteration", event.iteration)
        _int(event, "step", event.step, minimum=1)
        _int(event, "samples", event.samples)
    elif isinstance(event, WeightsPublished):
        _int(event, "version", event.version)
        _int(event, "start_ns", event.start_ns, minimum=None)
        _int(event, "end_ns", event.end_ns, minimum=None)
        if event.end_ns < event.start_ns:
            raise RecordError(
                f"weights_published.end_ns ({event.end_ns}) is before start_ns "
                f"({event.start_ns}); pass the time the last engine acknowledged"
            )
    elif isinstance(event, SpanBatch):
        _name(event, "source", event.source)
        for i, s in enumerate(event.spans):
            if not isinstance(s.name, str) or not s.name:
                raise RecordError(f"spans.spans[{i}].name must be a non-empty string")
            if s.end_ns < s.start_ns:
                raise RecordError(
                    f"spans.spans[{i}] ({s.name!r}) ends before it starts "
                    f"({s.end_ns} < {s.start_ns})"
                )
    elif isinstance(event, ScalarsObserved):
        _int(event, "iteration", event.iteration)
        _name(event, "name", event.name)
        if not isinstance(event.values, dict):
            raise RecordError(f"scalars.values must be a dict, got {event.values!r}")
        for key, value in event.values.items():
            if (
                not isinstance(key, str)
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
            ):
                raise RecordError(
                    f"scalars.values[{key!r}] must map a str to a number, got {value!r}"
                )
    elif isinstance(event, MemoryReadings):
        if event.iteration is not None:
            _int(event, "iteration", event.iteration)
    elif isinstance(event, RunFinished):
        if event.status not in ("ok", "error"):
            raise RecordError(f"run_finished.status must be 'ok' or 'error', got {event.status!r}")
        _int(event, "records_dropped", event.records_dropped)
        for key, value in event.terminal_totals.items():
            if (
                not isinstance(key, str)
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
            ):
                raise RecordError(
                    f"run_finished.terminal_totals[{key!r}] must map a str to a number, "
                    f"got {value!r}"
                )
