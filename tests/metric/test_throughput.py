"""ThroughputMetric: rates are exact ratios of totals; splits and merges agree bit for bit."""

from __future__ import annotations

import math
import random
import struct
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from fractions import Fraction
from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.metric import THROUGHPUT_KEYS, Metric, ThroughputMetric

Call = tuple[Sequence[int], float, int | float]

lengths_st = st.lists(st.integers(0, 2**20), max_size=12)
seconds_st = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
devices_st = st.one_of(
    st.integers(1, 4096),
    st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False),
)
call_st = st.tuples(lengths_st, seconds_st, devices_st)
calls_st = st.lists(call_st, max_size=12)


def fed(calls: Sequence[Call]) -> ThroughputMetric:
    metric = ThroughputMetric()
    for lengths, seconds, devices in calls:
        metric.accumulate(lengths=lengths, seconds=seconds, devices=devices)
    return metric


def bits(figures: dict[str, int | float]) -> list[tuple[str, str, bytes]]:
    """A bit-exact view of calculate() output (nan == nan, 0.0 != -0.0)."""
    return [
        (k, type(v).__name__, struct.pack("<d", v) if isinstance(v, float) else str(v).encode())
        for k, v in figures.items()
    ]


def exact_ratio(numerator: Fraction, denominator: Fraction) -> float:
    if denominator == 0:
        return math.nan
    try:
        return float(numerator / denominator)
    except OverflowError:
        return math.inf


def reference(calls: Sequence[Call]) -> dict[str, int | float]:
    """calculate() computed the plain way: a sorted list and exact fractions."""
    samples = sorted(x for lengths, _, _ in calls for x in lengths)
    n, tokens = len(samples), sum(samples)
    seconds = sum((Fraction(s) for _, s, _ in calls), Fraction(0))
    device_seconds = sum((Fraction(s) * Fraction(d) for _, s, d in calls), Fraction(0))

    def rank(q: float) -> float:
        return float(samples[max(1, math.ceil(Fraction(q) * n)) - 1]) if n else math.nan

    return {
        "samples": n,
        "tokens": tokens,
        "seconds": float(seconds),
        "device_seconds": float(device_seconds),
        "tokens_per_s": exact_ratio(Fraction(tokens), seconds),
        "tokens_per_s_per_device": exact_ratio(Fraction(tokens), device_seconds),
        "length_mean": exact_ratio(Fraction(tokens), Fraction(n)),
        "length_min": float(samples[0]) if n else math.nan,
        "length_max": float(samples[-1]) if n else math.nan,
        "length_p50": rank(0.5),
        "length_p95": rank(0.95),
    }


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.lists(
                st.one_of(st.integers(0, 64), st.integers(0, 2**20), st.integers(0, 2**53 - 1)),
                max_size=40,
            ),
            seconds_st,
            devices_st,
        ),
        max_size=15,
    )
)
def test_every_output_equals_the_plain_reference_after_every_step(calls: list[Call]) -> None:
    # calculate() after each accumulate, as a training loop does: exact every time.
    metric = ThroughputMetric()
    for i, (lengths, seconds, devices) in enumerate(calls):
        metric.accumulate(lengths=lengths, seconds=seconds, devices=devices)
        assert bits(metric.calculate()) == bits(reference(calls[: i + 1]))


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.one_of(
        st.lists(st.integers(0, 3), max_size=20),
        st.lists(
            st.one_of(st.integers(0, 64), st.integers(0, 2**20), st.integers(0, 2**53 - 1)),
            max_size=40,
        ),
    ),
    seconds=seconds_st,
    devices=devices_st,
    as_tuple=st.booleans(),
)
def test_a_batch_calculated_at_once_equals_a_metric_fed_that_batch(
    lengths: list[int], seconds: float, devices: int | float, as_tuple: bool
) -> None:
    given_lengths: Sequence[int] = tuple(lengths) if as_tuple else lengths
    once = ThroughputMetric.calculate_batch(lengths=given_lengths, seconds=seconds, devices=devices)
    assert bits(once) == bits(fed([(lengths, seconds, devices)]).calculate())
    assert tuple(once) == THROUGHPUT_KEYS
    assert given_lengths == (tuple(lengths) if as_tuple else lengths)  # not sorted in place


