"""``MetricRecord``: one validated, immutable, strict-JSON metric record.

A record is checked when it is built (``make_record``, the dataclass constructor,
``dataclasses.replace`` and ``record_from_dict`` all run the same checks), so a record
that exists is a record that serialises to strict JSON and reads back equal:

* ``values`` holds numbers only (``int``/``float``; ``bool`` is rejected because it is
  almost always a mistake for a metric). A non-finite float (NaN, ±inf) is stored as
  ``None`` and its key is named in ``attrs["nonfinite"]`` (a sorted list), so it is never
  dropped and never written as a ``NaN`` token.
* ``attrs`` holds JSON values (None, bool, int, finite float, str, lists, str-keyed
  mappings). It is deep-copied into read-only containers (mappings become read-only
  dicts, lists become tuples), so a record cannot change after it was reported.
* ``seq`` is ``None`` until :class:`~twinkle.reporting.MetricsReporter` stamps it
  (:func:`with_seq`); a stamped record, and so every line of a file, has an int ``seq``.

Building a record is on the training thread's path, so the common case (a plain
``dict`` of ``float``/``int`` values under ASCII ``str`` keys, flat scalar attrs) is
checked with a few C-level passes over the values; anything else takes the entry-by-entry
path, which is the reference: it normalises numeric subtypes and raises the errors.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from twinkle.checks import is_safe_name, plain_number
from twinkle.checks import run_id as check_run_id
from twinkle.errors import RecordError

__all__ = [
    "NONFINITE_ATTR",
    "SCOPES",
    "MetricRecord",
    "flat_key",
    "is_record_kind",
    "make_record",
    "record_fields",
    "record_from_dict",
    "record_to_dict",
    "with_seq",
]

SCOPES: tuple[str, ...] = ("iteration", "window", "run")
"""The scopes a record may have: one iteration, a window of iterations, the whole run."""

NONFINITE_ATTR = "nonfinite"
"""The ``attrs`` key naming the ``values`` keys whose number was not finite (now None)."""

# JSON integers that orjson (and most readers) accept: signed 64-bit up to unsigned max.
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
# hypot(values) at most this: every value is finite and an int among them fits int64
# (with room for the rounding of a large int to float).
_PLAIN_NORM = float(2**62)
_MAX_DEPTH = 64
_KIND_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_FIELDS = (
    "kind",
    "scope",
    "run_id",
    "seq",
    "step",
    "iteration",
    "wall_ns",
    "monotonic_ns",
    "values",
    "attrs",
)
_NUMBER_TYPES = frozenset((int, float))
_STR_TYPES = frozenset((str,))
_isfinite = math.isfinite
_hypot = math.hypot


class _FrozenDict(dict[str, Any]):
    """A read-only ``dict``: orjson serialises it natively (no ``default=`` callback)."""

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("MetricRecord values/attrs are read-only; build a new record instead")

    __setitem__ = _readonly
    __delitem__ = _readonly
    __ior__ = _readonly
    clear = _readonly
    pop = _readonly
    popitem = _readonly
    setdefault = _readonly
    update = _readonly

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        # Immutable, so hashable: records can go in sets and be dict keys.
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return dict.__repr__(self)


_EMPTY = _FrozenDict()
# Fills a _FrozenDict while it is being built (nothing else holds it yet).
_fill_item = dict.__setitem__


# -- scalar fields ---------------------------------------------------------------------


# Pure predicates on str, memoised: a run reports the same few kinds and one run id
# thousands of times, and a cache hit costs less than the regex.
@functools.lru_cache(maxsize=256)
def _is_kind(kind: str) -> bool:
    return _KIND_RE.fullmatch(kind) is not None


_is_run_id = functools.lru_cache(maxsize=256)(is_safe_name)


def is_record_kind(kind: object) -> bool:
    """Whether ``kind`` may be a record's kind: a non-empty str of A-Z a-z 0-9 _ . -"""
    return type(kind) is str and _is_kind(kind)


def _check_kind(kind: object) -> str:
    if type(kind) is str and _is_kind(kind):
        return kind
    raise RecordError(
        f"kind must be a non-empty str of A-Z a-z 0-9 _ . - (no '/', it prefixes "
        f"flat metric keys), got {kind!r}; e.g. 'train' or 'rollout'"
    )


