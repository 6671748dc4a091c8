"""Interval arithmetic and the window measurements built on it, against point sets.

Every interval lies on a small integer grid, so a set of its points is an exact
reference: a union is a set union, an overlap a set intersection, a length a set size.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.observers import ObserverConfig
from twinkle.observers._intervals import Interval, intersect, length, merge, subtract, union_ns
from twinkle.observers._measure import IterationData, measure_window

interval_st = st.tuples(st.integers(-20, 60), st.integers(-20, 60))
intervals_st = st.lists(interval_st, max_size=12)

CONFIG = ObserverConfig.parse(
    {"phases": {"gen": ["gen"], "train": ["train.*"], "load": ["load"]}, "finalise_lag": 1}
)
PHASE: dict[str, str | None] = {"gen": "gen", "train.fwd": "train", "load": "load", "other": None}
span_st = st.tuples(
    st.sampled_from(sorted(PHASE)), st.integers(-20, 60), st.integers(0, 30), st.integers(1, 3)
)


def points(intervals: list[Interval]) -> set[int]:
    return {x for s, e in intervals for x in range(s, e)}


@settings(max_examples=300, deadline=None)
@given(intervals=intervals_st)
def test_merge_gives_sorted_disjoint_intervals_covering_the_same_points(
    intervals: list[Interval],
) -> None:
    merged = merge(intervals)
    assert points(merged) == points(intervals)
    assert all(s < e for s, e in merged)
    assert all(a[1] < b[0] for a, b in pairwise(merged))  # disjoint, apart
    assert length(merged) == union_ns(intervals) == len(points(intervals))


@settings(max_examples=300, deadline=None)
@given(a=intervals_st, b=intervals_st)
def test_subtract_and_intersect_of_merged_lists_are_the_set_operations(
    a: list[Interval], b: list[Interval]
) -> None:
    ma, mb = merge(a), merge(b)
    difference = subtract(ma, mb)
    assert points(difference) == points(a) - points(b)
    assert difference == merge(difference)
    both = intersect(ma, mb)
    assert points(both) == points(a) & points(b)
    assert both == merge(both)


def reference_window(
    lo: int,
    hi: int,
    spans: list[tuple[str, int, int, int]],
    overhead: list[tuple[int, int, int]],
) -> dict[str, Any]:
    """The window's figures as set operations on the points of ``[lo, hi)``."""
    window = set(range(lo, hi))
    over = {tid: points([(s, e) for s, e, t in overhead if t == tid]) & window for tid in (1, 2, 3)}
    phase: dict[str, set[int]] = {p: set() for p in CONFIG.phases}
    logical: dict[str, set[int]] = {p: set() for p in CONFIG.phases}
    span_ns = 0
    for name, start, end, tid in spans:
        pts = points([(start, end)]) & window
        span_ns += len(pts)
        in_phase = PHASE[name]
        if in_phase is not None:
            phase[in_phase] |= pts
            logical[in_phase] |= pts - over[tid]
    return {
        "overhead": len(set().union(*over.values())),
        "busy": len(set().union(*phase.values())),
        "span": span_ns,
        "phase": {p: len(v) for p, v in phase.items()},
        "logical": {p: len(v) for p, v in logical.items()},
        "overlap": {(p, q): len(phase[p] & phase[q]) for p, q in CONFIG.pairs},
    }


@settings(max_examples=300, deadline=None)
@given(
    bounds=st.tuples(st.integers(-20, 60), st.integers(0, 50)),
    spans=st.lists(span_st, max_size=10),
    overhead=st.lists(
        st.tuples(st.integers(-20, 60), st.integers(0, 10), st.integers(1, 3)), max_size=10
    ),
)
def test_a_window_measures_unions_overlaps_and_logical_time_of_its_points(
    bounds: tuple[int, int],
    spans: list[tuple[str, int, int, int]],
    overhead: list[tuple[int, int, int]],
) -> None:
    lo, hi = bounds[0], bounds[0] + bounds[1]
    pieces = [(PHASE[name], s, s + d, tid) for name, s, d, tid in spans]
    over = [(s, s + d, tid) for s, d, tid in overhead]
    got = measure_window(lo, hi, pieces, over, CONFIG)
    want = reference_window(lo, hi, [(n, s, s + d, t) for n, s, d, t in spans], over)
    assert got.wall_ns == hi - lo
    assert (got.overhead_ns, got.busy_ns, got.span_ns) == (
        want["overhead"],
        want["busy"],
        want["span"],
    )
    assert got.phase_ns == want["phase"]
    assert got.phase_logical_ns == want["logical"]
    assert got.overlap_ns == want["overlap"]
    assert list(got.phase_ns) == list(CONFIG.phases)  # every phase, in config order


@settings(max_examples=300, deadline=None)
@given(
    spans=st.lists(span_st, max_size=10),
    overhead=st.lists(
        st.tuples(st.integers(-20, 60), st.integers(0, 10), st.integers(1, 3)), max_size=10
    ),
)
def test_the_attributed_view_keeps_spans_whole_and_deducts_overhead_per_thread(
    spans: list[tuple[str, int, int, int]], overhead: list[tuple[int, int, int]]
) -> None:
    data = IterationData(0)
    data.spans = [(PHASE[n], s, s + d, None, tid, True) for n, s, d, tid in spans]
    over = [(s, s + d, tid) for s, d, tid in overhead]
    got = data.attributed(CONFIG, over)
    # Whole spans: a window wide enough to hold every one gives the same unions.
    wide = reference_window(-100, 200, [(n, s, s + d, t) for n, s, d, t in spans], over)
    assert got.phase_union_ns == wide["phase"]
    assert got.phase_logical_ns == wide["logical"]
    assert got.phase_spans == {p: sum(PHASE[n] == p for n, *_ in spans) for p in CONFIG.phases}
    assert got.phase_sum_ns == {
        p: sum(d for n, _, d, _ in spans if PHASE[n] == p) for p in CONFIG.phases
    }
    assert (got.spans, got.span_ns, got.errors) == (len(spans), sum(d for *_, d, _ in spans), 0)
