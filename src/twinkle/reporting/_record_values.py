"""The ``values`` and ``attrs`` of a :class:`~twinkle.reporting.MetricRecord`, checked
and frozen: the one place that decides what a record may hold.

* ``values`` holds numbers only (``int``/``float``; ``bool`` is rejected because it is
  almost always a mistake for a metric). A non-finite float (NaN, ±inf) is stored as
  ``None`` and its key is named in ``attrs["nonfinite"]`` (:data:`NONFINITE_ATTR`, a
  sorted tuple), so it is never dropped and never written as a ``NaN`` token; a ``None``
  is accepted only where ``attrs["nonfinite"]`` names it (a record read back).
* ``attrs`` holds JSON values (None, bool, int, finite float, str, lists, str-keyed
  mappings; a non-finite float is refused). It is deep-copied into read-only containers
  (mappings become :class:`~twinkle.reporting._frozen.FrozenDict`, lists tuples).

:func:`normalise` takes the common case (a plain ``dict`` of ``float``/``int`` values
under ASCII ``str`` keys, flat attrs of scalars and lists of text) in a few C-level
passes over the values; anything else takes the entry-by-entry path (:func:`_checked`),
which is the reference: it normalises numeric subtypes and raises the errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from twinkle.checks import plain_number
from twinkle.errors import RecordError
from twinkle.reporting._frozen import EMPTY, FrozenDict

__all__ = ["JSON_INT_MAX", "JSON_INT_MIN", "NONFINITE_ATTR", "normalise"]

NONFINITE_ATTR = "nonfinite"
"""The ``attrs`` key naming the ``values`` keys whose number was not finite (now None)."""

#: JSON integers that orjson (and most readers) accept: signed 64-bit up to unsigned max.
JSON_INT_MIN = -(2**63)
JSON_INT_MAX = 2**64 - 1
# hypot(values) at most this: every value is finite and an int among them fits int64
# (with room for the rounding of a large int to float).
_PLAIN_NORM = float(2**62)
_MAX_DEPTH = 64
_NUMBER_TYPES = frozenset((int, float))
_STR_TYPES = frozenset((str,))
_isfinite = math.isfinite
_hypot = math.hypot
# Fills a FrozenDict while it is being built (nothing else holds it yet).
_fill_item = dict.__setitem__


# -- values and attrs: the reference path ------------------------------------------------


def _number(key: str, value: object) -> int | float:
    """Validate one ``values`` entry; non-finite floats come back as they are."""
    if type(value) is float:
        return value
    if type(value) is int:
        if JSON_INT_MIN <= value <= JSON_INT_MAX:
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
        if JSON_INT_MIN <= value <= JSON_INT_MAX:
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
        return FrozenDict(
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


def _checked(values: object, attrs: object) -> tuple[FrozenDict, FrozenDict]:
    """``values`` and ``attrs`` checked entry by entry (the reference; raises the errors)."""
    if type(values) is not dict and not isinstance(values, Mapping):
        raise RecordError(
            f"values must be a mapping of str to number, got {type(values).__qualname__}"
        )
    if attrs is None:
        attrs = EMPTY
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
    return FrozenDict(out), _with_nonfinite(frozen_attrs, nonfinite)


def _with_nonfinite(attrs: FrozenDict, nonfinite: list[str]) -> FrozenDict:
    if not nonfinite:
        return attrs
    merged = FrozenDict(attrs)
    _fill_item(merged, NONFINITE_ATTR, tuple(sorted(nonfinite)))
    return merged


# -- values and attrs: the common case in a few C-level passes ------------------------------


def _plain_attrs(attrs: dict[str, Any]) -> FrozenDict | None:
    """A frozen copy of flat attrs (scalars and lists of text, ASCII keys and text), or
    None to take the reference path (nested values, other text, large ints, the
    ``nonfinite`` key). One loop: attrs are a few entries, where a loop beats several
    C-level passes. A list of text (an observer's ``window_flags``) becomes a tuple."""
    if NONFINITE_ATTR in attrs:
        return None
    texts: list[str] = []
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
            if not JSON_INT_MIN <= value <= JSON_INT_MAX:
                return None
        elif kind is list or kind is tuple:
            if not (_STR_TYPES.issuperset(map(type, value)) and "".join(value).isascii()):
                return None
            texts.append(key)
        elif value is not None and kind is not bool:
            return None
    frozen = FrozenDict(attrs)
    for key in texts:
        _fill_item(frozen, key, tuple(attrs[key]))
    return frozen


def _plain_nonfinite(out: FrozenDict) -> list[str] | None:
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


def normalise(values: object, attrs: object) -> tuple[FrozenDict, FrozenDict]:
    """Frozen ``values`` (non-finite ones None) and ``attrs`` (naming them).

    The common case (a plain ``dict`` of ``float``/``int`` under ASCII ``str`` keys, flat
    attrs of scalars and lists of text) is decided by a few C-level passes; anything
    else, or any doubt, goes to :func:`_checked`, the reference, which normalises numeric
    subtypes and raises.
    """
    if type(values) is dict and (attrs is None or type(attrs) is dict):
        out = FrozenDict(values)
        numbers_ = out.values()
        if (
            _NUMBER_TYPES.issuperset(map(type, numbers_))
            and _STR_TYPES.issuperset(map(type, out))
            and "".join(out).isascii()
            and "" not in out
        ):
            frozen_attrs = _plain_attrs(attrs) if attrs else EMPTY
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
