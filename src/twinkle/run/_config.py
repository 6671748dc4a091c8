"""The run's configuration as the event log carries it, and what a resumed segment may
change of it (a restarted job: ``total_steps`` and the caller's ``x_`` keys)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import pluggy

from twinkle.checks import short_repr
from twinkle.errors import ConfigError
from twinkle.events import read_back

__all__ = [
    "RESUMABLE_CONFIG",
    "check_config",
    "describe_config_changes",
    "refused_config_keys",
    "resumable_key",
]


def check_config(config: Mapping[str, Any], pm: pluggy.PluginManager) -> dict[str, Any]:
    """The configuration as the event log will carry it (``read_back``: NaN and
    infinities as None), after refusing, before anything starts, one the log cannot hold
    or an observer cannot use (``twinkle_check_config``; :class:`~twinkle.errors.ConfigError`
    naming the key): what the live run's observers accept is what a replay accepts."""
    try:
        logged = read_back(dict(config))
    except TypeError as exc:
        raise ConfigError(
            f"config must hold only JSON values with str keys and ints within 64 bits (it "
            f"travels in events.jsonl): {exc}"
        ) from None
    for where, value in _not_finite(config, "config"):
        raise ConfigError(
            f"{where} is {value!r}: the configuration travels in events.jsonl as JSON, "
            "which has no NaN or infinity (it would read back as null): give a number, or "
            "leave the key out"
        )
    pm.hook.twinkle_check_config(config=logged)
    return cast("dict[str, Any]", logged)


def _not_finite(value: object, where: str) -> Iterable[tuple[str, float]]:
    """The non-finite floats in ``value`` (a checked configuration), with their keys."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _not_finite(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _not_finite(item, f"{where}[{i}]")


#: what a resumed segment may change of the run's configuration, in words
RESUMABLE_CONFIG = "total_steps and the caller's x_ keys"


def resumable_key(key: str) -> bool:
    """Whether a resumed segment may give configuration ``key`` another value:
    ``total_steps`` (a restarted job may plan more steps) and the caller's own ``x_``
    keys, which no observer reads. Every other key decides what the figures of every
    segment mean (a resumed run's outputs are rebuilt from the whole log under the
    newest segment's configuration), so it stays as the run began."""
    return key == "total_steps" or key.startswith("x_")


def refused_config_keys(logged: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys, sorted, that differ between the run's configuration ``logged`` and a
    resumed segment's ``given`` (both as the log carries them) and that a resume may not
    change (see :func:`resumable_key`)."""
    fixed = {k for k in (*logged, *given) if not resumable_key(k)}
    return tuple(
        sorted(k for k in fixed if k not in logged or k not in given or logged[k] != given[k])
    )


def describe_config_changes(
    keys: Iterable[str], logged: Mapping[str, Any], given: Mapping[str, Any]
) -> str:
    """``key: <the run's value> -> <the new one>`` for each of ``keys``, shortened."""

    def value(config: Mapping[str, Any], key: str) -> str:
        return short_repr(config[key]) if key in config else "(not set)"

    return "; ".join(f"{k}: {value(logged, k)} -> {value(given, k)}" for k in keys)