def _check_nonneg_int(name: str, value: object) -> int:
    if type(value) is not int and not (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ):
        raise RecordError(f"{name} must be an int >= 0, got {value!r}")
    ivalue = int(value)
    if ivalue < 0 or ivalue > _INT_MAX:
        raise RecordError(f"{name} must be an int >= 0, got {value!r}")
    return ivalue


def _check_seq(seq: object) -> int | None:
    if seq is None:
        return None
    try:
        return _check_nonneg_int("seq", seq)
    except RecordError:
        raise RecordError(
            f"seq must be None (not stamped yet; the reporter stamps it) or an int >= 0, "
            f"got {seq!r}"
        ) from None


# -- values and attrs: the reference path ------------------------------------------------


def _number(key: str, value: object) -> int | float:
    """Validate one ``values`` entry; non-finite floats come back as they are."""
    if type(value) is float:
        return value
    if type(value) is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise RecordError(
            f"values[{key!r}] = {value!r} does not fit a 64-bit JSON integer; "
            "pass it as a float or in smaller units"
        )
    if isinstance(value, bool):
        raise RecordError(
            f"values[{key!r}] = {value!r} is a bool; metric values are numbers: "
            "pass int(flag) or put the flag in attrs"
        )
    if isinstance(value, numbers.Integral):  # e.g. numpy.int64
        return _number(key, int(value))
    if isinstance(value, numbers.Real):  # e.g. numpy.float32, fractions.Fraction
        return float(value)
    plain = plain_number(value)  # a 0-d tensor or array
    if plain is not value:
        return _number(key, plain)
    if isinstance(value, str):
        raise RecordError(
            f"values[{key!r}] = {value!r} is a str; values hold numbers only: "
            "convert it (float(...)) or put the text in attrs"
        )
    if isinstance(value, Mapping | list | tuple):
        raise RecordError(
            f"values[{key!r}] is a nested {type(value).__name__}; values are flat: "
            f"use keys such as '{key}/<name>' or put structured data in attrs"
        )
    raise RecordError(
        f"values[{key!r}] = {value!r} ({type(value).__qualname__}) is not a number; "
        "pass an int or float (a numpy scalar or a 0-d tensor is one)"
    )


def _check_key(where: str, key: object) -> str:
    if type(key) is str and key and key.isascii():
        return key
    if type(key) is not str:
        raise RecordError(
            f"{where} key {key!r} is a {type(key).__qualname__}; keys must be str: use str({key!r})"
        )
    if not key:
        raise RecordError(f"{where} has an empty key; give every entry a name")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError(f"{where} key {key!r} is not valid UTF-8 (lone surrogate)") from None
    return key


def _where(parent: str, key: object) -> str:
    return parent if key is None else f"{parent}[{key!r}]"


def _freeze_json(value: object, parent: str, key: object = None, depth: int = 0) -> Any:
    """Deep-copy a JSON value into read-only containers, rejecting what strict JSON lacks.

    ``parent``/``key`` name the value in error messages (formatted only on error).
    """
    if type(value) is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                where = _where(parent, key)
                raise RecordError(f"{where} is not valid UTF-8 (lone surrogate)") from None
        return value
    if value is None or type(value) is bool:
        return value
    if type(value) is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise RecordError(f"{_where(parent, key)} = {value!r} does not fit a 64-bit JSON integer")
    if type(value) is float:
        if math.isfinite(value):
            return value
        raise RecordError(
            f"{_where(parent, key)} = {value!r} is not finite and strict JSON has no such "
            "number: put numbers in values (non-finite values are named there) or use a str"
        )
    where = _where(parent, key)
    if depth >= _MAX_DEPTH:
        raise RecordError(f"{where} is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        return _FrozenDict(
            {_check_key(where, k): _freeze_json(v, where, k, depth + 1) for k, v in value.items()}
        )
    if isinstance(value, list | tuple):
        return tuple(_freeze_json(v, where, i, depth + 1) for i, v in enumerate(value))
    if isinstance(value, str):  # a subclass, e.g. StrEnum
        return _freeze_json(str.__str__(value), parent, key, depth)
    if isinstance(value, numbers.Integral):
        return _freeze_json(int(value), parent, key, depth)
    if isinstance(value, numbers.Real):
        return _freeze_json(float(value), parent, key, depth)
    raise RecordError(
        f"{where} = {value!r} ({type(value).__qualname__}) is not a JSON value; "
        "convert it to str, a number, a list or a str-keyed dict"
    )


