"""Waits and policy age, from the spans' names and attributes (docs/metrics.md, "Waits
and policy age").

* A span named ``wait.<what>`` is a wait: the demo's trainer ``wait.rollout`` (for a
  batch), an engine's ``wait.weights`` (held by the staleness bound until the weights
  it is due arrive). Their seconds are added per name and worker (the span's ``engine``
  attribute, else its source).
* A generation span with ``iteration`` and ``version`` attributes says which weights
  made that iteration's rollouts: its policy age is ``iteration - version``, the
  versions the weights lagged behind the policy being trained (the StreamingDriver
  counts one version per iteration, from its initial version, the first iteration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.events import SpanBatch
from twinkle.observers._config import ObserverConfig

__all__ = ["PolicyAges", "WaitLedger", "WAIT_PREFIX"]

WAIT_PREFIX = "wait."


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class WaitLedger:
    """Every ``wait.*`` span's seconds, per name and worker."""

    def __init__(self) -> None:
        self.ns: dict[str, dict[str, int]] = {}

    def spans(self, event: SpanBatch) -> None:
        for span in event.spans:
            if not span.name.startswith(WAIT_PREFIX):
                continue
            engine = span.attrs.get("engine")
            worker = engine if isinstance(engine, str) and engine else event.source
            by_worker = self.ns.setdefault(span.name, {})
            by_worker[worker] = by_worker.get(worker, 0) + span.end_ns - span.start_ns

    def summary(self) -> dict[str, dict[str, float]]:
        """Per wait, per worker, its seconds (names and workers sorted)."""
        return {
            name: {w: ns / 1e9 for w, ns in sorted(by_worker.items())}
            for name, by_worker in sorted(self.ns.items())
        }


@dataclass(slots=True)
class _Ages:
    total: int = 0
    count: int = 0
    largest: int = 0


@dataclass(slots=True)
class PolicyAges:
    """Each iteration's rollouts' policy ages until it is finalised; the steady
    state's (and every iteration's) folded in then."""

    pending: dict[int, _Ages] = field(default_factory=dict)
    steady: _Ages = field(default_factory=_Ages)
    every: _Ages = field(default_factory=_Ages)
    finalised: int | None = None

    def spans(self, event: SpanBatch, config: ObserverConfig) -> None:
        if config.streaming is None:
            return
        generation = config.streaming[0]
        for span in event.spans:
            iteration = _int(span.attrs.get("iteration"))
            version = _int(span.attrs.get("version"))
            if iteration is None or version is None or config.phase_of(span.name) != generation:
                continue
            if self.finalised is not None and iteration <= self.finalised:
                continue  # late: its iteration's record is written
            ages = self.pending.setdefault(iteration, _Ages())
            age = iteration - version
            ages.total += age
            ages.count += 1
            ages.largest = max(ages.largest, age) if ages.count > 1 else age

    def finalise(self, iteration: int, steady: bool) -> dict[str, float] | None:
        """``iteration``'s ``policy_age_mean`` and ``policy_age_max`` (None: no
        generation span of it carried a version)."""
        self.finalised = iteration if self.finalised is None else max(self.finalised, iteration)
        ages = self.pending.pop(iteration, None)
        if ages is None:
            return None
        for into in (self.every, *((self.steady,) if steady else ())):
            into.largest = max(into.largest, ages.largest) if into.count else ages.largest
            into.total += ages.total
            into.count += ages.count
        return {"policy_age_mean": ages.total / ages.count, "policy_age_max": ages.largest}

    def summary(self) -> dict[str, Any]:
        """Over the steady state (every iteration when none had ages): the mean and
        largest age and how many generation spans said theirs; {} when none did."""
        ages = self.steady if self.steady.count else self.every
        if not ages.count:
            return {}
        return {
            "mean": ages.total / ages.count,
            "max": ages.largest,
            "spans": ages.count,
            "over": "steady state" if self.steady.count else "loop",
        }
