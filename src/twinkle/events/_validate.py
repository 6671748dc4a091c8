"""Checks that make a malformed event fail loudly, naming the field, before any observer
sees it (a silent wrong figure is worse than an error).

Every field is checked against its declared type, so an event rebuilt from a corrupted
log line either equals what was published or is refused here, and an event the bus
accepts can always be written to the log (64-bit integers, JSON values only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from twinkle.errors import RecordError
from twinkle.events._types import (
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
    WeightsPublished,
)
from twinkle.perf import ClockAnchor, Span
from twinkle.perf.stats import MemoryReading

__all__ = ["MAX_TOKENS", "validate_event"]

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1  # orjson writes signed and unsigned 64-bit integers
#: Largest token count of one sample (what a float sum keeps exactly).
MAX_TOKENS = 2**53 - 1
_JSON_OPTION = orjson.OPT_SERIALIZE_NUMPY


def _int(
    event: Event, name: str, value: Any, *, minimum: int | None = 0, maximum: int = _INT_MAX
) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(
            f"{event.TYPE}.{name} must be an int, got {value!r:.100} ({type(value).__name__})"
        )
    if minimum is not None and value < minimum:
        raise RecordError(f"{event.TYPE}.{name} must be >= {minimum}, got {value!r}")
    if value < _INT_MIN or value > maximum:
        raise RecordError(f"{event.TYPE}.{name} must be at most {maximum}, got {value!r}")


def _opt_int(event: Event, name: str, value: Any) -> None:
    if value is not None:
        _int(event, name, value)


def _name(event: Event, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{event.TYPE}.{name} must be a non-empty string, got {value!r:.100}")


def _opt_str(event: Event, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{event.TYPE}.{name} must be a string or None, got {value!r:.100}")


def _numbers(event: Event, name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise RecordError(f"{event.TYPE}.{name} must be a dict, got {value!r:.100}")
    for key, number in value.items():
        if (
            not isinstance(key, str)
            or isinstance(number, bool)
            or not isinstance(number, int | float)
        ):
            raise RecordError(
                f"{event.TYPE}.{name}[{key!r}] must map a str to a number, got {number!r:.100}"
            )
        if isinstance(number, int):
            _int(event, f"{name}[{key!r}]", number, minimum=None)


def _json_dict(event: Event, name: str, value: Any) -> None:
    """A dict of JSON values (the log must be able to hold it); names the bad key."""
    if not isinstance(value, dict):
        raise RecordError(f"{event.TYPE}.{name} must be a dict, got {value!r:.100}")
    try:
        orjson.dumps(value, option=_JSON_OPTION)
    except TypeError as exc:
        culprit = next((k for k in value if not _is_json({k: value[k]})), None)
        where = f"{name}[{culprit!r}]" if culprit is not None else name
        raise RecordError(
            f"{event.TYPE}.{where} is not JSON ({exc}); use str keys and JSON values "
            "(str, int in 64 bits, float, bool, None, lists, dicts)"
        ) from None


def _is_json(value: Any) -> bool:
    try:
        orjson.dumps(value, option=_JSON_OPTION)
    except TypeError:
        return False
    return True


def _anchor(event: Event, name: str, anchor: Any) -> None:
    if not isinstance(anchor, ClockAnchor):
        raise RecordError(f"{event.TYPE}.{name} must be a ClockAnchor, got {anchor!r:.100}")
    _int(event, f"{name}.monotonic_ns", anchor.monotonic_ns, minimum=None)
    _int(event, f"{name}.wall_ns", anchor.wall_ns)
    _int(event, f"{name}.pid", anchor.pid)
    if not isinstance(anchor.hostname, str):
        raise RecordError(f"{event.TYPE}.{name}.hostname must be a string")


def _span(event: Event, i: int, s: Any) -> None:
    where = f"spans[{i}]"
    if not isinstance(s, Span):
        raise RecordError(f"{event.TYPE}.{where} must be a Span, got {s!r:.100}")
    if not isinstance(s.name, str) or not s.name:
        raise RecordError(f"{event.TYPE}.{where}.name must be a non-empty string")
    _int(event, f"{where}.start_ns", s.start_ns, minimum=None)
    _int(event, f"{where}.end_ns", s.end_ns, minimum=None)
    if s.end_ns < s.start_ns:
        raise RecordError(
            f"{event.TYPE}.{where} ({s.name!r}) ends before it starts ({s.end_ns} < {s.start_ns})"
        )
    _int(event, f"{where}.thread_id", s.thread_id)
    _int(event, f"{where}.pid", s.pid)
    if not isinstance(s.attrs, Mapping):
        raise RecordError(f"{event.TYPE}.{where}.attrs must be a mapping, got {s.attrs!r:.100}")
    _opt_str(event, f"{where}.error", s.error)


_READING_STR = ("worker_id", "hostname", "device")
_READING_INT = ("pid", "host_rss_bytes", "host_peak_rss_bytes")
_READING_OPT_INT = (
    "rank",
    "device_allocated_bytes",
    "device_allocated_peak_bytes",
    "device_reserved_bytes",
    "device_reserved_peak_bytes",
)


def _reading(event: Event, i: int, r: Any) -> None:
    where = f"readings[{i}]"
    if not isinstance(r, MemoryReading):
        raise RecordError(f"{event.TYPE}.{where} must be a MemoryReading, got {r!r:.100}")
    for key in _READING_STR:
        if not isinstance(getattr(r, key), str):
            raise RecordError(
                f"{event.TYPE}.{where}.{key} must be a string, got {getattr(r, key)!r:.100}"
            )
    for key in _READING_INT:
        _int(event, f"{where}.{key}", getattr(r, key))
    for key in _READING_OPT_INT:
        _opt_int(event, f"{where}.{key}", getattr(r, key))


def _ack(event: Event, i: int, a: Any) -> None:
    if not isinstance(a, EngineAck):
        raise RecordError(f"{event.TYPE}.acks[{i}] must be an EngineAck, got {a!r:.100}")
    _name(event, f"acks[{i}].engine", a.engine)
    _int(event, f"acks[{i}].acked_ns", a.acked_ns, minimum=None)


def validate_event(event: Event) -> None:
    """Raise :class:`RecordError` naming the first malformed field of ``event``."""
    _name(event, "run_id", event.run_id)
    _int(event, "monotonic_ns", event.monotonic_ns, minimum=None)
    _int(event, "wall_ns", event.wall_ns)
    if isinstance(event, SpanBatch):
        _name(event, "source", event.source)
        _anchor(event, "anchor", event.anchor)
        for i, s in enumerate(event.spans):
            # Fast path (a few µs per thousand spans): exact types; the slow check only
            # runs to name the culprit.
            if (
                type(s) is not Span
                or type(s.start_ns) is not int
                or type(s.end_ns) is not int
                or s.end_ns < s.start_ns
                or type(s.name) is not str
                or not s.name
                or type(s.thread_id) is not int
                or type(s.pid) is not int
                or (s.error is not None and type(s.error) is not str)
                or (type(s.attrs) is not dict and not isinstance(s.attrs, Mapping))
            ):
                _span(event, i, s)
    elif isinstance(event, IterationStarted):
        _int(event, "iteration", event.iteration)
    elif isinstance(event, SamplesObserved):
        _int(event, "iteration", event.iteration)
        _name(event, "phase", event.phase)
        _int(event, "groups", event.groups)
        lengths = event.lengths
        # Fast path for the common case (all plain ints in range); the slow loop only
        # runs to name the culprit.
        if not (
            all(type(n) is int for n in lengths)
            and (not lengths or (min(lengths) >= 0 and max(lengths) <= MAX_TOKENS))
        ):
            for i, n in enumerate(lengths):
                if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOKENS:
                    raise RecordError(
                        f"samples.lengths[{i}] must be a non-negative int token count "
                        f"(at most 2**53 - 1), got {n!r:.100}"
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
        for i, a in enumerate(event.acks):
            _ack(event, i, a)
    elif isinstance(event, ScalarsObserved):
        _int(event, "iteration", event.iteration)
        _name(event, "name", event.name)
        _numbers(event, "values", event.values)
    elif isinstance(event, MemoryReadings):
        _opt_int(event, "iteration", event.iteration)
        for i, r in enumerate(event.readings):
            _reading(event, i, r)
    elif isinstance(event, RunStarted):
        _anchor(event, "anchor", event.anchor)
        _json_dict(event, "config", event.config)
    elif isinstance(event, Snapshot):
        _json_dict(event, "state", event.state)
    elif isinstance(event, RunFinished):
        if event.status not in ("ok", "error"):
            raise RecordError(
                f"run_finished.status must be 'ok' or 'error', got {event.status!r:.100}"
            )
        _opt_str(event, "error", event.error)
        _int(event, "records_dropped", event.records_dropped)
        _opt_int(event, "process_wall_ns", event.process_wall_ns)
        _numbers(event, "terminal_totals", event.terminal_totals)
