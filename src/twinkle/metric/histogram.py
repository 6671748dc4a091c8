"""A bounded, deterministic, mergeable distribution of sample lengths (token counts).

Buckets are integer-only, so the same lengths give the same buckets on every machine:

* a length below ``EXACT_BELOW`` (2**12) has its own bucket (exact counts);
* a length ``v >= 2**12`` with ``e = v.bit_length() - 1`` falls into one of 128 equal
  buckets of width ``2**(e - 7)`` that split the octave ``[2**e, 2**(e + 1))``. The
  bucket is represented by its midpoint, which is within ``(width - 1) / 2`` of any
  length in it; since ``v >= 2**e = 128 * width`` the relative error is below
  ``2**-8`` (0.39 %, inside the promised 0.5 %).

Lengths are capped at ``MAX_LENGTH`` (2**53 - 1, exact as a float), so a histogram never
holds more than ``MAX_BUCKETS`` (9344) buckets however many samples it has seen.

Quantiles use the nearest-rank definition: ``quantile(q)`` of ``n`` samples is the
``max(1, ceil(q * n))``-th smallest sample (``q`` taken as the exact value of the float),
so ``quantile(0)`` is the minimum and ``quantile(1)`` the maximum (both exact). Otherwise,
above ``EXACT_BELOW``, the bucket midpoint stands for that sample, clamped to the observed
``[min, max]``.
"""

from __future__ import annotations

import math
import numbers
import operator
import reprlib
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import accumulate, repeat
from typing import Any, Final, TypeGuard, final

from twinkle.errors import InvalidArgumentError

__all__ = ["LengthHistogram"]

_EXACT_BITS: Final = 12
_SUB_BITS: Final = 7  # 2**7 = 128 buckets per octave above the exact range
_EXACT_BELOW: Final = 1 << _EXACT_BITS
_MAX_LENGTH: Final = (1 << 53) - 1
# Buckets are grouped in blocks of 64 consecutive indices; keeping per-block totals lets
# quantile() walk a few hundred blocks and then one block instead of every bucket.
_BLOCK_BITS: Final = 6
_STATE_VERSION: Final = 1


