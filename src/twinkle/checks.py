"""The checks every layer shares: names that become paths, and the value types of the
event log (one definition each, so the bus never accepts what a replay refuses).

The ``Annotated`` types carry their constraints as :class:`msgspec.Meta`: events and the
perf values declare their fields with them, and :mod:`msgspec` checks them in C when an
event is validated or decoded. :func:`safe_name` is the Python-side check of the same
rule as :data:`SafeName` for arguments (run ids, output names).
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeGuard, TypeVar, overload

import msgspec
from msgspec import Meta

from twinkle.errors import InvalidArgumentError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TOKENS",
    "NAME_RULE",
    "OWN_SOURCE_PREFIX",
    "Count",
    "Int64",
    "NonEmpty",
    "SafeName",
    "Tokens",
    "as_int",
    "caller_source",
    "check_seconds",
    "is_integer",
    "convert_checked",
    "run_id",
    "explain",
    "is_safe_name",
    "is_text",
    "key_problem",
    "plain_number",
    "plain_numbers",
    "printable",
    "safe_name",
    "short_repr",
    "value_key",
]

_T = TypeVar("_T")

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: Largest token count of one sample (what a float sum keeps exactly).
MAX_TOKENS: Final = 2**53 - 1

#: A safe single path component: run ids and output names become directory and file
#: names, so no separators, no ``..`` and no leading dot.
NAME_RULE: Final = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z"
_NAME = re.compile(NAME_RULE)

Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
"""An integer JSON readers everywhere keep exactly (a clock reading, a shift)."""
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
"""A non-negative 64-bit integer (a count, an index, bytes, a pid)."""
Tokens = Annotated[int, Meta(ge=0, le=MAX_TOKENS)]
"""One sample's token count."""
NonEmpty = Annotated[str, Meta(min_length=1)]
"""A non-empty string (a span, phase or engine name)."""
SafeName = Annotated[str, Meta(pattern=NAME_RULE)]
"""A run id: see :data:`NAME_RULE`."""


_PLAIN: Final = (int, float, bool)
_NOT_ARRAY: Final = object()


def _tolist(value: object, ndim: int) -> object:
    """``value.tolist()`` when ``value`` looks like an ``ndim``-dimensional numpy array or
    torch tensor (a ``shape`` tuple of that length and a ``tolist`` method), else
    :data:`_NOT_ARRAY`. Neither library is imported."""
    shape = getattr(value, "shape", None)
    tolist = getattr(value, "tolist", None)
    if not (isinstance(shape, tuple) and len(shape) == ndim and callable(tolist)):
        return _NOT_ARRAY
    try:
        return tolist()
    except Exception:  # not what it looked like: the caller's check names it
        return _NOT_ARRAY


def plain_number(value: object) -> object:
    """A number from numpy or torch as the Python ``int``/``float``/``bool`` it holds: a
    numpy scalar (``np.int64(3)``), a 0-d array or a 0-d tensor (``torch.tensor(0.5)``,
    on any device). Anything else comes back unchanged, for the caller's own check to
    name. Neither library is imported: a value qualifies by an empty ``shape`` and a
    ``tolist()`` that gives a plain number.
    """
    if type(value) in _PLAIN:
        return value
    out = _tolist(value, 0)
    return out if type(out) in _PLAIN else value


def plain_numbers(values: object) -> object:
    """A sequence of numbers from numpy or torch as a list of plain ones: a 1-d array or
    tensor (``tolist()``), or a list or tuple holding numpy scalars or 0-d tensors (each
    through :func:`plain_number`). Anything else comes back unchanged."""
    out = _tolist(values, 1)
    if isinstance(out, list):
        return out
    if isinstance(values, list | tuple) and not all(type(v) in _PLAIN for v in values):
        return [plain_number(v) for v in values]
    return values