def _checked(values: object, attrs: object) -> tuple[_FrozenDict, _FrozenDict]:
    """``values`` and ``attrs`` checked entry by entry (the reference; raises the errors)."""
    if type(values) is not dict and not isinstance(values, Mapping):
        raise RecordError(
            f"values must be a mapping of str to number, got {type(values).__qualname__}"
        )
    if attrs is None:
        attrs = _EMPTY
    if type(attrs) is not dict and not isinstance(attrs, Mapping):
        raise RecordError(f"attrs must be a str-keyed mapping, got {type(attrs).__qualname__}")
    claimed = attrs.get(NONFINITE_ATTR)
    named: set[str] = set()
    if claimed is not None:
        if not isinstance(claimed, list | tuple) or not all(type(k) is str for k in claimed):
            raise RecordError(
                f"attrs[{NONFINITE_ATTR!r}] = {claimed!r} must be a list of values keys; "
                "it is filled in by the record itself, leave it out"
            )
        named = set(claimed)
    out: dict[str, int | float | None] = {}
    nonfinite: list[str] = []
    for key, value in values.items():
        _check_key("values", key)
        if value is None:
            if key not in named:
                raise RecordError(
                    f"values[{key!r}] is None; values hold numbers only: pass "
                    "float('nan') for an undefined value (it is written as null and "
                    f"named in attrs[{NONFINITE_ATTR!r}])"
                )
            out[key] = None
            nonfinite.append(key)
            continue
        number = _number(key, value)
        if type(number) is float and not math.isfinite(number):
            out[key] = None
            nonfinite.append(key)
        else:
            if key in named:
                raise RecordError(
                    f"attrs[{NONFINITE_ATTR!r}] names {key!r} but values[{key!r}] = "
                    f"{number!r} is finite; leave attrs[{NONFINITE_ATTR!r}] out"
                )
            out[key] = number
    stray = named.difference(out)
    if stray:
        raise RecordError(
            f"attrs[{NONFINITE_ATTR!r}] names {sorted(stray)!r}, which are not in values; "
            f"leave attrs[{NONFINITE_ATTR!r}] out, the record fills it in"
        )
    frozen_attrs = _freeze_json({k: v for k, v in attrs.items() if k != NONFINITE_ATTR}, "attrs")
    return _FrozenDict(out), _with_nonfinite(frozen_attrs, nonfinite)


def _with_nonfinite(attrs: _FrozenDict, nonfinite: list[str]) -> _FrozenDict:
    if not nonfinite:
        return attrs
    merged = _FrozenDict(attrs)
    _fill_item(merged, NONFINITE_ATTR, tuple(sorted(nonfinite)))
    return merged


# -- values and attrs: the common case in a few C-level passes ------------------------------


def _plain_attrs(attrs: dict[str, Any]) -> _FrozenDict | None:
    """A frozen copy of flat attrs (scalars only, ASCII keys and text), or None to take
    the reference path (nested values, other text, large ints, the ``nonfinite`` key).
    One loop: attrs are a few entries, where a loop beats several C-level passes."""
    if NONFINITE_ATTR in attrs:
        return None
    for key, value in attrs.items():
        if type(key) is not str or not key or not key.isascii():
            return None
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return None
        elif kind is float:
            if not _isfinite(value):
                return None
        elif kind is int:
            if not _INT_MIN <= value <= _INT_MAX:
                return None
        elif value is not None and kind is not bool:
            return None
    return _FrozenDict(attrs)


def _plain_nonfinite(out: _FrozenDict) -> list[str] | None:
    """Set the non-finite values of ``out`` (plain numbers) to None and return their keys;
    None when that is not the whole story (a large value the reference path checks)."""
    try:
        nonfinite = [k for k, v in out.items() if not _isfinite(v)]
        if not nonfinite:
            return None
        for key in nonfinite:
            _fill_item(out, key, 0.0)
        norm = _hypot(*out.values())
    except OverflowError:  # an int too large for a float
        return None
    for key in nonfinite:
        _fill_item(out, key, None)
    return nonfinite if norm <= _PLAIN_NORM else None


