"""Policy age, from the generation spans' attributes (docs/metrics.md, "Policy age and
work never trained"), and what names a wait (:data:`WAIT_PREFIX`; waits are measured
in :mod:`twinkle.observers._workers`).

* A span named ``wait.<what>`` is a wait: the demo's trainer ``wait.rollout`` (for a
  batch), an engine's ``wait.weights`` (held by the staleness bound until the weights
  it is due arrive).
* A generation span with ``iteration`` and ``version`` attributes says which weights
  made that iteration's rollouts: its policy age is ``iteration - version``, the
  versions the weights lagged behind the policy being trained (the StreamingDriver
  counts one version per iteration, from its initial version, the first iteration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.checks import as_int
from twinkle.events import SpanBatch
from twinkle.observers._config import ObserverConfig
from twinkle.observers._iteration_attr import iteration_number

__all__ = ["PolicyAges", "WAIT_PREFIX"]

WAIT_PREFIX = "wait."


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
        generation, phase_of = config.streaming[0], config.phase_of
        for span in event.spans:
            if phase_of(span.name) != generation:
                continue
            attrs = span.attrs
            iteration = iteration_number(attrs.get("iteration"))
            version = as_int(attrs.get("version"))
            if iteration is None or version is None:
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
