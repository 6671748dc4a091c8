"""Scalars observer: the caller's named per-iteration figures as records.

Each :class:`~twinkle.events.ScalarsObserved` event becomes one record (``kind`` = the
event's name, scope ``iteration``); the summary keeps, per name and key, the first and
last value and the iterations they came from (e.g. the reward at the start and the end).
A record's step is the optimizer steps seen so far, as the run's timeline counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.events import RunStarted, ScalarsObserved
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._config import ObserverConfig
from twinkle.observers.timeline import Timeline, timeline_for
from twinkle.reporting import MetricRecord, make_record

__all__ = ["ScalarsObserver"]


class ScalarsObserver(BuiltinObserver):
    """Caller figures → records, and first/last values for the summary."""

    def __init__(self) -> None:
        self.run_id = ""
        #: the run's timeline: its step (optimizer steps so far) is each record's step
        self.timeline = Timeline()
        self.first: dict[str, dict[str, tuple[int, int | float]]] = {}
        self.last: dict[str, dict[str, tuple[int, int | float]]] = {}

    @hookimpl
    def twinkle_reserved_scalar_names(self, config: Mapping[str, Any]) -> frozenset[str]:
        # A scalar's records take its name as their kind: never one of the built-ins'.
        return ObserverConfig.parse(config).record_kinds()

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = timeline_for(context, "scalars")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id

    @hookimpl
    def twinkle_scalars(self, event: ScalarsObserved) -> list[MetricRecord]:
        first = self.first.setdefault(event.name, {})
        last = self.last.setdefault(event.name, {})
        for key, value in event.values.items():
            first.setdefault(key, (event.iteration, value))
            last[key] = (event.iteration, value)
        return [
            make_record(
                kind=event.name,
                scope="iteration",
                run_id=self.run_id,
                step=self.timeline.step,
                iteration=event.iteration,
                wall_ns=event.wall_ns,
                monotonic_ns=event.monotonic_ns,
                values=event.values,
            )
        ]

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, keys in sorted(self.first.items()):
            out[name] = {
                key: {
                    "first": value,
                    "first_iteration": it,
                    "last": self.last[name][key][1],
                    "last_iteration": self.last[name][key][0],
                }
                for key, (it, value) in sorted(keys.items())
            }
        return {"scalars": out}
