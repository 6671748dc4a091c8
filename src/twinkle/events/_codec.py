"""Validation and the JSON form of events, both derived from the event definitions.

The JSON form is ``{"type": TYPE, <fields in declaration order>}``, one strict-JSON line
per event (NaN and infinities are written as ``null``). :func:`validate_event` checks an
event against its type's declared field types and bounds (in C, by :mod:`msgspec`) and
returns a checked copy: what the observers receive is exactly what a replay decodes from
the log. Numbers from numpy or torch (anything with ``tolist()``) become plain numbers.
Both the checked copy and a decoded event hold their free-form values (``config``,
``state``, number maps, span ``attrs``) read-only (:func:`~twinkle.events.freeze`): an
observer cannot change what the others, the log or the caller see.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, Union

import msgspec
import orjson

from twinkle.checks import INT64_MAX, INT64_MIN, explain, is_text
from twinkle.checks import run_id as check_run_id
from twinkle.errors import RecordError
from twinkle.events._columns import SpanBatchLine, batch_line, line_batch
from twinkle.events._frozen import EMPTY, freeze
from twinkle.events._types import EVENT_TYPES, Event, SpanBatch
from twinkle.perf import Span

__all__ = [
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
    "loads_event",
    "loggable_spans",
    "read_back",
    "validate_event",
]

_log = logging.getLogger("twinkle.events")

# What a line holds: the events, but a span batch as its line (columns, or a list).
_LINE_TYPES: dict[str, type[Event]] = {**EVENT_TYPES, SpanBatch.TYPE: SpanBatchLine}
_ANY_EVENT: Any = Union[tuple(_LINE_TYPES.values())]  # noqa: UP007 - a runtime union


def _builtin(value: Any) -> Any:
    """Numbers from numpy and torch (scalars, 0-d tensors, arrays) as plain values."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__qualname__} is not a JSON value")


def _free_fields(cls: type[Event]) -> tuple[str, ...]:
    """The fields of ``cls`` typed ``dict[str, Any]`` (config, state): free-form JSON."""
    info = msgspec.inspect.type_info(cls)
    if not isinstance(info, msgspec.inspect.StructType):  # pragma: no cover - a definition error
        raise TypeError(f"event {cls.__name__} is not a struct")
    return tuple(
        f.name
        for f in info.fields
        if isinstance(f.type, msgspec.inspect.DictType)
        and isinstance(f.type.value_type, msgspec.inspect.AnyType)
    )


