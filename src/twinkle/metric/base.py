"""The :class:`Metric` protocol every computation in :mod:`twinkle.metric` follows.

A metric is a pure accumulator: it is fed explicit observations, computes figures from
the totals it keeps, and never reads a clock, a device or a file. Keeping the three
verbs apart lets a caller report the same window twice, or report and then reset, and
lets the event-log replay feed the same observations again to get the same figures.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Metric"]


@runtime_checkable
class Metric(Protocol):
    """Accumulate observations, calculate figures from the totals, reset on request.

    * ``accumulate(...)`` adds one batch of observations. Implementations take keyword
      arguments with units in their names and validate them all before changing any
      state, so a rejected call leaves the metric as it was.
    * ``calculate()`` returns the figures of everything accumulated since the last
      ``reset()`` as a flat ``{key: number}`` dict with units in the keys. It never
      resets, and it returns the same numbers (bit for bit) for the same accumulated
      observations. A figure that is undefined (a ratio over zero) is ``float("nan")``,
      never left out and never a sentinel such as ``-1``.
    * ``reset()`` forgets everything accumulated.
    """

    def accumulate(self, *args: Any, **kwargs: Any) -> None:
        """Add one batch of observations (validated before any state changes)."""

    def calculate(self) -> dict[str, int | float]:
        """Figures of the accumulated window, without resetting it."""

    def reset(self) -> None:
        """Forget every accumulated observation."""
