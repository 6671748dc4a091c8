"""Window throughput as a ratio of totals: ``Σtokens / Σseconds`` and ``Σtokens / Σdevice-seconds``.

The caller defines every term: which samples and tokens count (``lengths``), which
seconds they took (a phase duration it measured), and the physical device budget of
that phase (``devices``). The metric only keeps totals; it never averages per-step
rates, reads no clock and waits for nothing.

Exact, order-free sums. Every finite double is an integer multiple of ``2**-1074``, and
the product of two doubles an integer multiple of ``2**-2148``. The metric therefore
keeps ``Σseconds`` and ``Σ(seconds * devices)`` as exact Python integers in those units,
and every output float is the correctly rounded value of an exact rational (CPython's
``int / int`` rounds correctly). So the figures depend only on the multiset of
accumulated observations: any split of the same calls into ``accumulate``/``merge``
calls, in any order, on any machine, gives bit-identical ``calculate()`` output — which
the event-log replay relies on to reproduce records byte for byte. A float running sum
would instead drift by an ulp with the order of additions, and integer nanoseconds would
round away what the caller passed. The integers stay small (about 1100 and 2200 bits),
so memory stays O(1) in the number of calls.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final, final

from twinkle.errors import InvalidArgumentError
from twinkle.metric.histogram import LengthHistogram, _short_repr, _validate_lengths

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

_SECONDS_SHIFT: Final = 1074  # Σseconds is kept in units of 2**-1074 s
_DEVICE_SECONDS_SHIFT: Final = 2 * 1074  # Σ(seconds * devices) in units of 2**-2148
_STATE_VERSION: Final = 1
_P50: Final = (0.5).as_integer_ratio()  # as LengthHistogram.quantile(0.5) takes it
_P95: Final = (0.95).as_integer_ratio()


def _dyadic(x: float) -> tuple[int, int]:
    """``(n, k)`` with ``x == n / 2**k`` exactly."""
    n, d = x.as_integer_ratio()
    return n, d.bit_length() - 1


def _ratio(numerator: int, denominator: int) -> float:
    """Correctly rounded ``numerator / denominator``; ``nan`` when undefined (``/ 0``)."""
    if denominator == 0:
        return math.nan
    try:
        return numerator / denominator
    except OverflowError:  # beyond the float range
        return math.inf


def _check_real(name: str, value: object, *, positive: bool, fix: str) -> float:
    x = math.nan
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            x = float(value)
        except (OverflowError, ValueError):
            x = math.nan
    if not (math.isfinite(x) and (x > 0 or (x == 0 and not positive))):
        bound = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(
            f"ThroughputMetric.accumulate: {name} must be a finite number {bound}, "
            f"got {value!r}; {fix}"
        )
    return x


def _dyadic_to_str(num: int, shift: int) -> str:
    return str(Fraction(num, 1 << shift))


def _dyadic_from_state(state: Mapping[str, Any], key: str, shift: int) -> int:
    text = state.get(key)
    value: Fraction | None = None
    if isinstance(text, str):
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            value = None
    d = 0 if value is None else value.denominator
    if value is None or value < 0 or d & (d - 1) or d.bit_length() - 1 > shift:
        raise InvalidArgumentError(
            f"ThroughputMetric.from_state: state[{key!r}] must be an exact non-negative "
            f"'numerator/denominator' string with a power-of-two denominator, got {text!r}; "
            f"pass a state written by ThroughputMetric.state()"
        )
    return value.numerator << (shift - (d.bit_length() - 1))


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
      below 4096 tokens, within 0.39 % above).

    Every key is always present. Undefined figures (a rate over zero seconds, a length
    statistic of no samples) are ``float("nan")``.
    """

    __slots__ = ("_device_seconds", "_lengths", "_seconds")

    def __init__(self) -> None:
        self._lengths = LengthHistogram()
        self._seconds = 0  # exact Σseconds in units of 2**-1074 s
        self._device_seconds = 0  # exact Σ(seconds * devices) in units of 2**-2148 s

    def accumulate(self, *, lengths: Sequence[int], seconds: float, devices: int | float) -> None:
        """Add one batch: its samples' token ``lengths``, the ``seconds`` it took, on ``devices``.

        ``lengths``: int token counts, one per sample (which tokens count is the
        caller's definition; may be empty when time passed without samples).
        ``seconds``: finite, ``>= 0``. ``devices``: the physical device budget of the
        phase, finite and ``> 0`` (may be fractional). All three are validated before
        anything changes, so a rejected call leaves the metric as it was.
        """
        values = _validate_lengths(lengths, where="ThroughputMetric.accumulate")
        s = _check_real(
            "seconds",
            seconds,
            positive=False,
            fix="pass the phase duration in seconds, e.g. duration_ns / 1e9",
        )
        d = _check_real(
            "devices",
            devices,
            positive=True,
            fix="pass the number of devices (e.g. GPUs) the phase ran on, such as 8",
        )
        s_num, s_exp = _dyadic(s)
        d_num, d_exp = _dyadic(d)
        self._lengths._add_valid(values)
        self._seconds += s_num << (_SECONDS_SHIFT - s_exp)
        self._device_seconds += (s_num * d_num) << (_DEVICE_SECONDS_SHIFT - s_exp - d_exp)

    def calculate(self) -> dict[str, int | float]:
        """Figures of the window (keys :data:`THROUGHPUT_KEYS`); never resets."""
        h = self._lengths
        tokens = h.total
        empty = h.count == 0
        p50, p95 = h._quantiles((_P50, _P95))
        return {
            "samples": h.count,
            "tokens": tokens,
            "seconds": _ratio(self._seconds, 1 << _SECONDS_SHIFT),
            "device_seconds": _ratio(self._device_seconds, 1 << _DEVICE_SECONDS_SHIFT),
            "tokens_per_s": _ratio(tokens << _SECONDS_SHIFT, self._seconds),
            "tokens_per_s_per_device": _ratio(
                tokens << _DEVICE_SECONDS_SHIFT, self._device_seconds
            ),
            "length_mean": _ratio(tokens, h.count),
            "length_min": math.nan if empty else float(h._min),
            "length_max": math.nan if empty else float(h._max),
            "length_p50": p50,
            "length_p95": p95,
        }

    def reset(self) -> None:
        """Forget every accumulated observation."""
        self._lengths.reset()
        self._seconds = 0
        self._device_seconds = 0

    def merge(self, other: ThroughputMetric) -> None:
        """Add ``other``'s totals to this metric (``other`` is unchanged).

        Afterwards this metric equals one that was fed both metrics' observations.
        """
        if not isinstance(other, ThroughputMetric):
            raise InvalidArgumentError(
                f"ThroughputMetric.merge: other must be a ThroughputMetric, got "
                f"{_short_repr(other)}; rebuild a worker's partial with "
                f"ThroughputMetric.from_state(state)"
            )
        self._lengths.merge(other._lengths)
        self._seconds += other._seconds
        self._device_seconds += other._device_seconds

    def state(self) -> dict[str, Any]:
        """Plain JSON-able partial totals (exact), for :meth:`from_state` and merging.

        ``seconds`` and ``device_seconds`` are exact rationals written as
        ``"numerator/denominator"`` strings (JSON numbers would round them);
        ``lengths`` is :meth:`LengthHistogram.state`.
        """
        return {
            "version": _STATE_VERSION,
            "seconds": _dyadic_to_str(self._seconds, _SECONDS_SHIFT),
            "device_seconds": _dyadic_to_str(self._device_seconds, _DEVICE_SECONDS_SHIFT),
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
                f"{_STATE_VERSION}, got {_short_repr(state)}; pass ThroughputMetric.state()"
            )
        metric = cls()
        metric._seconds = _dyadic_from_state(state, "seconds", _SECONDS_SHIFT)
        metric._device_seconds = _dyadic_from_state(state, "device_seconds", _DEVICE_SECONDS_SHIFT)
        lengths = state.get("lengths")
        if not isinstance(lengths, Mapping):
            raise InvalidArgumentError(
                f"ThroughputMetric.from_state: state['lengths'] must be a "
                f"LengthHistogram.state() mapping, got {_short_repr(lengths)}"
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
            f"seconds={_ratio(self._seconds, 1 << _SECONDS_SHIFT)!r})"
        )
