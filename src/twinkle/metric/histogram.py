"""An exact, deterministic, mergeable distribution of sample lengths (token counts).

The histogram keeps one exact count per *distinct* length, so every statistic it gives
is exact, for every length in ``[0, MAX_LENGTH]`` (``2**53 - 1``, exact as a float).
Memory is one dictionary entry (and one sorted-key slot) per distinct length, whatever
the number of samples: it grows with the number of different lengths seen, never with
how often they are seen. For token counts that is at most the longest sequence + 1.

Quantiles use the nearest-rank definition: ``quantile(q)`` of ``n`` samples is the
``max(1, ceil(q * n))``-th smallest sample (``q`` taken as the exact value of the float),
so ``quantile(0)`` is the minimum and ``quantile(1)`` the maximum.

Why it is cheap. A step of 64 lengths is counted by one C-level pass
(``collections._count_elements``) and summed by another; validation costs nothing
extra on the common path: ``sum`` of anything but ints is not an exact ``int``, and
every out-of-range or non-``int`` value, being equal to no valid length already held,
shows up as a *new* key, and only new keys are checked. ``bool`` hides behind the keys
``0``/``1`` (``True == 1``), so a batch that touches them has its types checked. Any
doubt undoes the pass and takes the slow path, which checks every length and names the
first bad one. Quantiles keep a cursor per ``q`` (a length and how many samples lie
below it): each add moves it by the batch's samples below it (one sort of the batch,
only once quantiles have been asked for), and a query walks a few distinct lengths
from there instead of the whole distribution. The sorted distinct lengths it walks
are a main list plus a short side list of new ones, merged when the side list grows
past ``O(sqrt)`` of the main one, so a new length costs no linear re-sort.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import _count_elements  # type: ignore[attr-defined]  # C helper of Counter
from collections.abc import Mapping, Sequence
from itertools import accumulate, islice
from typing import Any, Final, final

from twinkle.checks import short_repr
from twinkle.errors import InvalidArgumentError
from twinkle.metric._lengths import (
    MAX_LENGTH,
    all_lengths,
    check_quantile,
    is_int,
    nearest_rank,
    uncount,
    validate_lengths,
)

__all__ = ["LengthHistogram"]

_STATE_VERSION: Final = 2  # 1 held approximate buckets above 4096 tokens
# A query walks at most this many distinct lengths from its cursor before it re-derives
# the rank from the cumulative counts (C speed, linear in the distinct lengths).
_CURSOR_WALK: Final = 32
_MAX_CURSORS: Final = 8  # quantiles tracked at once (ThroughputMetric asks for two)


@final
class LengthHistogram:
    """Count, total, min, max and the exact distribution of integer lengths.

    Memory is one entry per distinct length (:attr:`distinct_count`), independent of
    the number of lengths added; the result depends only on the multiset of lengths
    added (not on their order or on how they were split across ``add``/``merge`` calls).
    """

    MAX_LENGTH: Final = MAX_LENGTH

    __slots__ = ("_count", "_counts", "_cursors", "_fresh", "_keys", "_max", "_min", "_total")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}  # length -> how many samples had it
        # Sorted distinct lengths, brought up to date by queries. Keys are only ever
        # appended to _counts, so the ones missing here are its last ones; _fresh holds
        # them sorted, for a query that walks before they are merged in.
        self._keys: list[int] = []
        self._fresh: list[int] = []
        # q (as numerator, exponent) -> [a length held, samples strictly below it].
        self._cursors: dict[tuple[int, int], list[int]] = {}
        self._count = 0
        self._total = 0
        # Meaningful only while _count > 0 (the properties say None otherwise).
        self._min = 0
        self._max = 0

    @property
    def count(self) -> int:
        """Number of lengths added."""
        return self._count

    @property
    def total(self) -> int:
        """Exact sum of the lengths added."""
        return self._total

    @property
    def min(self) -> int | None:
        """Smallest length added, ``None`` when empty."""
        return self._min if self._count else None

    @property
    def max(self) -> int | None:
        """Largest length added, ``None`` when empty."""
        return self._max if self._count else None

    @property
    def distinct_count(self) -> int:
        """Number of distinct lengths held (one count each): what memory grows with."""
        return len(self._counts)

    def add(self, lengths: Sequence[int]) -> None:
        """Add a sequence of int lengths in ``[0, MAX_LENGTH]`` (validated first)."""
        self._add(lengths, "LengthHistogram.add")

    def _add(self, lengths: Sequence[int], where: str) -> None:
        """Validate and count ``lengths`` (each once); a rejected call changes nothing."""
        counts = self._counts
        if type(lengths) is list or type(lengths) is tuple:
            try:
                total = sum(lengths)
            except Exception:  # not numbers: the slow path names the culprit
                total = None
            if type(total) is int:
                before = len(counts)
                small = (counts.get(0, 0), counts.get(1, 0)) if 0 in counts or 1 in counts else None
                try:
                    _count_elements(counts, lengths)
                except Exception:  # an exotic element's __hash__/__eq__
                    uncount(counts, lengths, len(counts) - before)
                else:
                    grown = len(counts) - before
                    new = list(islice(reversed(counts), grown)) if grown else []
                    # The common step: every length equals a valid one held, and no
                    # bool can hide behind a held 0 or 1.
                    if (not grown and small is None) or all_lengths(lengths, new, small, counts):
                        self._commit(lengths, total, new)
                        return
                    uncount(counts, lengths, grown)
        values = validate_lengths(lengths, where=where)
        before = len(counts)
        _count_elements(counts, values)
        grown = len(counts) - before
        self._commit(values, sum(values), list(islice(reversed(counts), grown)) if grown else [])

    def _commit(self, values: Sequence[int], total: int, new: list[int]) -> None:
        """Finish an add of validated ``values``, counted already; ``new``: keys it added."""
        if new:
            low, high = min(new), max(new)  # an existing key cannot be a new extreme
            if self._count == 0:
                self._min, self._max = low, high
            else:
                self._min, self._max = min(self._min, low), max(self._max, high)
        if self._cursors and values:
            self._move_cursors(values)
        self._count += len(values)
        self._total += total

    def _move_cursors(self, values: Sequence[int]) -> None:
        """Count ``values`` into the samples below each cursor (one sort of the batch)."""
        ordered = sorted(values)
        for cursor in self._cursors.values():
            cursor[1] += bisect_left(ordered, cursor[0])

    def quantile(self, q: float) -> float:
        """Nearest-rank ``q``-quantile (``0 <= q <= 1``), exact; ``nan`` when empty."""
        return self._quantiles((check_quantile(q),))[0]

    def _quantiles(self, qs: Sequence[tuple[int, int]]) -> list[float]:
        """Quantiles at ``numerator / 2**exponent`` pairs (validated), in order."""
        n = self._count
        if n == 0:
            return [math.nan] * len(qs)
        out: list[float] = []
        for q in qs:
            rank = nearest_rank(q, n)
            if rank == 1:
                out.append(float(self._min))
            elif rank == n:
                out.append(float(self._max))
            else:
                out.append(float(self._at_rank(q, rank)))
        return out

    def _at_rank(self, q: tuple[int, int], rank: int) -> int:
        """The ``rank``-th smallest length (1-based), from ``q``'s cursor."""
        counts = self._counts
        cursor = self._cursors.get(q)
        if cursor is not None:
            key, below = cursor
            at = counts[key]
            if below < rank <= below + at:
                return key
            if rank > below + at:  # walk up
                below += at
                for length in self._neighbours(key, up=True):
                    at = counts[length]
                    if rank <= below + at:
                        cursor[0], cursor[1] = length, below
                        return length
                    below += at
            else:  # walk down
                for length in self._neighbours(key, up=False):
                    below -= counts[length]
                    if below < rank:
                        cursor[0], cursor[1] = length, below
                        return length
        elif len(self._cursors) >= _MAX_CURSORS:
            self._cursors.clear()
        keys = self._sorted_keys()
        cumulative = list(accumulate(map(counts.__getitem__, keys)))
        i = bisect_left(cumulative, rank)
        key = keys[i]
        self._cursors[q] = [key, cumulative[i - 1] if i else 0]
        return key

    def _neighbours(self, key: int, *, up: bool) -> list[int]:
        """The ``_CURSOR_WALK`` held lengths nearest ``key`` above (ascending) or below
        (descending) it: the nearest of each sorted list, merged."""
        keys, fresh = self._keys, self._fresh_keys()
        w = _CURSOR_WALK
        if up:
            i, j = bisect_left(keys, key + 1), bisect_left(fresh, key + 1)
            return sorted(keys[i : i + w] + fresh[j : j + w])[:w]
        i, j = bisect_left(keys, key), bisect_left(fresh, key)
        return sorted(keys[max(i - w, 0) : i] + fresh[max(j - w, 0) : j], reverse=True)[:w]

    def _fresh_keys(self) -> list[int]:
        """The held lengths missing from ``_keys``, sorted.

        They are the last ones inserted into ``_counts`` (keys are only appended), and
        the newest of them the ones missing from ``_fresh`` too: a few are inserted one
        by one (a short move each), more with a sort of the side list. Merged into
        ``_keys`` once there are more than ``64 + 8 * sqrt(len(_keys))``: a merge is
        linear in the distinct lengths, so this bounds it to ``O(sqrt)`` per new length.
        """
        keys, fresh = self._keys, self._fresh
        missing = len(self._counts) - len(keys)
        if missing > 64 + 8 * math.isqrt(len(keys)):
            self._sorted_keys()
        elif missing - len(fresh) > 16:
            fresh += islice(reversed(self._counts), missing - len(fresh))
            fresh.sort()
        elif missing != len(fresh):
            for length in islice(reversed(self._counts), missing - len(fresh)):
                insort(fresh, length)
        return self._fresh

    def _sorted_keys(self) -> list[int]:
        """Every held length, sorted: ``_keys`` with the fresh ones merged in."""
        keys = self._keys
        missing = len(self._counts) - len(keys)
        if missing:
            keys += islice(reversed(self._counts), missing)
            keys.sort()  # a long sorted run and a short tail: a linear merge
            self._fresh = []
        return keys

    def merge(self, other: LengthHistogram) -> None:
        """Add every length ``other`` holds to this histogram (``other`` is unchanged)."""
        if not isinstance(other, LengthHistogram):
            raise InvalidArgumentError(
                f"LengthHistogram.merge: other must be a LengthHistogram, got "
                f"{short_repr(other)}; rebuild it with LengthHistogram.from_state(...)"
            )
        if other._count == 0:
            return
        counts = self._counts
        for length, count in other._counts.items():
            counts[length] = counts.get(length, 0) + count
        self._cursors.clear()  # ranks moved by other's samples; the next query re-derives
        if self._count == 0:
            self._min, self._max = other._min, other._max
        else:
            self._min, self._max = min(self._min, other._min), max(self._max, other._max)
        self._count += other._count
        self._total += other._total

    def reset(self) -> None:
        """Forget every length."""
        self._counts.clear()
        self._keys.clear()
        self._fresh = []
        self._cursors.clear()
        self._count = 0
        self._total = 0
        self._min = 0
        self._max = 0

    def state(self) -> dict[str, Any]:
        """Plain JSON-able partial state; ``from_state(h.state())`` equals ``h``.

        ``counts`` lists ``[length, count]`` pairs in ascending order of length, so
        equal histograms have equal states.
        """
        return {
            "version": _STATE_VERSION,
            "total": self._total,
            "min": self.min,
            "max": self.max,
            "counts": [[length, self._counts[length]] for length in sorted(self._counts)],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LengthHistogram:
        """Rebuild a histogram from :meth:`state` output (validated)."""
        where = "LengthHistogram.from_state"
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(
                f"{where}: state must be a mapping from LengthHistogram.state(), got "
                f"{short_repr(state)}"
            )
        version = state.get("version")
        if type(version) is not int or version != _STATE_VERSION:
            raise InvalidArgumentError(
                f"{where}: state['version'] must be {_STATE_VERSION}, got {version!r}; "
                f"pass a state written by this version of LengthHistogram.state() "
                f"(version 1 held approximate buckets and cannot be made exact)"
            )
        hist = cls()
        hist._counts = counts = _state_counts(state.get("counts"), where)
        hist._count = sum(counts.values())
        total, low, high = state.get("total"), state.get("min"), state.get("max")
        if hist._count == 0:
            if not (is_int(total) and total == 0 and low is None and high is None):
                raise InvalidArgumentError(
                    f"{where}: an empty state must have total 0 and min/max None, got "
                    f"({total!r}, {low!r}, {high!r}); pass LengthHistogram.state() output"
                )
            return hist
        if not (
            is_int(total)
            and is_int(low)
            and is_int(high)
            and total == sum(length * count for length, count in counts.items())
            and low == min(counts)
            and high == max(counts)
        ):
            raise InvalidArgumentError(
                f"{where}: state total/min/max ({total!r}, {low!r}, {high!r}) do not fit "
                f"its counts; pass a state written by LengthHistogram.state()"
            )
        hist._total, hist._min, hist._max = total, low, high
        return hist

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LengthHistogram):
            return NotImplemented
        return (self._count, self._total, self._counts) == (
            other._count,
            other._total,
            other._counts,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"LengthHistogram(count={self._count}, total={self._total}, min={self.min}, "
            f"max={self.max}, distinct={len(self._counts)})"
        )


def _state_counts(pairs: object, where: str) -> dict[int, int]:
    """``state['counts']`` of :meth:`LengthHistogram.state` output as a dict (validated)."""
    if not isinstance(pairs, Sequence) or isinstance(pairs, str | bytes):
        raise InvalidArgumentError(
            f"{where}: state['counts'] must be a list of [length, count] pairs, got "
            f"{short_repr(pairs)}"
        )
    counts: dict[int, int] = {}
    for pos, pair in enumerate(pairs):
        length: object = None
        count: object = None
        if isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2:
            length, count = pair
        if not (
            is_int(length)
            and is_int(count)
            and 0 <= length <= MAX_LENGTH
            and count > 0
            and length not in counts
        ):
            raise InvalidArgumentError(
                f"{where}: state['counts'][{pos}] must be a [length in [0, 2**53 - 1], "
                f"count > 0] pair of ints (each length once), got {pair!r}"
            )
        counts[length] = count
    return counts
