"""JSON form of events: ``{"type": ..., <fields in declaration order>}``.

Serialising relies on orjson's native dataclass support (nested spans, anchors and
readings included); decoding rebuilds the exact frozen values, tuples included, so a
round trip compares equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.events._types import (
    EVENT_TYPES,
    EngineAck,
    Event,
    MemoryReadings,
    RunFinished,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    SpanBatch,
    WeightsPublished,
    event_field_names,
)
from twinkle.perf import ClockAnchor, Span
from twinkle.perf.stats import MemoryReading

__all__ = ["event_to_dict", "event_from_dict", "dumps_event", "loads_event"]

_NAN = float("nan")
_FIELDS: dict[str, tuple[str, ...]] = {t: event_field_names(c) for t, c in EVENT_TYPES.items()}
_ALLOWED: dict[str, frozenset[str]] = {t: frozenset({"type", *f}) for t, f in _FIELDS.items()}


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON-ready dict of ``event`` (nested dataclasses are left for orjson)."""
    out: dict[str, Any] = {"type": event.TYPE}
    for name in _FIELDS[event.TYPE]:
        out[name] = getattr(event, name)
    return out


def dumps_event(event: Event) -> bytes:
    """One strict-JSON line (without the newline) for ``event``."""
    try:
        return orjson.dumps(event_to_dict(event))
    except TypeError as exc:
        raise RecordError(
            f"event {event.TYPE!r} is not JSON-serialisable ({exc}); attrs, config and "
            "state must hold only JSON values (str, int, float, bool, None, lists, dicts "
            "with str keys)"
        ) from exc


def _numbers_from_json(values: Any) -> Any:
    """JSON has no NaN or infinity: orjson writes them as ``null``. In the number-only
    fields (scalars, terminal totals) ``null`` therefore reads back as NaN, so a replay
    sees a non-finite value where the run did (records write both as ``null``)."""
    if isinstance(values, dict) and None in values.values():
        return {k: _NAN if v is None else v for k, v in values.items()}
    return values


def _anchor(d: Mapping[str, Any]) -> ClockAnchor:
    return ClockAnchor(**d)


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its JSON dict; a clear :class:`RecordError` names what is off."""
    if not isinstance(data, Mapping):
        raise RecordError(f"an event must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(
            f"unknown event type {kind!r}; known types: {', '.join(sorted(EVENT_TYPES))}"
        )
    names = _FIELDS[cls.TYPE]
    missing = [n for n in names if n not in data and not _has_default(cls, n)]
    if missing:
        raise RecordError(f"event {kind!r} lacks field(s) {missing}; it cannot be rebuilt")
    if not data.keys() <= _ALLOWED[cls.TYPE]:
        unknown = sorted(str(k) for k in data if k != "type" and k not in names)
        # Never dropped quietly: a mistyped key would otherwise leave a default in place.
        raise RecordError(
            f"event {kind!r} has unknown field(s) {unknown}; known fields: {list(names)}"
        )
    kwargs = {n: data[n] for n in names if n in data}
    try:
        if cls is ScalarsObserved:
            kwargs["values"] = _numbers_from_json(kwargs["values"])
        elif cls is RunFinished and "terminal_totals" in kwargs:
            kwargs["terminal_totals"] = _numbers_from_json(kwargs["terminal_totals"])
        if cls is RunStarted:
            kwargs["anchor"] = _anchor(kwargs["anchor"])
        elif cls is SpanBatch:
            kwargs["anchor"] = _anchor(kwargs["anchor"])
            kwargs["spans"] = tuple(Span.from_dict(s) for s in kwargs["spans"])
        elif cls is WeightsPublished:
            kwargs["acks"] = tuple(EngineAck(**a) for a in kwargs["acks"])
        elif cls is MemoryReadings:
            kwargs["readings"] = tuple(MemoryReading.from_dict(r) for r in kwargs["readings"])
        elif cls is SamplesObserved:
            kwargs["lengths"] = tuple(kwargs["lengths"])
        event = cls(**kwargs)
    except (TypeError, KeyError, AttributeError, InvalidArgumentError) as exc:
        raise RecordError(f"event {kind!r} has a malformed field: {exc}") from exc
    from twinkle.events._validate import validate_event

    validate_event(event)
    return event


def loads_event(line: bytes | str) -> Event:
    """Parse one JSON line into an event."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from exc
    return event_from_dict(data)


def _has_default(cls: type[Event], name: str) -> bool:
    from dataclasses import MISSING, fields

    for f in fields(cls):
        if f.name == name:
            return f.default is not MISSING or f.default_factory is not MISSING
    return False