def _normalise(values: object, attrs: object) -> tuple[_FrozenDict, _FrozenDict]:
    """Frozen ``values`` (non-finite ones None) and ``attrs`` (naming them).

    The common case (a plain ``dict`` of ``float``/``int`` under ASCII ``str`` keys, flat
    scalar attrs) is decided by a few C-level passes; anything else, or any doubt, goes to
    :func:`_checked`, the reference, which normalises numeric subtypes and raises.
    """
    if type(values) is dict and (attrs is None or type(attrs) is dict):
        out = _FrozenDict(values)
        numbers_ = out.values()
        if (
            _NUMBER_TYPES.issuperset(map(type, numbers_))
            and _STR_TYPES.issuperset(map(type, out))
            and "".join(out).isascii()
            and "" not in out
        ):
            frozen_attrs = _plain_attrs(attrs) if attrs else _EMPTY
            if frozen_attrs is not None:
                try:
                    # One C call proves every value finite and every int within int64
                    # (a NaN makes it NaN, which compares False).
                    if _hypot(*numbers_) <= _PLAIN_NORM:
                        return out, frozen_attrs
                except OverflowError:  # an int too large for a float
                    pass
                nonfinite = _plain_nonfinite(out)
                if nonfinite is not None:
                    return out, _with_nonfinite(frozen_attrs, nonfinite)
    return _checked(values, attrs)


