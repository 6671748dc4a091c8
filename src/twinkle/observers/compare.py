"""A framework's own figures beside twinkle's, iteration by iteration (``config.compare``,
docs/metrics.md "A framework's own figures"): the summary's ``compare``.

For each span name of ``config.compare.seconds``, the iteration's spans of that name
(their durations added, as frameworks add a timer's repeats) against the framework's
figure of its key in the same iteration's scalars; for ``config.compare.throughput``,
the iteration's tokens of the samples' tag over the named spans' seconds and the devices,
against the framework's figure. Only iterations with both sides count.
"""

from __future__ import annotations

import math
from typing import Any

from twinkle.events import SamplesObserved, ScalarsObserved, SpanBatch
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._compare_config import CompareConfig, CompareThroughput
from twinkle.observers._iteration_attr import iteration_number

__all__ = ["CompareObserver"]


class CompareObserver(BuiltinObserver):
    """Per iteration, the seconds of the named spans, the tokens of a samples' tag and
    the framework's figures; the comparison at the finish."""

    def __init__(self) -> None:
        self.config: CompareConfig | None = None
        # (plain dicts: the run's checkpoint holds twinkle's values and builtin containers)
        self.seconds: dict[tuple[int, str], int] = {}  # nanoseconds
        self.tokens: dict[int, int] = {}
        self.figures: dict[int, dict[str, int | float]] = {}

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.config = CompareConfig.parse(context.config.get("compare"))

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        config = self.config
        if config is None:
            return
        names = config.seconds.keys() | ({config.throughput.span} if config.throughput else set())
        for span in event.spans:
            iteration = iteration_number(span.attrs.get("iteration"))
            if span.name in names and iteration is not None:
                key = (iteration, span.name)
                self.seconds[key] = self.seconds.get(key, 0) + span.end_ns - span.start_ns

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        config = self.config
        if config is not None and config.throughput and event.phase == config.throughput.samples:
            self.tokens[event.iteration] = self.tokens.get(event.iteration, 0) + sum(event.lengths)

    @hookimpl
    def twinkle_scalars(self, event: ScalarsObserved) -> None:
        if self.config is not None and event.name == self.config.scalars:
            self.figures.setdefault(event.iteration, {}).update(event.values)

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any] | None:
        config = self.config
        if config is None:
            return None
        seconds = {name: self._seconds(name, key) for name, key in sorted(config.seconds.items())}
        out: dict[str, Any] = {"scalars": config.scalars, "seconds": seconds}
        if config.throughput is not None:
            out["throughput"] = self._throughput(config.throughput)
        return {"compare": out}

    def _seconds(self, name: str, key: str) -> dict[str, Any]:
        pairs = [
            (self.seconds[iteration, name] / 1e9, figures[key])
            for iteration, figures in sorted(self.figures.items())
            if (iteration, name) in self.seconds and _number(figures.get(key))
        ]
        # (null, not 0, when no iteration had both: a timer never logged took no 0 s)
        return {
            "key": key,
            "iterations": len(pairs),
            "twinkle_seconds": sum(ours for ours, _ in pairs) if pairs else None,
            "theirs_seconds": sum(theirs for _, theirs in pairs) if pairs else None,
            "max_difference_seconds": max((abs(o - t) for o, t in pairs), default=None),
        }

    def _throughput(self, tp: CompareThroughput) -> dict[str, Any]:
        pairs = []
        for iteration, figures in sorted(self.figures.items()):
            ns = self.seconds.get((iteration, tp.span), 0)
            if ns > 0 and _number(figures.get(tp.key)) and figures[tp.key] > 0:
                ours = self.tokens.get(iteration, 0) / (ns / 1e9 * tp.devices)
                pairs.append((ours, figures[tp.key]))
        n = len(pairs)
        return {
            "key": tp.key,
            "span": tp.span,
            "iterations": n,
            "twinkle_mean": sum(o for o, _ in pairs) / n if n else None,
            "theirs_mean": sum(t for _, t in pairs) / n if n else None,
            "max_relative_difference": max((abs(o / t - 1) for o, t in pairs), default=None),
        }


def _number(value: object) -> bool:
    """A finite number (a figure the framework did not have is logged as NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