def short_repr(value: object) -> str:
    """``repr`` shortened for error messages (long sequences, big objects)."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = 8
    r.maxstring = r.maxother = 60
    return r.repr(value)


@overload
def check_seconds(
    name: str,
    value: object,
    *,
    none_ok: Literal[False] = False,
    zero_ok: bool = True,
    means: str = "",
    none_means: str = "for no limit",
    what: str = "a finite number of seconds",
) -> float: ...
@overload
def check_seconds(
    name: str,
    value: object,
    *,
    none_ok: bool,
    zero_ok: bool = True,
    means: str = "",
    none_means: str = "for no limit",
    what: str = "a finite number of seconds",
) -> float | None: ...
def check_seconds(
    name: str,
    value: object,
    *,
    none_ok: bool = False,
    zero_ok: bool = True,
    means: str = "",
    none_means: str = "for no limit",
    what: str = "a finite number of seconds",
) -> float | None:
    """``value`` as a plain ``float`` of seconds (``-0.0`` as ``0.0``), else an
    :class:`InvalidArgumentError` naming ``name``, the value and what is accepted.

    Accepted: an ``int`` or ``float`` (a subclass such as ``numpy.float64`` too), finite,
    ``>= 0`` (``> 0`` unless ``zero_ok``), and ``None`` when ``none_ok`` (returned as
    ``None``; ``none_means`` says what it does, e.g. ``"to wait forever"``). Refused: a
    ``bool`` (``True`` is no duration), NaN, infinities, an int too large for a float,
    and anything else. ``means`` says in the message what the seconds bound; ``what``
    names the accepted kind before its bound. numpy and torch scalars that are not a
    ``float`` are refused: a caller that takes them runs :func:`plain_number` first and
    keeps what this returns.
    """
    if value is None and none_ok:
        return None
    x = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:  # an int beyond the float range
            x = math.inf
    if math.isfinite(x) and (x > 0 or (x == 0 and zero_ok)):
        return x + 0.0  # -0.0 + 0.0 is 0.0
    bound = ">= 0" if zero_ok else "> 0"
    why = f" ({means})" if means else ""
    or_none = f", or None {none_means}" if none_ok else ""
    raise InvalidArgumentError(f"{name}={short_repr(value)} must be {what} {bound}{why}{or_none}")


#: C0 and C1 control characters (ESC starts a terminal's escape sequences) and the
#: bidirectional marks that reorder how a line reads
_UNPRINTABLE: Final = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """``text`` with its control characters escaped as Python writes them (``\\x1b``,
    ``\\n``, ``\\u202e``), for printing on a terminal: a string from a log (a worker id,
    a scalar's name, an error) may hold an escape sequence the terminal would obey."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def is_safe_name(value: str) -> bool:
    """Whether the str ``value`` follows :data:`NAME_RULE` (no error built)."""
    return _NAME.match(value) is not None


def safe_name(
    value: object, what: str, *, error: type[InvalidArgumentError] = InvalidArgumentError
) -> str:
    """``value`` if it is a safe single path component (:data:`NAME_RULE`), else a clear
    ``error`` naming ``what``."""
    if not isinstance(value, str) or _NAME.match(value) is None:
        raise error(
            f"{what} {value!r:.200} is not a safe name: use 1-128 characters of letters, "
            "digits, '.', '_' and '-', starting with a letter or digit, without '..' or "
            "path separators (e.g. 'grpo-2026-05-01_1200')"
        )
    return value


def run_id(value: object, *, error: type[InvalidArgumentError] = InvalidArgumentError) -> str:
    """``value`` if it is a valid run id (the rule of :data:`SafeName`)."""
    return safe_name(value, "run_id", error=error)


_AT = re.compile(r"^(?P<expected>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD = re.compile(r"object (?P<how>missing required|contains unknown) field `(?P<name>[^`]*)`$")
_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")


def explain(exc: msgspec.ValidationError, data: object, root: str) -> str:
    """msgspec's complaint as ``root.path = value: expected ...``: the culprit's place,
    its value (looked up in ``data``, the plain values that were checked) and what was
    expected of it. In a ``[...]`` step (a dict's values) the culprit is the first value
    that is not a number: the only dicts whose values twinkle types are number maps."""
    match = _AT.match(str(exc))
    expected = str(exc) if match is None else match["expected"]
    path = "" if match is None or match["path"] is None else match["path"]
    place, found = root, True
    value: Any = data
    for attr, index in _STEP.findall(path):
        if attr:
            place += f".{attr}"
            found = found and isinstance(value, Mapping) and attr in value
            value = value[attr] if found else None
        elif index == "...":
            bad = None
            if found and isinstance(value, Mapping):
                bad = next((k for k, v in value.items() if not _is_number(v)), None)
            found = bad is not None
            place += "[...]" if bad is None else f"[{bad!r}]"
            value = value[bad] if found else None
        else:
            place += f"[{index}]"
            k = int(index)
            found = found and isinstance(value, list | tuple) and k < len(value)
            value = value[k] if found else None
    if not expected.startswith(f"{root}."):
        expected = expected[:1].lower() + expected[1:]
    for bound, name in _BOUNDS:
        expected = expected.replace(bound, name)
    if expected.startswith(f"{root}."):  # a check of the type's own, already placed
        return expected
    field = _FIELD.match(expected)
    if field is not None:
        what = "lacks field(s)" if field["how"] == "missing required" else "has unknown field(s)"
        return f"{place} {what} [{field['name']!r}]"
    if not path:
        return f"{place}: {expected}"
    shown = f" = {value!r:.100}" if found else ""
    return f"{place}{shown}: {expected}"


_BOUNDS = (
    (str(INT64_MAX), "2**63 - 1"),
    (str(INT64_MIN), "-2**63"),
    (str(MAX_TOKENS), "2**53 - 1"),
)


def is_integer(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool`` (which is one to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: object) -> int | None:
    """``value`` if it is an ``int`` and not a ``bool``, else None (a value read from a
    log or an attribute, where anything else counts as none)."""
    return value if is_integer(value) else None


def _is_number(value: object) -> bool:
    kind = type(value)
    return kind is float or value is None or (kind is int and INT64_MIN <= value <= INT64_MAX)  # type: ignore[operator]


def convert_checked(
    data: Mapping[str, Any] | Any,
    cls: type[_T],
    *,
    what: str = "data",
    error: type[InvalidArgumentError] = InvalidArgumentError,
    fix: str | None = None,
) -> _T:
    """``data`` (plain JSON-like values) as a checked ``cls``; a clear ``error`` naming
    the first field that is off, what was expected of it, and ``fix`` (default: pass
    the output of ``cls.to_dict()``)."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise error(
            f"{what} is not a valid {cls.__name__}: {explain(exc, data, what)}; "
            f"{fix or f'pass the output of {cls.__name__}.to_dict()'}"
        ) from None


# -- names the caller gives: the keys of its figures, the sources of its spans ---------

#: An empty part of a key between '/'s: the flat name ``<kind>/<key>`` (``metrics.jsonl``,
#: the dashboards) is read as a path of groups, and an empty one is a group without a name.
_EMPTY_PART: Final = re.compile(r"^/|/$|//")


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot name a number of the caller's (a key of ``values``), or None.

    A key becomes part of the flat name ``<kind>/<key>``: it is a non-empty str of valid
    UTF-8, without control or bidirectional characters (a terminal or a dashboard would
    obey them) and without an empty part between '/'s. A '/' inside a key is fine: the
    first '/' of a flat name ends the kind (a kind has none), and the rest groups the
    figures as TRL's do (``rewards/accuracy/mean``)."""
    if type(key) is not str:
        return f"is a {type(key).__qualname__}: keys are str (use str(key))"
    if not key:
        return "is empty: give every figure a name (e.g. 'reward_mean')"
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return (
                "is not valid UTF-8 (it holds a lone surrogate): decode the bytes it came "
                "from as UTF-8"
            )
    bad = _UNPRINTABLE.search(key)
    if bad is not None:
        return (
            f"holds the control character {bad.group()!r}, which the terminals and "
            "dashboards showing it would obey: use letters, digits, '_', '.', '-' and '/'"
        )
    if _EMPTY_PART.search(key) is not None:
        return (
            "has an empty part between '/'s: its flat name '<kind>/<key>' groups figures "
            "by '/', so a leading, trailing or doubled '/' makes a group without a name; "
            "drop the extra '/' (e.g. 'rewards/mean')"
        )
    return None


def value_key(key: object, where: str) -> str:
    """``key`` if it can name a number of the caller's (:func:`key_problem`), else an
    :class:`InvalidArgumentError` naming ``where`` (e.g. ``"scalars 'grpo': values"``)."""
    problem = key_problem(key)
    if problem is not None:
        raise InvalidArgumentError(f"{where} key {key!r:.200} {problem}")
    return key  # type: ignore[return-value]


#: Span sources starting so are twinkle's own: the batches of its overhead recorder
#: (``twinkle.observers``) hold the spans of its own work, which the summary counts apart.
OWN_SOURCE_PREFIX: Final = "twinkle."


def is_text(value: str) -> bool:
    """Whether ``value`` encodes to UTF-8 (no lone surrogate, as ``os.fsdecode`` gives
    for bytes that are not UTF-8): what the event log can write."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def caller_source(value: str, what: str) -> str:
    """``value`` (a non-empty str) unless it is a span source of twinkle's own
    (:data:`OWN_SOURCE_PREFIX`): a caller's recorder or worker under such a name would
    have its spans taken for twinkle's."""
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"{what} must be a str, got {type(value).__name__}: {value!r:.100}"
        )
    if not is_text(value):
        raise InvalidArgumentError(
            f"{what} {value!r:.200} is not valid UTF-8 (a lone surrogate, as os.fsdecode "
            "gives for bytes that are not UTF-8): name it in text"
        )
    if value.startswith(OWN_SOURCE_PREFIX):
        raise InvalidArgumentError(
            f"{what} {value!r:.200} is reserved: span sources starting "
            f"{OWN_SOURCE_PREFIX!r} are twinkle's own (the spans of its own work), and "
            "spans under one would be taken for them; name it after its role (e.g. "
            "'engine0' or 'rank1')"
        )
    return value
