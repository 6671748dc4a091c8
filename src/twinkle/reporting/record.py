"""``MetricRecord``: one validated, immutable, strict-JSON metric record.

A record is checked when it is built (``make_record``, the constructor,
``msgspec.structs.replace``, unpickling and ``record_from_dict`` all run the same checks),
so a record that exists is a record that serialises to strict JSON and reads back equal:

* ``values`` holds numbers only (``int``/``float``; ``bool`` is rejected because it is
  almost always a mistake for a metric). A non-finite float (NaN, ±inf) is stored as
  ``None`` and its key is named in ``attrs["nonfinite"]`` (a sorted list), so it is never
  dropped and never written as a ``NaN`` token.
* ``attrs`` holds JSON values (None, bool, int, finite float, str, lists, str-keyed
  mappings). It is deep-copied into read-only containers (mappings become read-only
  dicts, lists become tuples), so a record cannot change after it was reported.
  (Both are checked and frozen by :mod:`twinkle.reporting._record_values`.)
* ``seq`` is ``None`` until :class:`~twinkle.reporting.MetricsReporter` stamps it
  (:func:`with_seq`); a stamped record, and so every line of a file, has an int ``seq``.

Building a record is on the training thread's path, so the common case (a plain
``dict`` of ``float``/``int`` values under ASCII ``str`` keys, flat scalar attrs) is
checked with a few C-level passes over the values; anything else takes the entry-by-entry
path, which is the reference: it normalises numeric subtypes and raises the errors.

The record is a frozen :class:`msgspec.Struct`, as the events are, for what a struct
costs less than a slotted dataclass: building one (the fields set in C), stamping a copy
(``__copy__`` and one field set, where the dataclass set ten slots in Python) and
holding many (``gc=False``: a record holds only scalars and read-only JSON containers,
so it can be in no reference cycle, and the collector need not walk the reporter's
queue). Its checks stay in Python, not in ``Annotated`` field types: records are never
decoded by msgspec (they are read with orjson), msgspec's ``convert`` measured slower
than :func:`~twinkle.reporting._record_values.normalise` on a 30-value record and
accepts what a record refuses (``str`` subclass keys, ints past 64 bits unless bounded,
lone surrogates), and the errors must name the value and the fix.
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from twinkle.checks import is_safe_name
from twinkle.checks import run_id as check_run_id
from twinkle.errors import RecordError
from twinkle.reporting._record_values import JSON_INT_MAX, normalise

__all__ = [
    "SCOPES",
    "MetricRecord",
    "check_record_line",
    "cut_short",
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

_KIND_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


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
    if ivalue < 0 or ivalue > JSON_INT_MAX:
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


# -- the record ---------------------------------------------------------------------------

# Sets a field of a frozen struct (the record's own check, and a stamp on a fresh copy).
_setattr = msgspec.structs.force_setattr


class MetricRecord(msgspec.Struct, frozen=True, gc=False):
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
        """Validate every field and set the normalised values: the one check of a record,
        run by the constructor (so by :func:`make_record`, ``msgspec.structs.replace``,
        unpickling). A field already normal is left as it is."""
        kind = self.kind
        if type(kind) is not str or not _is_kind(kind):
            _check_kind(kind)
        scope = self.scope
        if scope not in SCOPES:
            raise RecordError(f"scope must be one of {SCOPES!r}, got {scope!r}")
        run_id = self.run_id
        if type(run_id) is not str or not _is_run_id(run_id):
            _setattr(self, "run_id", check_run_id(run_id, error=RecordError))
        seq = self.seq
        if not (seq is None or (type(seq) is int and 0 <= seq <= JSON_INT_MAX)):
            _setattr(self, "seq", _check_seq(seq))
        step = self.step
        if not (type(step) is int and 0 <= step <= JSON_INT_MAX):
            _setattr(self, "step", _check_nonneg_int("step", step))
        iteration = self.iteration
        if not (type(iteration) is int and 0 <= iteration <= JSON_INT_MAX):
            _setattr(self, "iteration", _check_nonneg_int("iteration", iteration))
        wall_ns = self.wall_ns
        if not (type(wall_ns) is int and 0 <= wall_ns <= JSON_INT_MAX):
            _setattr(self, "wall_ns", _check_nonneg_int("wall_ns", wall_ns))
        monotonic_ns = self.monotonic_ns
        if not (type(monotonic_ns) is int and 0 <= monotonic_ns <= JSON_INT_MAX):
            _setattr(self, "monotonic_ns", _check_nonneg_int("monotonic_ns", monotonic_ns))
        frozen_values, frozen_attrs = normalise(self.values, self.attrs)
        _setattr(self, "values", frozen_values)
        _setattr(self, "attrs", frozen_attrs)


_FIELDS: tuple[str, ...] = MetricRecord.__struct_fields__
# A struct's own shallow copy, in C, without ``__post_init__`` (msgspec's stubs omit it).
_copy: Callable[[MetricRecord], MetricRecord] = MetricRecord.__copy__  # type: ignore[attr-defined]


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
    return MetricRecord(
        kind,
        scope,
        run_id,
        seq,
        step,
        iteration,
        wall_ns,
        monotonic_ns,
        values,
        attrs,  # type: ignore[arg-type]  # None: checked (and made {}) by the record
    )


def with_seq(record: MetricRecord, seq: int) -> MetricRecord:
    """A copy of ``record`` stamped with ``seq`` (an int >= 0).

    Only ``seq`` is checked: the rest of the record was checked when it was built, so the
    copy shares its read-only ``values`` and ``attrs``.
    """
    if type(seq) is not int or not 0 <= seq <= JSON_INT_MAX:
        raise RecordError(f"seq must be an int >= 0 to stamp a record, got {seq!r}")
    new = _copy(record)  # (no __post_init__: the copy is of a checked record)
    _setattr(new, "seq", seq)
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


def cut_short(record: MetricRecord) -> bool:
    """Whether ``record`` holds figures of an iteration cut short before its optimizer
    step: its window flagged ``partial`` (``attrs.window_flags``: the last of a segment
    that did not finish ``ok``) and no step of its own (``attrs.iteration_steps`` 0).
    Its figures cover part of an iteration at the step of the one before it: a chart
    whose x axis is the step would draw them as a false drop, a second point at that
    step. A dashboard leaves it out; it stays in ``metrics_raw.jsonl`` and the report.
    An iteration that took its step before the run stopped has a point of its own, and
    is shown. A record of the caller's own values (a ``scalars`` record) or of memory
    readings is never cut short: what it holds was measured whole."""
    if record.scope != "iteration":
        return False
    flags = record.attrs.get("window_flags")
    return flags is not None and "partial" in flags and not record.attrs.get("iteration_steps")


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


class _RecordLine(msgspec.Struct):
    """What a reader of a record file relies on in each line (a record in full is
    :func:`record_from_dict`'s to check, at several times the cost)."""

    kind: str
    scope: str
    iteration: int | None
    values: dict[str, Any]
    attrs: dict[str, Any]


def check_record_line(data: object) -> None:
    """Raise :class:`RecordError` unless ``data`` (a record file's line, parsed) has a
    record's shape: an object whose ``kind`` and ``scope`` are strings, ``iteration``
    an int or null, ``values`` and ``attrs`` objects."""
    try:
        msgspec.convert(data, _RecordLine)
    except msgspec.ValidationError as exc:
        raise RecordError(f"not a record ({exc})") from None


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
