"""A span's ``iteration`` attribute, the iteration it is attributed to: a whole number
>= 0, or it names none (docs/metrics.md "Attribution")."""

from __future__ import annotations

import logging

from twinkle.checks import is_integer

__all__ = ["iteration_number", "iteration_of"]

_log = logging.getLogger("twinkle.observers")


def iteration_number(value: object) -> int | None:
    """``value``, a span's ``iteration`` attribute, as the iteration it names: a whole
    number >= 0 (not a bool); None for anything else."""
    if is_integer(value) and value >= 0:
        return value
    return None


def iteration_of(attr: object, source: str, name: str, said: set[tuple[str, str]]) -> int | None:
    """``attr``, a span's ``iteration`` attribute, as the iteration it names; None when
    absent or when it names none (a str, a float, a bool, a negative number), which is
    said once per source and span name (``said`` holds those said): such a span is
    placed by its time, as one without the attribute."""
    number = iteration_number(attr)
    if attr is None or number is not None:
        return number
    if (source, name) not in said:
        said.add((source, name))
        _log.warning(
            "span %r from %r has iteration=%r (%s), which is no iteration number (a whole "
            "number >= 0): it is placed by its start, as a span without one; pass the "
            "iteration as an int",
            name,
            source,
            attr,
            type(attr).__name__,
        )
    return None
