"""An engine's generation time as a function of its tokens, fitted to its recorded
generation spans, for another number of engines to share an iteration's tokens
(docs/metrics.md, "What if: predicting another configuration").

One iteration's share gives an engine little spread of tokens, so one engine's own line
is poorly known; the engines' lines are fitted together, each engine's times scaled to
the typical engine's speed first:

* ``rate(e)``: engine ``e``'s seconds per token over all its spans (its speed);
  ``typical``: the low median of the rates (a straggler is not typical; of two
  engines, the faster);
* the shape ``a + b * tokens``: least squares over every engine's spans, each span's
  time times ``typical / rate(e)``; a line whose slope is not positive, whose
  intercept is negative, or whose slope's standard error is above 10 % of it is not
  used: the shape is then ``typical * tokens`` (proportional);
* engine ``e``'s line: the shape times ``rate(e) / typical``; a new engine's: the shape.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from twinkle.whatif._recorded import EngineRecord, Piece

__all__ = ["Fit", "fit_engines", "generated_tokens"]

#: a line whose slope's standard error is above this share of it is not used
TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class Fit:
    """Generation time: ``a_ns + b_ns_per_token * tokens``."""

    a_ns: float
    b_ns_per_token: float

    def ns(self, tokens: float) -> float:
        return self.a_ns + self.b_ns_per_token * tokens

    def times(self, k: float) -> Fit:
        return Fit(self.a_ns * k, self.b_ns_per_token * k)


def generated_tokens(p: Piece, generation: str) -> int | None:
    """The tokens a generation span generated (its ``tokens`` attribute), else None."""
    tokens = p.attrs.get("tokens")
    if p.phase != generation or not isinstance(tokens, int) or isinstance(tokens, bool):
        return None
    return tokens


def _points(rec: EngineRecord, generation: str) -> list[tuple[int, int]]:
    return [
        (tokens, p.duration_ns)
        for pieces in rec.items.values()
        for p in pieces
        if (tokens := generated_tokens(p, generation)) is not None
    ]


def line(points: Sequence[tuple[float, float]]) -> Fit | None:
    """The least-squares line through ``points``, or None when it is not known well
    enough (see the module's docstring)."""
    xs = [x for x, _ in points]
    if len(points) < 3 or len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, [y for _, y in points])
    mean = statistics.fmean(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in points)
    se = math.sqrt(residual / (len(points) - 2) / sxx)
    if slope <= 0 or intercept < 0 or se > TOLERANCE * slope:
        return None
    return Fit(intercept, slope)


def fit_engines(recs: Iterable[EngineRecord], generation: str) -> tuple[dict[str, Fit], Fit] | None:
    """Each engine's line (those with tokens recorded) and a new engine's; None when no
    generation span carries tokens."""
    points = {rec.name: pts for rec in recs if (pts := _points(rec, generation))}
    rate = {  # (an engine without tokens or time says nothing of its speed)
        name: took / total
        for name, pts in points.items()
        if (total := sum(x for x, _ in pts)) > 0 and (took := sum(y for _, y in pts)) > 0
    }
    if not rate:
        return None
    typical = statistics.median_low(rate.values())
    pooled = [(x, y * typical / rate[name]) for name in rate for x, y in points[name]]
    shape = line(pooled) or Fit(0.0, typical)
    return {name: shape.times(r / typical) for name, r in rate.items()}, shape
