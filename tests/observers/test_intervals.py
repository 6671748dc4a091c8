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


@settings(max_examples=300, deadline=None)
@given(a=intervals_st, b=intervals_st, cuts=st.lists(st.integers(-20, 60), max_size=6))
def test_subtract_takes_holes_that_touch(
    a: list[Interval], b: list[Interval], cuts: list[int]
) -> None:
    # Holes sorted and disjoint but cut where they touch (as the critical path keeps
    # what it covered): the same difference as the merged holes.
    holes = merge(b)
    for cut in cuts:
        holes = [
            part
            for s, e in holes
            for part in ((s, min(e, cut)), (max(s, cut), e))
            if part[0] < part[1]
        ]
    difference = subtract(merge(a), holes)
    assert points(difference) == points(a) - points(b)
    assert difference == merge(difference)


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


STREAMING = ObserverConfig.parse(
    {
        "phases": {"gen": ["gen"], "train": ["train.*"], "load": ["load"], "misc": ["misc"]},
        "streaming": {"generation": "gen", "training": "train", "publish": "load"},
    }
)
STREAMING_PHASE = {**PHASE, "misc": "misc"}


@settings(max_examples=400, deadline=None)
@given(
    bounds=st.tuples(st.integers(-20, 60), st.integers(0, 50)),
    spans=st.lists(
        st.tuples(
            st.sampled_from(sorted(STREAMING_PHASE)),
            st.integers(-20, 60),
            st.integers(0, 30),
            st.integers(1, 3),
        ),
        max_size=10,
    ),
    overhead=st.lists(
        st.tuples(st.integers(-20, 60), st.integers(0, 10), st.integers(1, 3)), max_size=6
    ),
)
def test_the_critical_path_takes_each_instant_from_the_first_that_runs(
    bounds: tuple[int, int],
    spans: list[tuple[str, int, int, int]],
    overhead: list[tuple[int, int, int]],
) -> None:
    lo, hi = bounds[0], bounds[0] + bounds[1]
    window = set(range(lo, hi))
    pieces = [(STREAMING_PHASE[name], s, s + d, tid) for name, s, d, tid in spans]
    over = [(s, s + d, tid) for s, d, tid in overhead]
    # a load on thread 2 is the engines' (an engine loading), else the trainer's
    loads = [(s, e, tid == 2) for name, s, e, tid in pieces if name == "load"]
    got = measure_window(lo, hi, pieces, over, STREAMING, publish=loads)
    phase: dict[str, set[int]] = {p: set() for p in STREAMING.phases}
    for name, start, end, _ in pieces:
        if name is not None:
            phase[name] |= points([(start, end)]) & window
    own = points([(s, e) for s, e, _ in over]) & window
    # The busier side first: the engines' generation and loads, or the trainer's
    # training and loads.
    engines = [("generation", phase["gen"]), ("publish", phase["load"])]
    trainer = [("training", phase["train"])]
    on = {
        side: points([(s, e) for s, e, o in loads if o == side]) & window for side in (True, False)
    }
    busier = len(phase["gen"] | on[True]) > len(phase["train"] | on[False])
    order = [*engines, *trainer] if busier else [*trainer, *reversed(engines)]
    order += [("other", phase["misc"]), ("overhead", own)]
    kind_at = {}
    for x in sorted(window):
        kind_at[x] = next((kind for kind, pts in order if x in pts), "idle")
    assert got.path_ns == {k: sum(v == k for v in kind_at.values()) for k in got.path_ns}
    assert sum(got.path_ns.values()) == hi - lo
    stretches = [(k, x, x + 1) for x, k in sorted(kind_at.items())]
    joined: list[tuple[str, int, int]] = []
    for kind, s, e in stretches:  # the reference's unit stretches, each kind's joined
        if joined and joined[-1][0] == kind and joined[-1][2] == s:
            joined[-1] = (kind, joined[-1][1], e)
        else:
            joined.append((kind, s, e))
    assert [(k, s, e) for k, s, e in _joined(got.path_slices)] == joined
    assert got.busy_ns == len(set().union(*phase.values()))
    assert got.sides_ns == {
        "trainer": len(phase["train"] | on[False]),
        "engines": len(phase["gen"] | on[True]),
        "trainer_publish": len(on[False]),
        "engines_publish": len(on[True]),
    }
    assert got.overhead_ns == len(own)


def _joined(slices: tuple[tuple[str, int, int], ...]) -> list[tuple[str, int, int]]:
    """Stretches in time order, one kind's touching ones joined (the path may cut a
    kind's stretch where another part's ended)."""
    out: list[tuple[str, int, int]] = []
    for kind, s, e in slices:
        assert not out or out[-1][2] <= s  # in time order, disjoint
        if out and out[-1][0] == kind and out[-1][2] == s:
            out[-1] = (kind, out[-1][1], e)
        else:
            out.append((kind, s, e))
    return out


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