@pytest.mark.parametrize(
    "lengths",
    [[], [0], [1, 0, 1], [7], range(3, 9), (5, 2, 2**53 - 1), [5, 3, 1]],
)
def test_a_batch_of_any_int_sequence_equals_a_metric_fed_it(lengths: Sequence[int]) -> None:
    once = ThroughputMetric.calculate_batch(lengths=lengths, seconds=0.5, devices=2.5)
    assert bits(once) == bits(fed([(list(lengths), 0.5, 2.5)]).calculate())


def test_window_throughput_is_ratio_of_totals_not_mean_of_step_rates() -> None:
    metric = ThroughputMetric()
    metric.accumulate(lengths=[40, 60], seconds=1.0, devices=2)  # 100 tok/s
    metric.accumulate(lengths=[100, 200], seconds=1.5, devices=4)  # 200 tok/s
    out = metric.calculate()
    assert out["tokens"] == 400
    assert out["seconds"] == 2.5
    assert out["device_seconds"] == 1.0 * 2 + 1.5 * 4
    assert out["tokens_per_s"] == 400 / 2.5  # 160, not the mean of rates (150)
    assert out["tokens_per_s_per_device"] == 400 / 8.0


def test_calculate_returns_every_key_with_units_in_order() -> None:
    metric = fed([([3, 5], 0.5, 1)])
    out = metric.calculate()
    assert tuple(out) == THROUGHPUT_KEYS
    assert type(out["samples"]) is int and type(out["tokens"]) is int
    assert all(type(out[k]) is float for k in THROUGHPUT_KEYS[2:])
    assert out == {
        "samples": 2,
        "tokens": 8,
        "seconds": 0.5,
        "device_seconds": 0.5,
        "tokens_per_s": 16.0,
        "tokens_per_s_per_device": 16.0,
        "length_mean": 4.0,
        "length_min": 3.0,
        "length_max": 5.0,
        "length_p50": 3.0,
        "length_p95": 5.0,
    }


def test_empty_metric_reports_nan_for_undefined_figures_and_keeps_every_key() -> None:
    out = ThroughputMetric().calculate()
    assert tuple(out) == THROUGHPUT_KEYS
    assert (out["samples"], out["tokens"], out["seconds"], out["device_seconds"]) == (0, 0, 0, 0)
    for key in THROUGHPUT_KEYS[4:]:
        assert math.isnan(out[key]), key


def test_zero_seconds_gives_nan_rates_but_keeps_counts() -> None:
    out = fed([([7, 9], 0.0, 8)]).calculate()
    assert out["tokens"] == 16 and out["samples"] == 2
    assert math.isnan(out["tokens_per_s"]) and math.isnan(out["tokens_per_s_per_device"])
    assert out["length_mean"] == 8.0


def test_seconds_without_samples_count_towards_the_window() -> None:
    metric = fed([([10, 30], 1.0, 1), ([], 1.0, 1)])
    out = metric.calculate()
    assert out["samples"] == 2 and out["seconds"] == 2.0
    assert out["tokens_per_s"] == 20.0


def test_rate_beyond_float_range_is_inf_not_an_error() -> None:
    out = fed([([2**53 - 1], 5e-324, 1)]).calculate()
    assert out["tokens_per_s"] == math.inf
    assert out["tokens_per_s_per_device"] == math.inf


def test_percentiles_are_nearest_rank() -> None:
    out = fed([(list(range(1, 101)), 1.0, 1)]).calculate()
    assert out["length_p50"] == 50.0
    assert out["length_p95"] == 95.0
    assert (out["length_min"], out["length_max"], out["length_mean"]) == (1.0, 100.0, 50.5)


