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
    lo = hi = 0
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if not out:
            lo, hi = start, end
            out.append((lo, hi))
        elif start <= hi:
            if end > hi:
                hi = end
                out[-1] = (lo, hi)
        else:
            lo, hi = start, end
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
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` less ``b``, of two merged lists (see :func:`merge`), merged."""
    out: list[Interval] = []
    j = 0
    n = len(b)
    for start, end in a:
        cur = start
        while j < n and b[j][1] <= cur:
            j += 1
        k = j
        while k < n and b[k][0] < end:
            hs, he = b[k]
            if hs > cur:
                out.append((cur, hs))
            cur = he  # > cur: the skip above, and disjoint holes
            if cur >= end:
                break
            k += 1
        if cur < end:
            out.append((cur, end))
    return out
