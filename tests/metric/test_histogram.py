"""LengthHistogram: exact counts per distinct length, exact nearest-rank quantiles."""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.metric import LengthHistogram

MAX = LengthHistogram.MAX_LENGTH

# Lengths of every size, with enough repeats for ties and walks between distinct lengths.
length_st = st.one_of(st.integers(0, 40), st.integers(0, 5000), st.integers(0, MAX))
lengths_st = st.lists(length_st, max_size=40)
q_st = st.one_of(st.sampled_from([0.0, 0.5, 0.95, 1.0]), st.floats(0, 1))


def hist(lengths: Sequence[int]) -> LengthHistogram:
    h = LengthHistogram()
    h.add(lengths)
    return h


def nearest_rank(values: list[int], q: float) -> float:
    """The textbook definition on the sorted samples (q taken as its exact rational value)."""
    if not values:
        return math.nan
    return float(sorted(values)[max(1, math.ceil(Fraction(q) * len(values))) - 1])


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(length_st, min_size=1, max_size=60), q=q_st)
def test_quantile_is_the_exact_nearest_rank_sample(values: list[int], q: float) -> None:
    assert hist(values).quantile(q) == nearest_rank(values, q)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), lengths_st),
            st.tuples(st.just("quantile"), st.lists(q_st, min_size=1, max_size=3)),
            st.tuples(st.just("merge"), lengths_st),
        ),
        max_size=25,
    )
)
def test_quantiles_stay_exact_between_adds_merges_and_queries(
    ops: list[tuple[str, list[Any]]],  # lengths to add or merge, or qs to ask
) -> None:
    # Queries leave cursors behind that later adds and merges must keep exact.
    h, seen = LengthHistogram(), list[int]()
    for op, arg in ops:
        if op == "add":
            h.add(arg)
            seen += arg
        elif op == "merge":
            h.merge(hist(arg))
            seen += arg
        else:
            for q in arg:
                assert same(h.quantile(q), nearest_rank(seen, q)), (q, seen)
        assert (h.count, h.total, h.min, h.max) == (
            len(seen),
            sum(seen),
            min(seen, default=None),
            max(seen, default=None),
        )
        assert h.distinct_count == len(set(seen))


def test_quantile_follows_a_distribution_that_drifts_far_between_queries() -> None:
    # Long walks up and down (past the cursor's short walk) and many distinct q.
    rng = random.Random(7)
    h, seen = LengthHistogram(), []
    qs = [0.5, 0.95, 0.1, 0.25, 0.75, 0.9, 0.99, 0.01, 0.333, 0.666]
    for step in range(120):
        centre = 10 + 400 * (step % 40 < 20) + 4 * step
        batch = [max(0, int(rng.gauss(centre, 30))) for _ in range(rng.randrange(0, 80))]
        h.add(batch)
        seen += batch
        for q in qs[: 2 + step % len(qs)]:
            assert same(h.quantile(q), nearest_rank(seen, q)), (step, q)


def test_small_lengths_have_exact_nearest_rank_percentiles() -> None:
    h = hist(list(range(1, 101)))
    assert h.quantile(0.5) == 50.0
    assert h.quantile(0.95) == 95.0
    assert h.quantile(0.951) == 96.0
    assert h.quantile(0.0) == 1.0
    assert h.quantile(1.0) == 100.0


def test_large_lengths_are_exact_too() -> None:
    # Version 1 reported bucket midpoints above 4096 tokens; now every length is exact.
    h = hist([5000, 123_457, 99_999_999, 2**52 + 1, MAX])
    assert [h.quantile(q) for q in (0, 0.1, 0.3, 0.5, 0.7, 0.9, 1)] == [
        5000.0,
        5000.0,
        123_457.0,
        99_999_999.0,
        float(2**52 + 1),
        float(MAX),
        float(MAX),
    ]
    # 0.2 is a little above 1/5, so its rank is ceil(5 * 0.2000000000000000111) = 2.
    assert h.quantile(0.2) == 123_457.0


def test_empty_histogram_quantile_is_nan() -> None:
    h = LengthHistogram()
    assert math.isnan(h.quantile(0.5))
    assert (h.count, h.total, h.min, h.max, h.distinct_count) == (0, 0, None, None, 0)


def test_totals_are_exact() -> None:
    h = hist([3, 2**40, 7])
    assert (h.count, h.total, h.min, h.max) == (3, 2**40 + 10, 3, 2**40)


def test_memory_grows_with_distinct_lengths_not_with_samples() -> None:
    h = LengthHistogram()
    rng = random.Random(0)
    for _ in range(300):
        h.add([rng.randrange(1000) for _ in range(500)])
        h.quantile(0.5)
    assert h.count == 150_000
    assert h.distinct_count == len(h._counts) == 1000
    # The sorted lengths: the main list and the few not merged into it yet.
    assert len(h._keys) <= 1000 and len(h._fresh) <= 64 + 8 * math.isqrt(1000)
    assert len(h._cursors) == 1


def test_cursors_are_bounded_however_many_quantiles_are_asked() -> None:
    h = hist(list(range(1000)))
    for i in range(1, 1000):
        assert h.quantile(i / 1000) == nearest_rank(list(range(1000)), i / 1000)
    assert len(h._cursors) <= 8


@settings(max_examples=100, deadline=None)
@given(first=lengths_st, second=lengths_st)
def test_merge_equals_one_histogram_fed_both(first: list[int], second: list[int]) -> None:
    merged, other = hist(first), hist(second)
    merged.merge(other)
    both = hist(first + second)
    assert merged == both
    assert merged.state() == both.state()
    assert other == hist(second)
    for q in (0, 0.5, 0.95, 1):
        assert same(merged.quantile(q), both.quantile(q))