def test_percentiles_of_long_samples_are_exact() -> None:
    # Above 4096 tokens version 1 reported a bucket midpoint; now the sample itself.
    lengths = [4097, 5000, 5001, 12_345, 32_767, 32_768, 100_003, 2**40 + 1]
    out = fed([(lengths, 1.0, 1)]).calculate()
    assert (out["length_p50"], out["length_p95"]) == (12_345.0, float(2**40 + 1))


def test_lengths_only_calls_then_a_seconds_only_call_give_the_window() -> None:
    # The throughput observer's pattern: lengths as they come (0 s on 1 device), merged
    # at the end into a metric given the window's seconds and devices.
    tag = ThroughputMetric()
    for lengths in ([100, 200], [300], []):
        tag.accumulate(lengths=lengths, seconds=0.0, devices=1)
    window = ThroughputMetric()
    window.merge(tag)
    window.accumulate(lengths=(), seconds=2.0, devices=8)
    assert bits(window.calculate()) == bits(fed([([100, 200, 300], 2.0, 8)]).calculate())


def test_calculate_does_not_reset() -> None:
    metric = fed([([1, 2, 3], 0.25, 2)])
    assert bits(metric.calculate()) == bits(metric.calculate())
    assert metric.calculate()["samples"] == 3


def test_reset_forgets_everything() -> None:
    metric = fed([([1, 2, 3], 0.25, 2)])
    metric.reset()
    assert metric == ThroughputMetric()
    assert bits(metric.calculate()) == bits(ThroughputMetric().calculate())


def test_seconds_and_devices_of_any_real_type_count_as_their_float() -> None:
    # a Fraction is no int | float to the checker: any real is the point
    assert fed([([1], 2, Fraction(5, 2))]) == fed([([1], 2.0, 2.5)])  # type: ignore[list-item]
    # An int device count beyond 2**53 is taken as its float, like every other real.
    assert fed([([1], 0.5, 2**60 + 1)]) == fed([([1], 0.5, float(2**60 + 1))])


def test_lengths_accept_any_int_sequence() -> None:
    a = fed([((4, 5, 6), 1.0, 1)])
    b = fed([(range(4, 7), 1.0, 1)])
    assert a == b


def test_throughput_metric_is_a_metric() -> None:
    assert isinstance(ThroughputMetric(), Metric)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.integers(0, 2**20), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    timing=st.lists(st.tuples(seconds_st, devices_st), min_size=9, max_size=9),
)
def test_window_is_exact_ratio_of_totals_for_any_split(
    samples: list[int], cuts: list[int], timing: list[tuple[float, int | float]]
) -> None:
    bounds = sorted({0, len(samples), *(c for c in cuts if c <= len(samples))})
    calls = [(samples[lo:hi], *timing[i]) for i, (lo, hi) in enumerate(pairwise(bounds))]
    out = fed(calls).calculate()
    tokens = sum(samples)
    seconds = sum((Fraction(s) for _, s, _ in calls), Fraction(0))
    device_seconds = sum((Fraction(s) * Fraction(d) for _, s, d in calls), Fraction(0))
    assert out["samples"] == len(samples)
    assert out["tokens"] == tokens
    # Exact: the correctly rounded value of the exact rational, whatever the split.
    assert bits({"x": out["seconds"]}) == bits({"x": float(seconds)})
    assert bits({"x": out["device_seconds"]}) == bits({"x": float(device_seconds)})
    assert bits({"x": out["tokens_per_s"]}) == bits({"x": exact_ratio(Fraction(tokens), seconds)})
    assert bits({"x": out["tokens_per_s_per_device"]}) == bits(
        {"x": exact_ratio(Fraction(tokens), device_seconds)}
    )


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.integers(0, 2**20), min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    ticks=st.lists(st.integers(0, 2**20), min_size=9, max_size=9),
    devices=devices_st,
)
def test_many_calls_equal_one_call_of_the_same_samples(
    samples: list[int], cuts: list[int], ticks: list[int], devices: int | float
) -> None:
    # Seconds are multiples of 2**-10 so the single call can be given their exact sum.
    bounds = sorted({0, len(samples), *(c for c in cuts if c <= len(samples))})
    calls = [
        (samples[lo:hi], ticks[i] / 1024, devices) for i, (lo, hi) in enumerate(pairwise(bounds))
    ]
    single = fed([(samples, sum(ticks[: len(calls)]) / 1024, devices)])
    assert bits(fed(calls).calculate()) == bits(single.calculate())


