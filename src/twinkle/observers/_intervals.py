"""Interval arithmetic on the run's timeline: half-open ``[start_ns, end_ns)`` pairs.

Written by hand (a union, an intersection and a difference of sorted lists): the interval
libraries on the index (portion, intervaltree) are object-heavy and slower for the few
hundred intervals a window holds, and none measures in integer nanoseconds exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Interval", "clip", "intersect", "merge", "subtract", "union_ns"]

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals (touching ones joined, empty ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def union_ns(intervals: Iterable[Interval]) -> int:
    """Length of the union (overlaps counted once)."""
    return sum(end - start for start, end in merge(intervals))


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


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The parts of ``union(a)`` outside ``union(b)``, merged."""
    out: list[Interval] = []
    holes = merge(b)
    j = 0
    for start, end in merge(a):
        cur = start
        while j < len(holes) and holes[j][1] <= cur:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] < end:
            hs, he = holes[k]
            if hs > cur:
                out.append((cur, hs))
            cur = max(cur, he)
            if cur >= end:
                break
            k += 1
        if cur < end:
            out.append((cur, end))
    return out