@settings(max_examples=100, deadline=None)
@given(values=lengths_st, seed=st.integers(0, 2**32))
def test_order_of_samples_does_not_matter(values: list[int], seed: int) -> None:
    shuffled = list(values)
    random.Random(seed).shuffle(shuffled)
    assert hist(values).state() == hist(shuffled).state()


@settings(max_examples=100, deadline=None)
@given(values=lengths_st)
def test_state_round_trips_through_strict_json(values: list[int]) -> None:
    h = hist(values)
    restored = LengthHistogram.from_state(orjson.loads(orjson.dumps(h.state())))
    assert restored == h
    assert restored.state() == h.state()
    for q in (0, 0.5, 0.95, 1):
        assert same(restored.quantile(q), h.quantile(q))


def test_state_lists_exact_counts_in_ascending_order() -> None:
    assert hist([7, 3, 7, 2**40]).state() == {
        "version": 2,
        "total": 2**40 + 17,
        "min": 3,
        "max": 2**40,
        "counts": [[3, 1], [7, 2], [2**40, 1]],
    }


def test_reset_forgets_everything() -> None:
    h = hist([1, 5000, 2**40])
    h.quantile(0.5)
    h.reset()
    assert h == LengthHistogram()
    h.add([7])
    assert h.quantile(0.5) == 7.0


class Tokens(enum.IntEnum):
    SHORT = 4
    LONG = 6000


def test_integral_lengths_are_stored_as_plain_ints() -> None:
    h = hist([Tokens.SHORT, Tokens.LONG, 4])
    h.add((Tokens.SHORT,))
    h.add(range(3, 5))
    assert h.state()["counts"] == [[3, 1], [4, 4], [6000, 1]]
    assert all(type(k) is int for k in h._counts)
    assert type(h.min) is int and type(h.max) is int


@pytest.mark.parametrize("q", [-0.1, 1.5, math.nan, "0.5", None, True])
def test_quantile_rejects_q_outside_unit_interval(q: object) -> None:
    with pytest.raises(InvalidArgumentError, match="q must be"):
        hist([1, 2]).quantile(q)  # type: ignore[arg-type]  # the bad q is the point


class Unhashable(int):
    __hash__ = None  # type: ignore[assignment]


class Sneaky:
    """Sums like a length (``4 + Sneaky() == 9``) but is no int and cannot be hashed."""

    __hash__ = None  # type: ignore[assignment]

    def __radd__(self, other: int) -> int:
        return other + 5


def test_a_counting_pass_that_fails_half_way_is_undone() -> None:
    # The fast pass counts 4 and 5, then fails on the unhashable int subclass; the slow
    # path then accepts it (it is an Integral length) as a plain int.
    h = hist([4])
    h.quantile(0.5)
    h.add([4, 5, Unhashable(6), 7])
    assert h == hist([4, 4, 5, 6, 7])
    assert h.quantile(0.5) == 5.0


BAD_LENGTHS = [
    [1, -1],
    [1.5],
    [4, 2.0],  # 2.0 == 2 would hide behind a held 2
    [False],
    [True],
    [1, True],  # True == 1 hides behind the 1 counted just before it
    [5, True],  # ... and behind a 1 held already
    [0, False],
    "12",
    [MAX + 1],
    [4, 2**70],
    [4, None],
    [4, "5"],
    [4, 5, Sneaky()],
    (4, 5, -(2**80)),
]


@pytest.mark.parametrize("held", [[4, 5], [0, 1, 2, 4, 5]])
@pytest.mark.parametrize("lengths", BAD_LENGTHS)
def test_add_rejects_bad_lengths_and_keeps_state(held: list[int], lengths: object) -> None:
    h = hist(held)
    h.quantile(0.5)
    before = h.state()
    with pytest.raises(InvalidArgumentError, match=r"lengths(\[\d+\])? must be") as info:
        h.add(lengths)  # type: ignore[arg-type]  # the bad lengths are the point
    assert "got" in str(info.value)
    assert h.state() == before
    assert list(h._counts) == sorted(h._counts)  # the undo left no trace, not even order
    h.add([2, 4])
    assert h == hist([*held, 2, 4])
    assert h.quantile(0.5) == nearest_rank([*held, 2, 4], 0.5)


def test_error_names_the_first_bad_length() -> None:
    with pytest.raises(InvalidArgumentError, match=r"lengths\[2\] must be an int token count"):
        hist([1]).add([3, 4, True, 5.0])  # type: ignore[list-item]  # the 5.0 is the point
    with pytest.raises(InvalidArgumentError, match=r"lengths\[1\] must be a token count in"):
        hist([1]).add([3, -4, 2**60])


def test_merge_rejects_other_types() -> None:
    with pytest.raises(InvalidArgumentError, match="other"):
        LengthHistogram().merge([1, 2])  # type: ignore[arg-type]  # the wrong type is the point


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(version=1),
        lambda s: s.update(version=True),
        lambda s: s.update(counts="1,2"),
        lambda s: s["counts"].append([3, 1]),  # length listed twice
        lambda s: s["counts"].append([9, 0]),  # empty count
        lambda s: s["counts"].append([MAX + 1, 1]),
        lambda s: s["counts"].append([9.0, 1]),
        lambda s: s["counts"].append([9, True]),
        lambda s: s.update(total=1),
        lambda s: s.update(min=100),
        lambda s: s.update(max=None),
        lambda s: s.update(max=float(2**33)),
    ],
)
def test_from_state_rejects_malformed_state(mutate: Callable[[dict[str, Any]], object]) -> None:
    state = hist([3, 5000, 2**33]).state()
    mutate(state)
    with pytest.raises(InvalidArgumentError, match="state"):
        LengthHistogram.from_state(state)