def _dict_fields(cls: type[Event]) -> tuple[str, ...]:
    """The fields of ``cls`` that hold a dict (free-form JSON or a number map)."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(f.name for f in info.fields if isinstance(f.type, msgspec.inspect.DictType))


_FREE_FIELDS = {cls: _free_fields(cls) for cls in EVENT_TYPES.values()}
_DICT_FIELDS = {cls: _dict_fields(cls) for cls in EVENT_TYPES.values()}
_HOLDS_DICTS = frozenset(cls for cls, names in _DICT_FIELDS.items() if names) | {SpanBatch}
_setattr = msgspec.structs.force_setattr


def _frozen(event: _E) -> _E:
    """``event`` (a fresh copy: checked or decoded) with its dicts made read-only."""
    kind = type(event)
    if kind not in _HOLDS_DICTS:
        return event
    for name in _DICT_FIELDS[kind]:
        _setattr(event, name, freeze(getattr(event, name)))
    if kind is SpanBatch:
        for span in event.spans:  # type: ignore[attr-defined]
            attrs = span.attrs
            _setattr(span, "attrs", freeze(attrs) if attrs else EMPTY)
    return event


_ENCODER = msgspec.json.Encoder(enc_hook=_builtin)
_to_builtins = msgspec.to_builtins
_TEXT = msgspec.json.Encoder().encode  # (a value's JSON: UnicodeEncodeError on a surrogate)
_convert = msgspec.convert
_DECODER = msgspec.json.Decoder(_ANY_EVENT)
_JSON = "str, int, float, bool, None, lists and dicts with str keys"
_UNKNOWN = "unknown event type {kind!r}; known types: " + ", ".join(sorted(EVENT_TYPES))


def _invalid(exc: msgspec.ValidationError, kind: object, data: Any) -> RecordError:
    message = str(exc)
    run_id = data.get("run_id") if isinstance(data, Mapping) else None
    if "matching regex" in message and message.endswith(".run_id`"):
        try:  # the regex is unreadable: say the rule in words
            check_run_id(run_id, error=RecordError)
        except RecordError as bad:
            return RecordError(f"event {kind!r}: {bad}")
    if isinstance(kind, str) and kind in EVENT_TYPES:
        explained = explain(exc, data, kind)
        if explained.startswith(f"{kind}."):  # it names the field: enough said
            return RecordError(explained)
        return RecordError(f"event {kind!r}{explained.removeprefix(kind)}")
    if "`$.type`" in message or "missing required field `type`" in message:
        return RecordError(_UNKNOWN.format(kind=kind))
    return RecordError(f"malformed event: {explain(exc, data, 'event')}")


_E = TypeVar("_E", bound=Event)


def validate_event(event: _E) -> _E:
    """``event`` checked against its type: a copy of plain, validated values, or a
    :class:`RecordError` naming the first malformed field."""
    try:
        data = _to_builtins(event)
    except TypeError:  # numbers from numpy or torch; or a value the log cannot hold
        data = event_to_dict(event)  # (without the hook when none is needed: 0.3 µs less)
    kind = type(event)
    for name in _FREE_FIELDS[kind]:
        # What a replay reads back, exactly: NaN and infinities become None; an int
        # beyond 64 bits or a non-str key is refused (orjson, the log's reader, would
        # read a float or fail where the run saw an int).
        data[name] = _as_read_back(event.TYPE, name, data.get(name))
    try:
        checked: _E = _convert(data, kind)
    except msgspec.ValidationError as exc:
        raise _invalid(exc, event.TYPE, data) from None
    if kind is SpanBatch:  # (its spans' text escaped, the rest checked)
        checked = _text_spans(checked)  # type: ignore[arg-type, assignment]
        data = {k: data[k] for k in ("source", "anchor", "sent_anchor") if k in data}
    try:
        _TEXT(data if kind is SpanBatch else checked)  # (in C: every str of it is text)
    except UnicodeEncodeError:
        raise RecordError(
            f"{event.TYPE}{_not_text(data)} is not valid UTF-8 (a lone surrogate, as "
            "os.fsdecode gives for bytes that are not UTF-8): pass text (decode bytes with "
            "errors='replace', or os.fsencode(name).decode(errors='backslashreplace'))"
        ) from None
    return _frozen(checked)


def _text_spans(batch: SpanBatch) -> SpanBatch:
    """``batch`` with each span whose name, error or attrs hold text that is not UTF-8
    escaped (:func:`loggable_spans`' rule: a drained span is never refused for it)."""
    if _encodes(batch.spans):  # (the common case, one call in C)
        return batch
    spans = tuple(s if _encodes(s) else _loggable(s, batch.source) for s in batch.spans)
    return msgspec.structs.replace(batch, spans=spans)


def _not_text(value: Any, path: str = "") -> str:
    """Where in ``value`` (plain JSON values) the first str that is not UTF-8 text is,
    as ``.field[index]['key']``."""
    if isinstance(value, str):
        return path if not is_text(value) else ""
    pairs: Iterable[tuple[Any, Any]] = ()
    if isinstance(value, dict):
        for k in value:
            if isinstance(k, str) and not is_text(k):
                return f"{path}[{k!r}] (the key)"
        pairs = ((f"[{k!r}]" if path else f".{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        pairs = ((f"[{i}]", v) for i, v in enumerate(value))
    for step, item in pairs:
        found = _not_text(item, path + step)
        if found:
            return found
    return ""


def _escaped(value: str) -> str:
    """``value`` with each lone surrogate written as its escape (``\\udcff``)."""
    return value if is_text(value) else value.encode(errors="backslashreplace").decode()


def read_back(value: Any) -> Any:
    """``value`` as the event log's reader (orjson) reads it back: NaN and infinities as
    None, tuples as lists. Raises ``TypeError`` for what it cannot read back as it was
    (an int beyond 64 bits becomes a float, a non-str key is refused)."""
    return orjson.loads(orjson.dumps(value))


def _as_read_back(kind: str, name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        return value  # the type check names it
    try:
        return read_back(value)
    except TypeError as exc:
        key = next((k for k, v in value.items() if not _reads_back({k: v})), None)
        where = f"{kind}.{name}" if key is None else f"{kind}.{name}[{key!r}]"
        raise RecordError(
            f"{where} cannot be read back from the log as it is ({exc}): use str keys and "
            "ints within 64 bits (or pass the number as a float or a str)"
        ) from None


def _reads_back(value: object) -> bool:
    try:
        read_back(value)
    except TypeError:
        return False
    return True


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON-ready dict of ``event`` (nested values as plain dicts and lists)."""
    try:
        data: dict[str, Any] = msgspec.to_builtins(event, enc_hook=_builtin)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _not_json(event, exc) from None
    return data


def _not_json(event: Event, exc: Exception) -> RecordError:
    return RecordError(
        f"{_unjsonable(event)} is not JSON-serialisable ({exc}); values must be {_JSON}"
    )


def _unjsonable(event: Event) -> str:
    """Where the first value the log cannot hold sits (``snapshot.state['obj']``)."""
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if _fits(value):
            continue
        if isinstance(value, Mapping):
            key = next((k for k, v in value.items() if not _fits({k: v})), None)
            return f"{event.TYPE}.{name}[{key!r}]"
        if isinstance(value, tuple):
            i = next((i for i, v in enumerate(value) if not _fits(v)), None)
            return f"{event.TYPE}.{name}[{i}]"
        return f"{event.TYPE}.{name}"
    return f"event {event.TYPE!r}"


def _fits(value: object) -> bool:
    try:
        msgspec.to_builtins(value, enc_hook=_builtin)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def dumps_event(event: Event) -> bytes:
    """One strict-JSON line (without the newline) for ``event`` (a span batch's spans as
    columns, :mod:`twinkle.events._columns`)."""
    try:
        return _ENCODER.encode(batch_line(event) if type(event) is SpanBatch else event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _not_json(event, exc) from None


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its JSON dict; a clear :class:`RecordError` names what is off."""
    if not isinstance(data, Mapping):
        raise RecordError(f"an event must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(_UNKNOWN.format(kind=kind))
    try:
        # The concrete type, not the union of all: msgspec converts 10x faster.
        event: Event = _convert(data, _LINE_TYPES[cls.TYPE])
    except msgspec.ValidationError as exc:
        raise _invalid(exc, kind, data) from None
    return _decoded(event)


def _decoded(event: Event) -> Event:
    """The event a decoded line holds, its dicts read-only."""
    if type(event) is SpanBatchLine:
        batch = line_batch(event)
        return batch if event.spans is None else _frozen(batch)  # (columns: frozen already)
    return _frozen(event)


def loads_event(line: bytes | str) -> Event:
    """Parse one JSON line into a checked event."""
    try:
        event: Event = _DECODER.decode(line)
    except msgspec.ValidationError as exc:
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            raise RecordError(
                f"an event must be a JSON object, got {type(data).__name__}"
            ) from None
        raise _invalid(exc, data.get("type"), data) from None
    except msgspec.DecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from None
    return _decoded(event)


def _flat(attrs: Any) -> bool:
    """Whether ``attrs`` has str keys and only values the log reads back unchanged
    without a round trip: str, bool, None, 64-bit ints, finite floats (a loop, not a
    generator over it: it runs per span of every batch)."""
    for k, v in attrs.items():
        if type(k) is not str:
            return False
        kind = type(v)
        if kind is str or kind is bool or v is None:
            continue
        if kind is int:
            if INT64_MIN <= v <= INT64_MAX:
                continue
            return False
        if kind is not float or not math.isfinite(v):
            return False
    return True


def loggable_spans(spans: tuple[Any, ...], source: str) -> tuple[Any, ...]:
    """Spans whose attrs are what the log reads back (:func:`read_back`): observers and
    a replay see the same values. A value the log cannot hold as it is (an object, a set,
    an int beyond 64 bits, a non-str key) is replaced by its ``repr`` and logged, so the
    span and the rest of its batch still reach the observers and the log (the span was
    already drained: refusing it would lose it). A value whose ``repr`` raises too is
    written as ``<unrepresentable TYPE>``: the spans are flushed at an iteration's
    boundary, which an attribute must never take down with it. (Text that is not UTF-8
    is escaped as the batch is checked, :func:`validate_event`.)"""
    out: list[Any] | None = None
    for i, span in enumerate(spans):
        if type(span) is not Span:
            continue  # validation names it
        attrs = span.attrs
        if not attrs or _flat(attrs):
            continue  # the common case: flat str, bool, None, 64-bit ints, finite floats
        if out is None:
            out = list(spans)
        out[i] = _loggable(span, source)
    return spans if out is None else tuple(out)


def _encodes(value: object) -> bool:
    """Whether ``value`` (spans) encodes to JSON as it is."""
    try:
        _TEXT(value)
    except (TypeError, ValueError, OverflowError):  # (UnicodeEncodeError: a ValueError)
        return False
    return True


def _loggable(span: Span, source: str) -> Span:
    """``span`` as the log can hold it: a name or an error that is not UTF-8 text with
    its lone surrogates escaped, attrs as :func:`loggable_spans` says (a key not text
    escaped too)."""
    name, error = _escaped(span.name), span.error
    if isinstance(error, str):
        error = _escaped(error)
    if name != span.name or error != span.error:
        _log.warning(
            "span %r (source %r): its name or error is not UTF-8 text; written with its "
            "lone surrogates escaped: pass text (os.fsdecode gives surrogates for bytes "
            "that are not UTF-8)",
            name,
            source,
        )
    fixed: dict[str, Any] = {}
    bad: list[str] = []
    for k, v in span.attrs.items():
        key = _escaped(k) if isinstance(k, str) else _shown(k, str)
        try:
            fixed[key] = read_back(v) if isinstance(k, str) else _shown(v)
        except (TypeError, ValueError):
            fixed[key] = _shown(v)
            bad.append(key)
        else:
            if key != k:
                bad.append(key)
    if bad:
        _log.warning(
            "span %r (source %r) has attribute(s) %s that are not JSON; written as "
            "their repr (<unrepresentable TYPE> where the repr raised): pass str, "
            "int, float, bool, None, lists or dicts",
            name,
            source,
            sorted(bad),
        )
    return msgspec.structs.replace(span, name=name, error=error, attrs=fixed)


def _shown(value: object, show: Callable[[object], str] = repr) -> str:
    """``show(value)`` cut to 200 characters, or ``<unrepresentable TYPE>`` when the
    value's ``__repr__`` (``__str__``) raises."""
    try:
        return show(value)[:200]
    except Exception:
        return f"<unrepresentable {type(value).__qualname__}>"
