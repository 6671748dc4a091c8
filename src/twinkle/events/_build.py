"""Building and checking the values of events from the arguments of the bus's calls.

:class:`~twinkle.events.EventBus` turns its keyword arguments into event fields through
these helpers, which refuse what cannot be an event's value with an error naming the
event, the field and the value. They read no clock and send nothing: stamping and
publishing stay on the bus. The checks of a publish stay inline there (a call costs on
every publish); what lives here runs once per field, or only to say what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from twinkle.checks import value_key
from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.events._types import Event
from twinkle.perf import Span
from twinkle.reporting import is_record_kind

__all__ = [
    "figure_keys",
    "items",
    "mapping",
    "raise_backwards",
    "scalars_name_error",
    "segment_fields",
    "without_backwards",
]


def items(kind: type[Event], name: str, value: Any, what: str) -> tuple[Any, ...]:
    """``value`` as a tuple, or a clear error for what is not a collection of items."""
    kind_of = type(value)
    if kind_of is tuple:
        return value  # type: ignore[no-any-return]
    if kind_of is list:
        return tuple(value)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise RecordError(f"{kind.TYPE}.{name} must be an iterable of {what}, got {value!r:.100}")
    return tuple(value)


def mapping(kind: type[Event], name: str, value: Any) -> dict[str, Any]:
    """A copy of ``value`` as a dict, or a clear error for what is not a mapping."""
    if type(value) is dict:
        return dict(value)
    if not isinstance(value, Mapping):
        raise RecordError(
            f"{kind.TYPE}.{name} must be a mapping of str keys to values, got {value!r:.100}"
        )
    return dict(value)


def figure_keys(name: str, values: object) -> None:
    """Refuse a key that cannot name its figure (:func:`~twinkle.checks.key_problem`)
    before anything is published: its record would be lost, here and in every replay.
    (Values that are not a mapping are named by the event's validation.)"""
    for key in values if isinstance(values, Mapping) else ():
        value_key(key, f"scalars {name!r:.100}: values")


def scalars_name_error(name: str, reserved: frozenset[str]) -> InvalidArgumentError:
    """What is wrong with ``name`` for a scalars event: not a record kind, or one of the
    ``reserved`` kinds of the run's observers (the bus checks, then asks here why)."""
    if not is_record_kind(name):
        return InvalidArgumentError(
            f"scalars name {name!r:.200} cannot be its records' kind: use 1 or more of "
            "A-Z a-z 0-9 _ . - (no '/' or spaces; e.g. 'grpo' or 'reward.v2')"
        )
    return InvalidArgumentError(
        f"scalars name {name!r} is the kind of records the run's observers make "
        f"({', '.join(map(repr, sorted(reserved)))}): its records would be "
        "taken for theirs; give your figures a name of their own (e.g. 'grpo')"
    )


def segment_fields(
    config: Mapping[str, Any] | None,
    plugins: Iterable[str],
    plugins_left_out: Mapping[str, str] | None,
) -> tuple[dict[str, Any], tuple[str, ...], dict[str, str]]:
    """The fields a segment opens with (``run_started``, ``run_resumed``): the observer
    configuration, the plugins loaded (sorted) and those left out (by name, with why)."""
    return (
        dict(config or {}),
        tuple(sorted(plugins)),
        dict(sorted((plugins_left_out or {}).items())),
    )


def without_backwards(
    batch: tuple[Any, ...], bad: list[Span], source: str, backwards: list[str]
) -> tuple[Any, ...]:
    """``batch`` less its ``bad`` spans (ending before they start), which are named in
    ``backwards`` (the first five, then how many more) for :func:`raise_backwards`."""
    backwards.extend(f"{s.name!r} (source {source!r}: {s.start_ns} -> {s.end_ns})" for s in bad[:5])
    if len(bad) > 5:
        backwards.append(f"and {len(bad) - 5} more")
    return tuple(s for s in batch if not (type(s) is Span and s.end_ns < s.start_ns))


def raise_backwards(backwards: list[str]) -> None:
    """Raise :class:`~twinkle.errors.RecordError` naming the spans in ``backwards``, if any."""
    if backwards:
        raise RecordError(
            f"span(s) ending before they start were left out: {', '.join(backwards)}; the "
            "clock went backwards — a run's clock must be monotonic (time.perf_counter_ns, "
            "or a ManualClock that only advances); every other span was published"
        )
