"""Interval arithmetic on the run's timeline: half-open ``[start_ns, end_ns)`` pairs.

Written by hand (a union, an intersection and a difference of sorted lists): the interval
libraries on the index (portion, intervaltree) are object-heavy and slower for the few
hundred intervals a window holds, and none measures in integer nanoseconds exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Interval", "clip", "intersect", "length", "merge", "subtract", "union_ns"]

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals (touching ones joined, empty ones dropped)."""
    out: list[Interval] = []
    ordered = iter(sorted(intervals))
    for lo, hi in ordered:  # the first non-empty one
        if hi > lo:
            break
    else:
        return out
    for start, end in ordered:
        if start > hi:
            if end <= start:  # empty (one that starts within the current one adds nothing)
                continue
            out.append((lo, hi))
            lo, hi = start, end
        elif end > hi:
            hi = end
    out.append((lo, hi))
    return out


def length(merged: Iterable[Interval]) -> int:
    """Total length of disjoint intervals (a merged list, see :func:`merge`)."""
    return sum([end - start for start, end in merged])


def union_ns(intervals: Iterable[Interval]) -> int:
    """Length of the union (overlaps counted once)."""
    return length(merge(intervals))


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of ``intervals`` inside ``[lo, hi)``."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a ∩ b`` of two merged lists (see :func:`merge`), merged."""
    out: list[Interval] = []
    if not a or not b:
        return out
    rest_a, rest_b = iter(a), iter(b)
    s1, e1 = next(rest_a)
    s2, e2 = next(rest_b)
    try:
        while True:  # the interval that ends first is done with
            if e1 < e2:
                if s2 < e1:
                    out.append((s1 if s1 > s2 else s2, e1))
                s1, e1 = next(rest_a)
            else:
                if s1 < e2:
                    out.append((s1 if s1 > s2 else s2, e2))
                s2, e2 = next(rest_b)
    except StopIteration:
        return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` less ``b``: ``a`` merged (see :func:`merge`), ``b`` sorted and disjoint
    (touching intervals may stay apart); merged."""
    out: list[Interval] = []
    holes = iter(b)
    hs, he = next(holes, _PAST)
    for start, end in a:
        cur = start
        while he <= cur:  # holes that end before the rest of ``a`` begins
            hs, he = next(holes, _PAST)
        while hs < end:
            if hs > cur:
                out.append((cur, hs))
            if he >= end:  # it covers the rest (and maybe some of the next interval)
                cur = end
                break
            cur = he
            hs, he = next(holes, _PAST)
        if cur < end:
            out.append((cur, end))
    return out


#: after every hole: beyond any nanosecond (an int, as the intervals' bounds are)
_PAST: Interval = (1 << 256, 1 << 256)
