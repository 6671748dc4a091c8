"""LengthHistogram: exact small lengths, bounded log buckets above, nearest-rank quantiles."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.metric import LengthHistogram
from twinkle.metric.histogram import _bucket, _bucket_bounds

MAX = LengthHistogram.MAX_LENGTH


def hist(lengths) -> LengthHistogram:
    h = LengthHistogram()
    h.add(lengths)
    return h


def nearest_rank(values: list[int], q: float) -> int:
    """The textbook definition on the sorted samples (q taken as its exact rational value)."""
    return sorted(values)[max(1, math.ceil(Fraction(q) * len(values))) - 1]


def test_relative_error_bound_is_within_half_a_percent():
    assert LengthHistogram.RELATIVE_ERROR <= 0.005


@given(st.integers(0, MAX))
def test_every_length_falls_in_a_bucket_that_contains_it(v):
    low, high = _bucket_bounds(_bucket(v))
    assert hist([v, v]).state()["buckets"] == [[low, 2]]
    assert low <= v <= high
    if v < LengthHistogram.EXACT_BELOW:
        assert low == high == v
    else:
        assert (high - low) / 2 <= LengthHistogram.RELATIVE_ERROR * low


def test_buckets_are_contiguous_and_ordered_across_octave_edges():
    for e in range(12, 53):
        for v in (2**e - 1, 2**e, 2**e + 1):
            assert _bucket_bounds(_bucket(v))[0] <= v
        assert _bucket(2**e) == _bucket(2**e - 1) + 1
        assert _bucket_bounds(_bucket(2**e))[0] == 2**e
    assert _bucket(MAX) == LengthHistogram.MAX_BUCKETS - 1


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.integers(0, 5000), st.integers(0, 2**40), st.integers(0, MAX)),
        min_size=1,
        max_size=60,
    ),
    q=st.floats(0, 1),
)
def test_quantile_is_within_stated_error_of_exact_nearest_rank(values, q):
    exact = nearest_rank(values, q)
    got = hist(values).quantile(q)
    assert abs(got - exact) <= LengthHistogram.RELATIVE_ERROR * exact
    if exact < LengthHistogram.EXACT_BELOW:
        assert got == exact


def test_small_lengths_have_exact_nearest_rank_percentiles():
    h = hist(list(range(1, 101)))
    assert h.quantile(0.5) == 50.0
    assert h.quantile(0.95) == 95.0
    assert h.quantile(0.951) == 96.0
    assert h.quantile(0.0) == 1.0
    assert h.quantile(1.0) == 100.0


def test_extreme_quantiles_are_the_observed_min_and_max():
    h = hist([5000, 123_457, 99_999_999])
    assert h.quantile(0) == 5000.0
    assert h.quantile(1) == 99_999_999.0


def test_empty_histogram_quantile_is_nan():
    h = LengthHistogram()
    assert math.isnan(h.quantile(0.5))
    assert (h.count, h.total, h.min, h.max) == (0, 0, None, None)


def test_totals_are_exact():
    h = hist([3, 2**40, 7])
    assert (h.count, h.total, h.min, h.max) == (3, 2**40 + 10, 3, 2**40)


def test_bucket_count_is_bounded_however_many_samples():
    h = LengthHistogram()
    rng = random.Random(0)
    for _ in range(200):
        h.add([rng.randrange(MAX + 1) >> rng.randrange(53) for _ in range(500)])
    h.add(list(range(LengthHistogram.EXACT_BELOW)))
    h.add([2**e + k * 2 ** (e - 7) for e in range(12, 53) for k in range(128)])
    assert h.bucket_count == LengthHistogram.MAX_BUCKETS
    h.add([rng.randrange(MAX + 1) for _ in range(100_000)])
    assert h.bucket_count == LengthHistogram.MAX_BUCKETS
    assert h.count == 200 * 500 + LengthHistogram.EXACT_BELOW + 41 * 128 + 100_000


@settings(max_examples=100, deadline=None)
@given(
    first=st.lists(st.integers(0, 2**30), max_size=30),
    second=st.lists(st.integers(0, 2**30), max_size=30),
)
def test_merge_equals_one_histogram_fed_both(first, second):
    merged, other = hist(first), hist(second)
    merged.merge(other)
    both = hist(first + second)
    assert merged == both
    assert other == hist(second)
    for q in (0, 0.5, 0.95, 1):
        assert merged.quantile(q) == both.quantile(q) or math.isnan(both.quantile(q))


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(0, 2**30), max_size=40), seed=st.integers(0, 2**32))
def test_order_of_samples_does_not_matter(values, seed):
    shuffled = list(values)
    random.Random(seed).shuffle(shuffled)
    assert hist(values).state() == hist(shuffled).state()


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(0, MAX), max_size=40))
def test_state_round_trips_through_strict_json(values):
    h = hist(values)
    restored = LengthHistogram.from_state(orjson.loads(orjson.dumps(h.state())))
    assert restored == h
    assert restored.quantile(0.5) == h.quantile(0.5) or not values


def test_reset_forgets_everything():
    h = hist([1, 5000, 2**40])
    h.reset()
    assert h == LengthHistogram()
    h.add([7])
    assert h.quantile(0.5) == 7.0


@pytest.mark.parametrize("q", [-0.1, 1.5, math.nan, "0.5", None, True])
def test_quantile_rejects_q_outside_unit_interval(q):
    with pytest.raises(InvalidArgumentError, match="q must be"):
        hist([1, 2]).quantile(q)


@pytest.mark.parametrize("lengths", [[1, -1], [1.5], [False], "12", [MAX + 1]])
def test_add_rejects_bad_lengths_and_keeps_state(lengths):
    h = hist([4, 5])
    before = h.state()
    with pytest.raises(InvalidArgumentError, match="lengths"):
        h.add(lengths)
    assert h.state() == before


def test_merge_rejects_other_types():
    with pytest.raises(InvalidArgumentError, match="other"):
        LengthHistogram().merge([1, 2])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(version=99),
        lambda s: s.update(exact_below=1024),
        lambda s: s.update(buckets="1,2"),
        lambda s: s["buckets"].append([4097, 1]),  # not a bucket's lowest length
        lambda s: s["buckets"].append([3, 1]),  # bucket listed twice
        lambda s: s["buckets"].append([9, 0]),  # empty bucket
        lambda s: s.update(total=1),
        lambda s: s.update(min=100),
        lambda s: s.update(max=None),
    ],
)
def test_from_state_rejects_malformed_state(mutate):
    state = hist([3, 5000, 2**33]).state()
    mutate(state)
    with pytest.raises(InvalidArgumentError, match="state"):
        LengthHistogram.from_state(state)