@settings(max_examples=100, deadline=None)
@given(calls=calls_st, seed=st.integers(0, 2**32))
def test_order_of_calls_does_not_change_a_single_bit(calls: list[Call], seed: int) -> None:
    shuffled = list(calls)
    random.Random(seed).shuffle(shuffled)
    assert bits(fed(calls).calculate()) == bits(fed(shuffled).calculate())
    assert fed(calls).state() == fed(shuffled).state()


@settings(max_examples=100, deadline=None)
@given(first=calls_st, second=calls_st)
def test_merge_equals_one_metric_fed_both_streams(first: list[Call], second: list[Call]) -> None:
    merged, other = fed(first), fed(second)
    other_before = other.state()
    merged.merge(other)
    both = fed(first + second)
    assert merged == both
    assert bits(merged.calculate()) == bits(both.calculate())
    assert other.state() == other_before


@settings(max_examples=50, deadline=None)
@given(calls=calls_st)
def test_state_round_trips_through_strict_json(calls: list[Call]) -> None:
    metric = fed(calls)
    restored = ThroughputMetric.from_state(orjson.loads(orjson.dumps(metric.state())))
    assert restored == metric
    assert bits(restored.calculate()) == bits(metric.calculate())


def test_partials_from_many_workers_reduce_to_the_whole() -> None:
    workers = [fed([([w, w + 1], 0.1 * (w + 1), 8)]) for w in range(4)]
    total = ThroughputMetric()
    for state in [w.state() for w in workers]:
        total.merge(ThroughputMetric.from_state(state))
    assert total == fed([([w, w + 1], 0.1 * (w + 1), 8) for w in range(4)])


GOOD = {"lengths": [1, 2], "seconds": 1.0, "devices": 1}

BAD_INPUTS = [
    ("lengths", "12"),
    ("lengths", 12),
    ("lengths", {1, 2}),
    ("lengths", (n for n in [1, 2])),
    ("lengths", [1, -2]),
    ("lengths", [1, 2.0]),
    ("lengths", [1, True]),
    ("lengths", [1, None]),
    ("lengths", [2**53]),
    ("seconds", math.nan),
    ("seconds", math.inf),
    ("seconds", -0.5),
    ("seconds", "1.0"),
    ("seconds", True),
    ("seconds", None),
    ("seconds", 10**400),
    ("devices", 0),
    ("devices", -1),
    ("devices", math.nan),
    ("devices", math.inf),
    ("devices", True),
    ("devices", "8"),
    ("devices", -0.0),
]


@pytest.mark.parametrize(("argument", "value"), BAD_INPUTS)
def test_bad_input_is_rejected_by_name_and_leaves_state_unchanged(
    argument: str, value: object
) -> None:
    metric = fed([([5, 6], 0.5, 2)])
    before = metric.state()
    with pytest.raises(InvalidArgumentError, match=argument) as info:
        # the bad value is the point
        metric.accumulate(**{**GOOD, argument: value})  # type: ignore[arg-type]
    assert "got" in str(info.value)
    assert metric.state() == before


@pytest.mark.parametrize(("argument", "value"), BAD_INPUTS)
def test_a_batch_with_bad_input_is_rejected_by_name(argument: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=argument) as info:
        # the bad value is the point
        ThroughputMetric.calculate_batch(**{**GOOD, argument: value})  # type: ignore[arg-type]
    assert str(info.value).startswith("ThroughputMetric.calculate_batch: ")
    assert "got" in str(info.value)