# -- the record ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """One metric record: the unit written to ``metrics_raw.jsonl``.

    Construction validates and normalises every field (see the module docstring);
    invalid input raises :class:`~twinkle.errors.RecordError` naming the field or key.
    ``seq`` is None until :class:`MetricsReporter` stamps it.
    """

    kind: str  # "train", "rollout", "run", ...
    scope: str  # "iteration" | "window" | "run"
    run_id: str
    seq: int | None  # strictly increasing per run; stamped by the reporter
    step: int  # optimizer steps so far
    iteration: int
    wall_ns: int  # unix ns, from the caller (reporting reads no clock)
    monotonic_ns: int
    values: Mapping[str, int | float | None]
    attrs: Mapping[str, Any]

    def __post_init__(self) -> None:
        _fill(
            self,
            self.kind,
            self.scope,
            self.run_id,
            self.seq,
            self.step,
            self.iteration,
            self.wall_ns,
            self.monotonic_ns,
            self.values,
            self.attrs,
        )


_new = object.__new__
(
    _set_kind,
    _set_scope,
    _set_run_id,
    _set_seq,
    _set_step,
    _set_iteration,
    _set_wall_ns,
    _set_monotonic_ns,
    _set_values,
    _set_attrs,
) = (MetricRecord.__dict__[name].__set__ for name in _FIELDS)


# Positional on purpose: it runs for every record built, and a call by keyword costs more.
def _fill(  # noqa: PLR0917
    record: MetricRecord,
    kind: object,
    scope: object,
    run_id: object,
    seq: object,
    step: object,
    iteration: object,
    wall_ns: object,
    monotonic_ns: object,
    values: object,
    attrs: object,
) -> None:
    """Validate every field and set the normalised values on ``record``: the one check of
    a record, run by the constructor and by :func:`make_record`. The slots are set through
    their member descriptors (the frozen ``__setattr__`` is bypassed)."""
    _set_kind(record, _check_kind(kind))
    if scope not in SCOPES:
        raise RecordError(f"scope must be one of {SCOPES!r}, got {scope!r}")
    _set_scope(record, scope)
    _set_run_id(
        record,
        run_id
        if type(run_id) is str and _is_run_id(run_id)
        else check_run_id(run_id, error=RecordError),
    )
    _set_seq(
        record,
        seq if seq is None or (type(seq) is int and 0 <= seq <= _INT_MAX) else _check_seq(seq),
    )
    _set_step(
        record,
        step if type(step) is int and 0 <= step <= _INT_MAX else _check_nonneg_int("step", step),
    )
    _set_iteration(
        record,
        iteration
        if type(iteration) is int and 0 <= iteration <= _INT_MAX
        else _check_nonneg_int("iteration", iteration),
    )
    _set_wall_ns(
        record,
        wall_ns
        if type(wall_ns) is int and 0 <= wall_ns <= _INT_MAX
        else _check_nonneg_int("wall_ns", wall_ns),
    )
    _set_monotonic_ns(
        record,
        monotonic_ns
        if type(monotonic_ns) is int and 0 <= monotonic_ns <= _INT_MAX
        else _check_nonneg_int("monotonic_ns", monotonic_ns),
    )
    frozen_values, frozen_attrs = _normalise(values, attrs)
    _set_values(record, frozen_values)
    _set_attrs(record, frozen_attrs)


def make_record(
    *,
    kind: str,
    scope: str,
    run_id: str,
    step: int,
    iteration: int,
    wall_ns: int,
    monotonic_ns: int,
    values: Mapping[str, int | float | None],
    attrs: Mapping[str, Any] | None = None,
    seq: int | None = None,
) -> MetricRecord:
    """Build a validated :class:`MetricRecord` (keyword-only; ``seq`` left to the reporter).

    Non-finite floats in ``values`` become ``None`` and are named in
    ``attrs["nonfinite"]``. Raises :class:`~twinkle.errors.RecordError` naming the bad
    field or key and how to fix it.
    """
    record = _new(MetricRecord)
    _fill(record, kind, scope, run_id, seq, step, iteration, wall_ns, monotonic_ns, values, attrs)
    return record


def with_seq(record: MetricRecord, seq: int) -> MetricRecord:
    """A copy of ``record`` stamped with ``seq`` (an int >= 0).

    Only ``seq`` is checked: the rest of the record was checked when it was built, so the
    copy shares its read-only ``values`` and ``attrs``.
    """
    if type(seq) is not int or not 0 <= seq <= _INT_MAX:
        raise RecordError(f"seq must be an int >= 0 to stamp a record, got {seq!r}")
    new = _new(MetricRecord)
    _set_kind(new, record.kind)
    _set_scope(new, record.scope)
    _set_run_id(new, record.run_id)
    _set_seq(new, seq)
    _set_step(new, record.step)
    _set_iteration(new, record.iteration)
    _set_wall_ns(new, record.wall_ns)
    _set_monotonic_ns(new, record.monotonic_ns)
    _set_values(new, record.values)
    _set_attrs(new, record.attrs)
    return new


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def flat_key(record: MetricRecord, key: str) -> str:
    """One name for value ``key`` of ``record`` among every record's values (for a flat
    sink: a dashboard's tags): ``<kind>/<key>`` for an iteration's record, as in
    ``metrics.jsonl``, and ``<scope>/<kind>/<key>`` for a window's or the run's."""
    if record.scope == "iteration":
        return f"{record.kind}/{key}"
    return f"{record.scope}/{record.kind}/{key}"


def record_to_dict(record: MetricRecord) -> dict[str, Any]:
    """The record as plain JSON types (fresh ``dict``/``list`` objects), in field order."""
    return {**record_fields(record), "values": dict(record.values), "attrs": _thaw(record.attrs)}


def record_fields(record: MetricRecord) -> dict[str, Any]:
    """The record's fields in order, its read-only containers shared, not copied: what a
    serialiser writes (orjson writes them as JSON objects and arrays). Do not mutate."""
    return {
        "kind": record.kind,
        "scope": record.scope,
        "run_id": record.run_id,
        "seq": record.seq,
        "step": record.step,
        "iteration": record.iteration,
        "wall_ns": record.wall_ns,
        "monotonic_ns": record.monotonic_ns,
        "values": record.values,
        "attrs": record.attrs,
    }


def record_from_dict(data: Mapping[str, Any]) -> MetricRecord:
    """Rebuild a record from :func:`record_to_dict` output or one parsed JSONL line.

    Every field must be present and no other key may be; the record is validated as if
    it were built by :func:`make_record`.
    """
    if not isinstance(data, Mapping):
        raise RecordError(f"a record must be a JSON object, got {type(data).__qualname__}")
    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise RecordError(f"record dict lacks {missing!r} (keys present: {sorted(data)!r})")
    unknown = sorted(set(data).difference(_FIELDS))
    if unknown:
        raise RecordError(
            f"record dict has unknown keys {unknown!r}; a MetricRecord has exactly {_FIELDS!r}"
        )
    return MetricRecord(**{f: data[f] for f in _FIELDS})
