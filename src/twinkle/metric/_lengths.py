"""Sample lengths (token counts): their validation, and the nearest-rank quantile maths.

What :class:`~twinkle.metric.LengthHistogram` and
:class:`~twinkle.metric.ThroughputMetric` share: the checks of a batch of lengths (the
slow path that names the first bad one, and the fast checks a counting pass allows), a
batch's sorted lengths and sum, and quantiles as exact ``(numerator, exponent)``
fractions with their nearest rank. See :mod:`twinkle.metric.histogram` for why the
fast paths look the way they do.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Final, TypeGuard

from twinkle.checks import plain_numbers, short_repr
from twinkle.errors import InvalidArgumentError

__all__ = [
    "MAX_LENGTH",
    "validate_lengths",
    "sorted_lengths",
    "nearest_rank",
    "check_quantile",
    "exact_fraction",
    "uncount",
    "all_lengths",
    "is_int",
]

MAX_LENGTH: Final = (1 << 53) - 1
"""The longest length held exactly: ``2**53 - 1``, the largest int a float holds exactly."""


def validate_lengths(lengths: object, *, where: str) -> list[int]:
    """Check every length: a sequence of int token counts in ``[0, MAX_LENGTH]``.

    The slow path (the fast one is :meth:`LengthHistogram._add`). Returns the lengths
    as a list of plain ints; ``where`` prefixes the error message (e.g.
    ``"ThroughputMetric.accumulate"``), which names the first bad length.
    """
    lengths = plain_numbers(lengths)  # a 1-d array or tensor, or numbers from them
    if not isinstance(lengths, Sequence) or isinstance(lengths, str | bytes | bytearray):
        raise InvalidArgumentError(
            f"{where}: lengths must be a sequence of int token counts, got "
            f"{short_repr(lengths)}; pass a list such as [128, 512] (or a 1-d array or "
            "tensor)"
        )
    values: list[int] = []
    for i, x in enumerate(lengths):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise InvalidArgumentError(
                f"{where}: lengths[{i}] must be an int token count, got {x!r} "
                f"({type(x).__name__}); pass whole numbers of tokens such as 128"
            )
        v = operator.index(x)
        if not 0 <= v <= MAX_LENGTH:
            raise InvalidArgumentError(
                f"{where}: lengths[{i}] must be a token count in [0, 2**53 - 1], got {x!r}; "
                f"pass the number of tokens of each sample"
            )
        values.append(v)
    return values


def sorted_lengths(lengths: Sequence[int], where: str) -> tuple[list[int], int]:
    """``lengths`` checked as :meth:`LengthHistogram.add` checks them, sorted, and their sum.

    The one-shot counterpart of a histogram, for one batch's statistics (a sort of a few
    hundred ints costs less than counting them into a histogram). The common path checks
    the bounds on the sorted ends; a list or tuple whose ``sum`` is an exact ``int``
    holds no float, ``Fraction``, ``Decimal`` or numpy scalar (``sum`` would be one of
    those), and a ``bool`` sorts with 0 and 1, so only a batch reaching down there has its
    types checked. Anything else takes the slow path, which names the first bad length.
    """
    if type(lengths) is list or type(lengths) is tuple:
        try:
            total = sum(lengths)
            ordered = sorted(lengths)
        except Exception:  # not numbers, or not comparable: the slow path names the culprit
            pass
        else:
            if type(total) is int and (
                not ordered
                or (
                    ordered[-1] <= MAX_LENGTH
                    and (ordered[0] > 1 or (ordered[0] >= 0 and not _has_bool(ordered)))
                )
            ):
                return ordered, total
    values = validate_lengths(lengths, where=where)
    values.sort()
    return values, sum(values)


def _has_bool(values: Sequence[int]) -> bool:
    return bool in set(map(type, values))


def nearest_rank(q: tuple[int, int], n: int) -> int:
    """The 1-based rank of the nearest-rank quantile ``q`` (numerator, exponent: the exact
    value of the float) of ``n >= 1`` samples: ``max(1, ceil(q * n))``, at most ``n``."""
    rank = -((-q[0] * n) >> q[1])  # ceil(q * n), exactly
    return 1 if rank < 1 else min(rank, n)


def check_quantile(q: object) -> tuple[int, int]:
    """``q``, a number in ``[0, 1]`` (checked), as :func:`exact_fraction` gives it."""
    if type(q) is float and 0.0 <= q <= 1.0:
        return exact_fraction(q)
    x = math.nan
    if not isinstance(q, bool) and isinstance(q, numbers.Real):
        try:
            x = float(q)
        except OverflowError:
            x = math.nan
    if not 0 <= x <= 1:  # also rejects nan
        raise InvalidArgumentError(
            f"LengthHistogram.quantile: q must be a number in [0, 1], got {q!r}; "
            f"pass e.g. 0.5 for the median or 0.95 for the 95th percentile"
        )
    return exact_fraction(x)


def exact_fraction(x: float) -> tuple[int, int]:
    """``(n, k)`` with ``x == n / 2**k`` exactly (a float's denominator is a power of 2)."""
    n, d = x.as_integer_ratio()
    return n, d.bit_length() - 1


def uncount(counts: dict[Any, int], values: Iterable[object], grown: int) -> None:
    """Undo ``_count_elements(counts, values)``, which added ``grown`` new keys.

    When the counting pass raised (an element's ``__hash__``/``__eq__``), the elements
    before it were counted: replaying stops at the same element.
    """
    for x in values:
        try:
            counts[x] -= 1
        except Exception:  # the element the counting pass stopped at
            break
    for key in list(islice(reversed(counts), grown)):
        del counts[key]


def all_lengths(
    values: Sequence[int], new: list[int], small: tuple[int, int] | None, counts: dict[int, int]
) -> bool:
    """Whether ``values``, just counted into ``counts``, were all lengths.

    (Typed as what they should be; this is where that is checked.) Their ``sum`` was an
    exact int, so none is a float, ``Fraction``, ``Decimal``, complex or numpy scalar
    (each would have made it one of those), nor ``None`` or a string (``sum`` raises).
    An int out of range equals no length held, nor does any other non-int (short of a
    type written to pass for an int: equal, same hash, summing to an int), so each is
    one of the ``new`` keys; an int subclass equal to a held length is that length. A
    ``bool`` alone can hide behind a held 0 or 1: ``small`` is their counts before,
    ``None`` when neither was held.
    """
    if new and not (set(map(type, new)) <= {int} and min(new) >= 0 and max(new) <= MAX_LENGTH):
        return False
    touched_small = (new and min(new) <= 1) or (
        small is not None and small != (counts.get(0, 0), counts.get(1, 0))
    )
    return not touched_small or bool not in set(map(type, values))


def is_int(x: object) -> TypeGuard[int]:
    """Whether ``x`` is a plain ``int`` (not a ``bool``, nor another subclass)."""
    return type(x) is int