@pytest.mark.parametrize("lengths", [[True, 5], [5, False], [0, 1, True], [2, 3.0], [Fraction(3)]])
def test_a_batch_refuses_bools_and_non_int_lengths_next_to_valid_ones(
    lengths: list[object],
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"lengths\[\d\] must be an int"):
        # the bad lengths are the point
        ThroughputMetric.calculate_batch(lengths=lengths, seconds=1.0, devices=1)  # type: ignore[arg-type]


def test_merge_rejects_other_types() -> None:
    with pytest.raises(InvalidArgumentError, match="other"):
        # the wrong type is the point
        ThroughputMetric().merge({"seconds": "1"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(version=1),
        lambda s: s.update(version=3),
        lambda s: s.update(seconds="-1/2"),
        lambda s: s.update(seconds="1/3"),
        lambda s: s.update(seconds=f"1/{2**1075}"),
        lambda s: s.update(device_seconds=f"1/{2**2149}"),
        lambda s: s.update(seconds=0.5),
        lambda s: s.update(device_seconds="abc"),
        lambda s: s.update(lengths=None),
        lambda s: s["lengths"].update(total=-1),
    ],
)
def test_from_state_rejects_malformed_state(mutate: Callable[[dict[str, Any]], object]) -> None:
    state = fed([([5, 6], 0.5, 2)]).state()
    mutate(state)
    with pytest.raises(InvalidArgumentError, match="state"):
        ThroughputMetric.from_state(state)


def footprint(metric: ThroughputMetric) -> int:
    """Bytes held by the metric's state (the containers and every number in them)."""
    h = metric._lengths
    numbers = [metric._sec_num, metric._sec_exp, metric._dev_num, metric._dev_exp]
    numbers += [h._count, h._total, h._min, h._max]
    size = sum(sys.getsizeof(x) for x in numbers)
    size += sys.getsizeof(h._counts) + sum(
        sys.getsizeof(k) + sys.getsizeof(v) for k, v in h._counts.items()
    )
    size += sys.getsizeof(h._keys) + sum(map(sys.getsizeof, h._keys))
    size += sys.getsizeof(h._cursors) + sum(
        sys.getsizeof(q) + sys.getsizeof(c) + sum(map(sys.getsizeof, c))
        for q, c in h._cursors.items()
    )
    return size


def test_memory_does_not_grow_over_100k_accumulate_calls() -> None:
    # Per distinct length one count: after every distinct length of the run has been
    # seen, 99k more calls (with a calculate() each 100) add nothing but a few digits.
    pattern = [[(i * 7919) % 9000, (i * 104729) % (1 << 30)] for i in range(1000)]
    metric = ThroughputMetric()
    for lengths in pattern:  # every distinct length of the run is seen here
        metric.accumulate(lengths=lengths, seconds=0.001, devices=8)
    metric.calculate()
    after_1k = footprint(metric)
    for step in range(89_000):
        metric.accumulate(lengths=pattern[step % 1000], seconds=0.001, devices=8)
        if step % 100 == 0:
            metric.calculate()
    # The last 10k calls under tracemalloc: nothing outside the state grows either.
    tracemalloc.start()
    try:
        metric.calculate()
        before, _ = tracemalloc.get_traced_memory()
        for step in range(10_000):
            metric.accumulate(lengths=pattern[step % 1000], seconds=0.001, devices=8)
            if step % 100 == 0:
                metric.calculate()
        metric.calculate()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert metric.calculate()["samples"] == 200_000
    distinct = len({x for lengths in pattern for x in lengths})
    assert metric._lengths.distinct_count == distinct
    # The counts grew from 1-2 to 200-400 per length: ints of the same size, mostly.
    assert footprint(metric) - after_1k < 64 * 1024
    assert after - before < 16 * 1024
