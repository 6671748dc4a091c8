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
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from twinkle.errors import InvalidArgumentError, RecordError

__all__ = [
    "SCOPES",
    "UNASSIGNED_SEQ",
    "MetricRecord",
    "make_record",
    "record_from_dict",
    "record_to_dict",
]

SCOPES: tuple[str, ...] = ("iteration", "window", "run")
"""The scopes a record may have: one iteration, a window of iterations, the whole run."""

UNASSIGNED_SEQ = -1
"""``seq`` of a record the reporter has not stamped yet."""

NONFINITE_ATTR = "nonfinite"

# JSON integers that orjson (and most readers) accept: signed 64-bit up to unsigned max.
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_MAX_DEPTH = 64
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@-]{0,199}")
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


def _check_run_id(run_id: object, *, error: type[InvalidArgumentError] = RecordError) -> str:
    if not isinstance(run_id, str) or not run_id:
        raise error(f"run_id must be a non-empty str, got {run_id!r}")
    if ".." in run_id or _RUN_ID_RE.fullmatch(run_id) is None:
        raise error(
            f"run_id {run_id!r} is not usable as a directory name: use 1-200 characters "
            "from A-Z a-z 0-9 . _ - + = @, starting with a letter or digit, "
            "without '/', '\\' or '..' (e.g. 'grpo-2024-05-01_1200')"
        )
    return run_id


def _check_nonneg_int(name: str, value: object, *, minimum: int = 0) -> int:
    if type(value) is not int and not (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ):
        raise RecordError(f"{name} must be an int >= {minimum}, got {value!r}")
    ivalue = int(value)
    if ivalue < minimum or ivalue > _INT_MAX:
        raise RecordError(f"{name} must be an int >= {minimum}, got {value!r}")
    return ivalue


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
        "pass an int or float (e.g. tensor.item())"
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


def _normalise(values: object, attrs: object) -> tuple[_FrozenDict, _FrozenDict]:
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
    if nonfinite:
        merged = dict(frozen_attrs)
        merged[NONFINITE_ATTR] = tuple(sorted(nonfinite))
        frozen_attrs = _FrozenDict(merged)
    return _FrozenDict(out), frozen_attrs


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """One metric record: the unit written to ``metrics_raw.jsonl``.

    Construction validates and normalises every field (see the module docstring);
    invalid input raises :class:`~twinkle.errors.RecordError` naming the field or key.
    ``seq`` is ``UNASSIGNED_SEQ`` (-1) until :class:`MetricsReporter` stamps it.
    """

    kind: str  # "train", "rollout", "run", ...
    scope: str  # "iteration" | "window" | "run"
    run_id: str
    seq: int  # strictly increasing per run; assigned by the reporter
    step: int  # optimizer steps so far
    iteration: int
    wall_ns: int  # unix ns, from the caller (reporting reads no clock)
    monotonic_ns: int
    values: Mapping[str, int | float | None]
    attrs: Mapping[str, Any]

    def __post_init__(self) -> None:
        kind = self.kind
        if not isinstance(kind, str) or _KIND_RE.fullmatch(kind) is None:
            raise RecordError(
                f"kind must be a non-empty str of A-Z a-z 0-9 _ . - (no '/', it prefixes "
                f"flat metric keys), got {kind!r}; e.g. 'train' or 'rollout'"
            )
        if self.scope not in SCOPES:
            raise RecordError(f"scope must be one of {SCOPES!r}, got {self.scope!r}")
        _check_run_id(self.run_id)
        set_ = object.__setattr__
        set_(self, "seq", _check_nonneg_int("seq", self.seq, minimum=UNASSIGNED_SEQ))
        for name in ("step", "iteration", "wall_ns", "monotonic_ns"):
            set_(self, name, _check_nonneg_int(name, getattr(self, name)))
        values, attrs = _normalise(self.values, self.attrs)
        set_(self, "values", values)
        set_(self, "attrs", attrs)


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
    seq: int = UNASSIGNED_SEQ,
) -> MetricRecord:
    """Build a validated :class:`MetricRecord` (keyword-only; ``seq`` left to the reporter).

    Non-finite floats in ``values`` become ``None`` and are named in
    ``attrs["nonfinite"]``. Raises :class:`~twinkle.errors.RecordError` naming the bad
    field or key and how to fix it.
    """
    return MetricRecord(
        kind=kind,
        scope=scope,
        run_id=run_id,
        seq=seq,
        step=step,
        iteration=iteration,
        wall_ns=wall_ns,
        monotonic_ns=monotonic_ns,
        values=values,
        attrs=attrs if attrs is not None else _EMPTY,
    )


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def record_to_dict(record: MetricRecord) -> dict[str, Any]:
    """The record as plain JSON types (fresh ``dict``/``list`` objects), in field order."""
    return {
        "kind": record.kind,
        "scope": record.scope,
        "run_id": record.run_id,
        "seq": record.seq,
        "step": record.step,
        "iteration": record.iteration,
        "wall_ns": record.wall_ns,
        "monotonic_ns": record.monotonic_ns,
        "values": dict(record.values),
        "attrs": _thaw(record.attrs),
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


def _json_fields(r: MetricRecord) -> dict[str, Any]:
    """The record as a dict for orjson (read-only containers kept; hot path)."""
    return {
        "kind": r.kind,
        "scope": r.scope,
        "run_id": r.run_id,
        "seq": r.seq,
        "step": r.step,
        "iteration": r.iteration,
        "wall_ns": r.wall_ns,
        "monotonic_ns": r.monotonic_ns,
        "values": r.values,
        "attrs": r.attrs,
    }


def _with_seq(record: MetricRecord, seq: int) -> MetricRecord:
    """A copy of a validated record with ``seq`` set, without re-validating (hot path).

    Sets the slots through their member descriptors: the frozen ``__setattr__`` is
    bypassed and ``__post_init__`` (validation) is not re-run for a record that passed.
    """
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
