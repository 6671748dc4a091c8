"""Window throughput as a ratio of totals: ``Σtokens / Σseconds`` and ``Σtokens / Σdevice-seconds``.

The caller defines every term: which samples and tokens count (``lengths``), which
seconds they took (a phase duration it measured), and the physical device budget of
that phase (``devices``). The metric only keeps totals; it never averages per-step
rates, reads no clock and waits for nothing.

Exact, order-free sums. Every finite double is ``n / 2**k`` for integers ``n`` and
``0 <= k <= 1074``, and the product of two doubles ``n / 2**k`` with ``k <= 2148``. The
metric keeps ``Σseconds`` and ``Σ(seconds * devices)`` exactly as such a pair (``k`` the
largest seen so far, so ``n`` stays a small integer), and every output float is the
correctly rounded value of an exact rational (CPython's ``int / int`` rounds correctly).
So the figures depend only on the multiset of accumulated observations: any split of
the same calls into ``accumulate``/``merge`` calls, in any order, on any machine, gives
bit-identical ``calculate()`` output — which the event-log replay relies on to reproduce
records byte for byte. A float running sum would instead drift by an ulp with the order
of additions, and integer nanoseconds would round away what the caller passed. Memory
stays O(1) in the number of calls for the sums (their integers gain a bit each time the
total doubles) and O(distinct lengths) for the length distribution
(:class:`~twinkle.metric.LengthHistogram`).

The figures of a single batch (one iteration's samples) need no metric:
:meth:`ThroughputMetric.calculate_batch` gives the same bits from one sort of the
lengths, through the same formulas, for a fraction of the cost of filling a histogram.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final, final

from twinkle.checks import plain_number, short_repr
from twinkle.errors import InvalidArgumentError
from twinkle.metric._lengths import exact_fraction, nearest_rank, sorted_lengths
from twinkle.metric.histogram import LengthHistogram

__all__ = ["THROUGHPUT_KEYS", "ThroughputMetric"]

THROUGHPUT_KEYS: Final[tuple[str, ...]] = (
    "samples",
    "tokens",
    "seconds",
    "device_seconds",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "length_mean",
    "length_min",
    "length_max",
    "length_p50",
    "length_p95",
)
"""Keys of :meth:`ThroughputMetric.calculate`, in order (``samples``/``tokens`` are int)."""

_SECONDS_MAX_EXP: Final = 1074  # a sum of doubles is n / 2**k with k <= 1074
_DEVICE_SECONDS_MAX_EXP: Final = 2 * 1074  # a sum of products of two: k <= 2148
_STATE_VERSION: Final = 2  # 1 held LengthHistogram version 1 (approximate buckets)
_EXACT_INT_DEVICES: Final = 1 << 53  # a larger int device count is rounded as a float
_INF: Final = math.inf
# Nearest-rank p50 and p95 at the exact values of the floats 0.5 and 0.95, as
# LengthHistogram.quantile(0.5) and quantile(0.95) take them.
_P50: Final = exact_fraction(0.5)
_P95: Final = exact_fraction(0.95)
_QUANTILES: Final = (_P50, _P95)


def _dyadic_add(num: int, exp: int, n: int, k: int) -> tuple[int, int]:
    """``num / 2**exp + n / 2**k`` as ``(numerator, max(exp, k))``, exactly."""
    if k > exp:
        return (num << (k - exp)) + n, k
    return num + (n << (exp - k)), exp


def _ratio(numerator: int, denominator: int) -> float:
    """Correctly rounded ``numerator / denominator``; ``nan`` when undefined (``/ 0``)."""
    if denominator == 0:
        return math.nan
    try:
        return numerator / denominator
    except OverflowError:  # beyond the float range
        return math.inf


def _check_real(name: str, value: object, *, positive: bool, fix: str, where: str) -> float:
    value = plain_number(value)  # a 0-d tensor or array: its plain number
    x = math.nan
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            x = float(value)
        except (OverflowError, ValueError):
            x = math.nan
    if not (math.isfinite(x) and (x > 0 or (x == 0 and not positive))):
        bound = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(
            f"{where}: {name} must be a finite number {bound}, got {value!r}; {fix}"
        )
    return x


def _exact_times(seconds: float, devices: int | float, where: str) -> tuple[int, int, int, int]:
    """``seconds`` and ``seconds * devices`` exactly, as ``(s_num, s_exp, d_num, d_exp)``
    with ``seconds == s_num / 2**s_exp`` and ``seconds * devices == d_num / 2**d_exp``;
    both validated (``where`` names the caller in the error)."""
    # Fast paths for the plain float / int the callers pass; anything else (and every
    # bad value) goes through _check_real, which names the argument.
    if not (type(seconds) is float and 0.0 <= seconds < _INF):
        seconds = _check_real(
            "seconds",
            seconds,
            positive=False,
            fix="pass the phase duration in seconds, e.g. duration_ns / 1e9",
            where=where,
        )
    if type(devices) is int and 0 < devices <= _EXACT_INT_DEVICES:
        p_num, p_exp = devices, 0
    else:
        if not (type(devices) is float and 0.0 < devices < _INF):
            devices = _check_real(
                "devices",
                devices,
                positive=True,
                fix="pass the number of devices (e.g. GPUs) the phase ran on, such as 8",
                where=where,
            )
        p_num, p_exp = exact_fraction(devices)
    s_num, s_exp = exact_fraction(seconds)
    return s_num, s_exp, s_num * p_num, s_exp + p_exp


# Positional on purpose: it runs for every figure computed.
def _figures(  # noqa: PLR0917
    samples: int,
    tokens: int,
    low: int,
    high: int,
    p50: float,
    p95: float,
    sec_num: int,
    sec_exp: int,
    dev_num: int,
    dev_exp: int,
) -> dict[str, int | float]:
    """The figures (keys :data:`THROUGHPUT_KEYS`) of the lengths' count, sum, extremes
    (meaningful when ``samples``) and quantiles and the exact sums of seconds and
    device-seconds: the one formula of :meth:`ThroughputMetric.calculate` and
    :meth:`ThroughputMetric.calculate_batch`."""
    return {
        "samples": samples,
        "tokens": tokens,
        "seconds": _ratio(sec_num, 1 << sec_exp),
        "device_seconds": _ratio(dev_num, 1 << dev_exp),
        "tokens_per_s": _ratio(tokens << sec_exp, sec_num),
        "tokens_per_s_per_device": _ratio(tokens << dev_exp, dev_num),
        "length_mean": _ratio(tokens, samples),
        "length_min": float(low) if samples else math.nan,
        "length_max": float(high) if samples else math.nan,
        "length_p50": p50,
        "length_p95": p95,
    }


def _dyadic_to_str(num: int, exp: int) -> str:
    return str(Fraction(num, 1 << exp))  # reduced: equal sums give equal strings


def _dyadic_from_state(state: Mapping[str, Any], key: str, max_exp: int) -> tuple[int, int]:
    text = state.get(key)
    value: Fraction | None = None
    if isinstance(text, str):
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            value = None
    d = 0 if value is None else value.denominator
    if value is None or value < 0 or d & (d - 1) or d.bit_length() - 1 > max_exp:
        raise InvalidArgumentError(
            f"ThroughputMetric.from_state: state[{key!r}] must be an exact non-negative "
            f"'numerator/denominator' string with a power-of-two denominator, got {text!r}; "
            f"pass a state written by ThroughputMetric.state()"
        )
    return value.numerator, d.bit_length() - 1


@final
class ThroughputMetric:
    """Samples, tokens, seconds and device-seconds of a window; rates as ratios of totals.

    ``calculate()`` returns the keys of :data:`THROUGHPUT_KEYS`:

    * ``samples``, ``tokens`` (int): number of samples and ``Σlengths``.
    * ``seconds``, ``device_seconds``: ``Σseconds_i`` and ``Σ(seconds_i * devices_i)``.
    * ``tokens_per_s = tokens / seconds``;
      ``tokens_per_s_per_device = tokens / device_seconds``.
    * ``length_mean = tokens / samples``, ``length_min``, ``length_max``, and the
      nearest-rank ``length_p50``/``length_p95`` (see :class:`LengthHistogram`; exact
      for every length).

    Every key is always present. Undefined figures (a rate over zero seconds, a length
    statistic of no samples) are ``float("nan")``.
    """

    __slots__ = ("_dev_exp", "_dev_num", "_lengths", "_sec_exp", "_sec_num")

    def __init__(self) -> None:
        self._lengths = LengthHistogram()
        # Σseconds == _sec_num / 2**_sec_exp and Σ(seconds * devices) ==
        # _dev_num / 2**_dev_exp, exactly; each exponent is the largest added so far.
        self._sec_num = 0
        self._sec_exp = 0
        self._dev_num = 0
        self._dev_exp = 0

    def accumulate(self, *, lengths: Sequence[int], seconds: float, devices: int | float) -> None:
        """Add one batch: its samples' token ``lengths``, the ``seconds`` it took, on ``devices``.

        ``lengths``: int token counts, one per sample (which tokens count is the
        caller's definition; may be empty when time passed without samples).
        ``seconds``: finite, ``>= 0``. ``devices``: the physical device budget of the
        phase, finite and ``> 0`` (may be fractional). All three are validated before
        anything changes, so a rejected call leaves the metric as it was.
        """
        s_num, s_exp, d_num, d_exp = _exact_times(seconds, devices, "ThroughputMetric.accumulate")
        self._lengths._add(lengths, "ThroughputMetric.accumulate")  # validates, then adds
        if s_num:  # 0.0 (the observers' lengths-only calls) adds nothing
            self._sec_num, self._sec_exp = _dyadic_add(self._sec_num, self._sec_exp, s_num, s_exp)
            self._dev_num, self._dev_exp = _dyadic_add(self._dev_num, self._dev_exp, d_num, d_exp)

    def calculate(self) -> dict[str, int | float]:
        """Figures of the window (keys :data:`THROUGHPUT_KEYS`); never resets."""
        h = self._lengths
        p50, p95 = h._quantiles(_QUANTILES)
        return _figures(
            h._count,
            h._total,
            h._min,
            h._max,
            p50,
            p95,
            self._sec_num,
            self._sec_exp,
            self._dev_num,
            self._dev_exp,
        )

    @staticmethod
    def calculate_batch(
        *, lengths: Sequence[int], seconds: float, devices: int | float
    ) -> dict[str, int | float]:
        """The figures of one batch: what a new metric's :meth:`calculate` gives after one
        :meth:`accumulate` of the same arguments, bit for bit, without building it.

        For a figure of one batch (one iteration's samples over its seconds): a sort of
        the lengths instead of a histogram, which is built for a window fed many
        batches. Arguments are validated as :meth:`accumulate` validates them.
        """
        where = "ThroughputMetric.calculate_batch"
        s_num, s_exp, d_num, d_exp = _exact_times(seconds, devices, where)
        ordered, tokens = sorted_lengths(lengths, where)
        n = len(ordered)
        if not n:
            return _figures(0, 0, 0, 0, math.nan, math.nan, s_num, s_exp, d_num, d_exp)
        p50 = float(ordered[nearest_rank(_P50, n) - 1])
        p95 = float(ordered[nearest_rank(_P95, n) - 1])
        return _figures(n, tokens, ordered[0], ordered[-1], p50, p95, s_num, s_exp, d_num, d_exp)

    def reset(self) -> None:
        """Forget every accumulated observation."""
        self._lengths.reset()
        self._sec_num = self._sec_exp = self._dev_num = self._dev_exp = 0

    def merge(self, other: ThroughputMetric) -> None:
        """Add ``other``'s totals to this metric (``other`` is unchanged).

        Afterwards this metric equals one that was fed both metrics' observations.
        """
        if not isinstance(other, ThroughputMetric):
            raise InvalidArgumentError(
                f"ThroughputMetric.merge: other must be a ThroughputMetric, got "
                f"{short_repr(other)}; rebuild a worker's partial with "
                f"ThroughputMetric.from_state(state)"
            )
        self._lengths.merge(other._lengths)
        self._sec_num, self._sec_exp = _dyadic_add(
            self._sec_num, self._sec_exp, other._sec_num, other._sec_exp
        )
        self._dev_num, self._dev_exp = _dyadic_add(
            self._dev_num, self._dev_exp, other._dev_num, other._dev_exp
        )

    def state(self) -> dict[str, Any]:
        """Plain JSON-able partial totals (exact), for :meth:`from_state` and merging.

        ``seconds`` and ``device_seconds`` are exact rationals written as reduced
        ``"numerator/denominator"`` strings (JSON numbers would round them);
        ``lengths`` is :meth:`LengthHistogram.state`.
        """
        return {
            "version": _STATE_VERSION,
            "seconds": _dyadic_to_str(self._sec_num, self._sec_exp),
            "device_seconds": _dyadic_to_str(self._dev_num, self._dev_exp),
            "lengths": self._lengths.state(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ThroughputMetric:
        """Rebuild a metric from :meth:`state` output (validated)."""
        if (
            not isinstance(state, Mapping)
            or type(state.get("version")) is not int
            or (state.get("version") != _STATE_VERSION)
        ):
            raise InvalidArgumentError(
                f"ThroughputMetric.from_state: state must be a mapping with version "
                f"{_STATE_VERSION}, got {short_repr(state)}; pass ThroughputMetric.state()"
            )
        metric = cls()
        metric._sec_num, metric._sec_exp = _dyadic_from_state(state, "seconds", _SECONDS_MAX_EXP)
        metric._dev_num, metric._dev_exp = _dyadic_from_state(
            state, "device_seconds", _DEVICE_SECONDS_MAX_EXP
        )
        lengths = state.get("lengths")
        if not isinstance(lengths, Mapping):
            raise InvalidArgumentError(
                f"ThroughputMetric.from_state: state['lengths'] must be a "
                f"LengthHistogram.state() mapping, got {short_repr(lengths)}"
            )
        metric._lengths = LengthHistogram.from_state(lengths)
        return metric

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ThroughputMetric):
            return NotImplemented
        return self.state() == other.state()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"ThroughputMetric(samples={self._lengths.count}, tokens={self._lengths.total}, "
            f"seconds={_ratio(self._sec_num, 1 << self._sec_exp)!r})"
        )