def _short_repr(value: object) -> str:
    """``repr`` shortened for error messages (long sequences, big objects)."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = 8
    r.maxstring = r.maxother = 60
    return r.repr(value)


def _bucket(v: int) -> int:
    """Dense bucket index of a validated length."""
    if v < _EXACT_BELOW:
        return v
    e = v.bit_length() - 1
    return (v >> (e - _SUB_BITS)) + ((e - _EXACT_BITS) << _SUB_BITS) + _EXACT_BELOW - 128


def _bucket_bounds(index: int) -> tuple[int, int]:
    """``(lowest, highest)`` length that falls into bucket ``index``."""
    if index < _EXACT_BELOW:
        return index, index
    j = index - _EXACT_BELOW
    shift = _EXACT_BITS + (j >> _SUB_BITS) - _SUB_BITS
    low = ((1 << _SUB_BITS) + (j & ((1 << _SUB_BITS) - 1))) << shift
    return low, low + (1 << shift) - 1


def _validate_lengths(lengths: object, *, where: str) -> Sequence[int]:
    """Check that ``lengths`` is a sequence of int token counts in ``[0, MAX_LENGTH]``.

    Returns the lengths as plain ints (the argument itself when it already holds only
    ``int``). ``where`` prefixes the error message (e.g. ``"ThroughputMetric.accumulate"``).
    """
    if not isinstance(lengths, Sequence) or isinstance(lengths, str | bytes | bytearray):
        raise InvalidArgumentError(
            f"{where}: lengths must be a sequence of int token counts, got "
            f"{_short_repr(lengths)}; pass a list such as [128, 512] "
            f"(convert a tensor or array with .tolist())"
        )
    values: Sequence[int]
    if set(map(type, lengths)) <= {int}:
        values = lengths
    else:
        converted: list[int] = []
        for i, x in enumerate(lengths):
            if isinstance(x, bool) or not isinstance(x, numbers.Integral):
                raise InvalidArgumentError(
                    f"{where}: lengths[{i}] must be an int token count, got {x!r} "
                    f"({type(x).__name__}); pass whole numbers of tokens such as 128"
                )
            converted.append(operator.index(x))
        values = converted
    if values:
        low, high = min(values), max(values)
        if low < 0 or high > _MAX_LENGTH:
            i, x = next((i, x) for i, x in enumerate(values) if not 0 <= x <= _MAX_LENGTH)
            raise InvalidArgumentError(
                f"{where}: lengths[{i}] must be a token count in [0, 2**53 - 1], got {x!r}; "
                f"pass the number of tokens of each sample"
            )
    return values


def _check_quantile(q: object) -> tuple[int, int]:
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
    return x.as_integer_ratio()


@final
class LengthHistogram:
    """Counts, total, min, max and a bucketed distribution of integer lengths.

    Memory is bounded by ``MAX_BUCKETS`` regardless of how many lengths are added;
    the result depends only on the multiset of lengths added (not on their order or
    on how they were split across ``add``/``merge`` calls).
    """

    EXACT_BELOW: Final = _EXACT_BELOW
    MAX_LENGTH: Final = _MAX_LENGTH
    MAX_BUCKETS: Final = _EXACT_BELOW + ((53 - _EXACT_BITS) << _SUB_BITS)
    RELATIVE_ERROR: Final = 2.0 ** -(_SUB_BITS + 1)

    __slots__ = (
        "_block_keys",
        "_blocks",
        "_count",
        "_counts",
        "_max",
        "_min",
        "_quantile_cache",
        "_total",
    )

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()
        self._blocks: Counter[int] = Counter()
        self._block_keys: list[int] = []  # sorted keys of _blocks, refreshed on demand
        # The last quantiles computed, valid until the next add/merge/reset.
        self._quantile_cache: tuple[tuple[tuple[int, int], ...], list[float]] | None = None
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
    def bucket_count(self) -> int:
        """Number of non-empty buckets held (never more than ``MAX_BUCKETS``)."""
        return len(self._counts)

    def add(self, lengths: Sequence[int]) -> None:
        """Add a sequence of int lengths in ``[0, MAX_LENGTH]`` (validated first)."""
        self._add_valid(_validate_lengths(lengths, where="LengthHistogram.add"))

    def _add_valid(self, values: Sequence[int]) -> None:
        # Callers have run _validate_lengths(); nothing below can fail half-way.
        if not values:
            return
        low, high = min(values), max(values)
        if high < _EXACT_BELOW:
            indices: Sequence[int] = values
        else:
            # _bucket() inlined (runs for every sample above the exact range), with
            # s = e - 7: (v >> s) + ((e - 12) << 7) + 4096 - 128.
            indices = [
                v if v < _EXACT_BELOW else (v >> (s := v.bit_length() - 8)) + ((s - 5) << 7) + 3968
                for v in values
            ]
        self._counts.update(indices)
        self._blocks.update(map(operator.rshift, indices, repeat(_BLOCK_BITS)))
        self._quantile_cache = None
        if self._count == 0:
            self._min, self._max = low, high
        else:
            self._min, self._max = min(self._min, low), max(self._max, high)
        self._count += len(values)
        self._total += sum(values)

    def quantile(self, q: float) -> float:
        """Nearest-rank ``q``-quantile (``0 <= q <= 1``); ``nan`` when empty.

        Exact below ``EXACT_BELOW``; above it within ``RELATIVE_ERROR`` of the exact
        nearest-rank sample.
        """
        return self._quantiles((_check_quantile(q),))[0]

    def _quantiles(self, qs: Sequence[tuple[int, int]]) -> list[float]:
        """Quantiles at exact rationals ``numerator / denominator`` (validated), one pass."""
        n = self._count
        if n == 0:
            return [math.nan] * len(qs)
        qs = tuple(qs)
        cached = self._quantile_cache
        if cached is not None and cached[0] == qs:
            return list(cached[1])
        keys = self._block_keys
        if len(keys) != len(self._blocks):
            # Blocks are only ever added (reset clears both), so equal sizes mean equal keys.
            keys = self._block_keys = sorted(self._blocks)
        cumulative: list[int] = []
        out: list[float] = []
        for numerator, denominator in qs:
            rank = max(1, -((-numerator * n) // denominator))  # ceil(q * n), exactly
            if rank in (1, n):
                out.append(float(self._min if rank == 1 else self._max))
                continue
            if not cumulative:
                cumulative = list(accumulate(map(self._blocks.__getitem__, keys)))
            position = bisect_left(cumulative, rank)
            seen = cumulative[position - 1] if position else 0
            start = keys[position] << _BLOCK_BITS
            for index in range(start, start + (1 << _BLOCK_BITS)):
                seen += self._counts.get(index, 0)
                if seen >= rank:
                    break
            low, high = _bucket_bounds(index)
            out.append(float(min(max((low + high) / 2, self._min), self._max)))
        self._quantile_cache = (qs, list(out))
        return out

    def merge(self, other: LengthHistogram) -> None:
        """Add every length ``other`` holds to this histogram (``other`` is unchanged)."""
        if not isinstance(other, LengthHistogram):
            raise InvalidArgumentError(
                f"LengthHistogram.merge: other must be a LengthHistogram, got "
                f"{_short_repr(other)}; rebuild it with LengthHistogram.from_state(...)"
            )
        if other._count == 0:
            return
        self._counts.update(other._counts)
        self._blocks.update(other._blocks)
        self._quantile_cache = None
        if self._count == 0:
            self._min, self._max = other._min, other._max
        else:
            self._min, self._max = min(self._min, other._min), max(self._max, other._max)
        self._count += other._count
        self._total += other._total

    def reset(self) -> None:
        """Forget every length."""
        self._counts.clear()
        self._blocks.clear()
        self._block_keys = []
        self._quantile_cache = None
        self._count = 0
        self._total = 0
        self._min = 0
        self._max = 0

    def state(self) -> dict[str, Any]:
        """Plain JSON-able partial state; ``from_state(h.state())`` equals ``h``.

        ``buckets`` lists ``[lowest length of the bucket, count]`` pairs in ascending
        order, so equal histograms have equal states.
        """
        return {
            "version": _STATE_VERSION,
            "exact_below": _EXACT_BELOW,
            "buckets_per_octave": 1 << _SUB_BITS,
            "total": self._total,
            "min": self.min,
            "max": self.max,
            "buckets": [[_bucket_bounds(i)[0], c] for i, c in sorted(self._counts.items())],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LengthHistogram:
        """Rebuild a histogram from :meth:`state` output (validated)."""
        where = "LengthHistogram.from_state"
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(
                f"{where}: state must be a mapping from LengthHistogram.state(), got "
                f"{_short_repr(state)}"
            )
        expected = {
            "version": _STATE_VERSION,
            "exact_below": _EXACT_BELOW,
            "buckets_per_octave": 1 << _SUB_BITS,
        }
        for key, want in expected.items():
            if state.get(key) != want or isinstance(state.get(key), bool):
                raise InvalidArgumentError(
                    f"{where}: state[{key!r}] must be {want!r}, got {state.get(key)!r}; "
                    f"pass a state written by this version of LengthHistogram.state()"
                )
        buckets = state.get("buckets")
        if not isinstance(buckets, Sequence) or isinstance(buckets, str | bytes):
            raise InvalidArgumentError(
                f"{where}: state['buckets'] must be a list of [length, count] pairs, got "
                f"{_short_repr(buckets)}"
            )
        hist = cls()
        for pos, pair in enumerate(buckets):
            low: object = None
            count: object = None
            if isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2:
                low, count = pair
            if not (
                _is_int(low)
                and _is_int(count)
                and 0 <= low <= _MAX_LENGTH
                and count > 0
                and _bucket_bounds(_bucket(low))[0] == low
                and _bucket(low) not in hist._counts
            ):
                raise InvalidArgumentError(
                    f"{where}: state['buckets'][{pos}] must be a [bucket lowest length, "
                    f"count > 0] pair of ints (each bucket once), got {pair!r}"
                )
            index = _bucket(low)
            hist._counts[index] = count
            hist._blocks[index >> _BLOCK_BITS] += count
            hist._count += count
        total, low, high = state.get("total"), state.get("min"), state.get("max")
        if hist._count == 0:
            if not (_is_int(total) and total == 0 and low is None and high is None):
                raise InvalidArgumentError(
                    f"{where}: an empty state must have total 0 and min/max None, got "
                    f"({total!r}, {low!r}, {high!r}); pass LengthHistogram.state() output"
                )
            return hist
        if not (
            _is_int(total)
            and _is_int(low)
            and _is_int(high)
            and hist._count * low <= total <= hist._count * high
            and _bucket(low) == min(hist._counts)
            and _bucket(high) == max(hist._counts)
        ):
            raise InvalidArgumentError(
                f"{where}: state total/min/max ({total!r}, {low!r}, {high!r}) do not fit "
                f"its buckets; pass a state written by LengthHistogram.state()"
            )
        hist._total, hist._min, hist._max = total, low, high
        return hist

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LengthHistogram):
            return NotImplemented
        return self.state() == other.state()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"LengthHistogram(count={self._count}, total={self._total}, min={self.min}, "
            f"max={self.max}, buckets={len(self._counts)})"
        )


def _is_int(x: object) -> TypeGuard[int]:
    return type(x) is int
