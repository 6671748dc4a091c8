"""Throughput observer: tokens per second per device, as the caller defines them.

The caller's configuration (``RunStarted.config``) says which spans make a phase, which
sample tag counts for it and which device count is its denominator. Per iteration it
emits one record per configured phase (``kind`` = the phase name) and one ``iteration``
record for the window definition (effective tokens over the iteration's *logical*
seconds); at the end, per-phase ``window`` records and one ``run`` record. Every rate is
a ratio of totals (:class:`~twinkle.metric.ThroughputMetric`), never a mean of rates.
"""

from __future__ import annotations

from typing import Any

from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunStarted,
    SamplesObserved,
)
from twinkle.hookspecs import hookimpl
from twinkle.metric import ThroughputMetric
from twinkle.metric.reporting import MetricRecord, RunTotals, make_record
from twinkle.observers._timeline import Finished, TimelineObserver

__all__ = ["ThroughputObserver"]

_NS = 1e9


class ThroughputObserver(TimelineObserver):
    """One ThroughputMetric per phase per iteration, and windows over the run."""

    def __init__(self) -> None:
        super().__init__()
        self.phase_windows: dict[str, ThroughputMetric] = {}
        self.window = ThroughputMetric()
        self.iterations = 0
        self.totals = RunTotals()
        self.last_step = 0

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        super().twinkle_run_started(event)
        self.phase_windows = {p: ThroughputMetric() for p in self.timeline.config.throughput}

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        super().twinkle_samples(event)
        self.totals.add(f"samples_{event.phase}", len(event.lengths))
        self.totals.add(f"tokens_{event.phase}", sum(event.lengths))
        if event.groups:
            self.totals.add(f"groups_{event.phase}", event.groups)

    @hookimpl
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        super().twinkle_optimizer_step(event)
        self.totals.add("optimizer_updates", 1)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.iteration_started(event), event.monotonic_ns)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        records = self._emit(self.timeline.run_finished(event), event.monotonic_ns)
        common: dict[str, Any] = {
            "run_id": self.run_id,
            "step": self.last_step,
            "iteration": max(self.iterations - 1, 0),
            "wall_ns": event.wall_ns,
            "monotonic_ns": event.monotonic_ns,
        }
        for phase, metric in self.phase_windows.items():
            records.append(
                make_record(kind=phase, scope="window", values=metric.calculate(), **common)
            )
        run_values: dict[str, int | float] = {
            **self.window.calculate(),
            "iterations": self.iterations,
            "optimizer_updates": self.timeline.optimizer_steps,
        }
        records.append(make_record(kind="run", scope="run", values=run_values, **common))
        return records

    def _emit(self, finished: Finished | None, monotonic_ns: int) -> list[MetricRecord]:
        if finished is None:
            return []
        data, timing = finished
        config = self.timeline.config
        self.iterations += 1
        self.last_step = data.step
        common: dict[str, Any] = {
            "run_id": self.run_id,
            "scope": "iteration",
            "step": data.step,
            "iteration": data.iteration,
            "wall_ns": data.wall_ns,
            "monotonic_ns": monotonic_ns,
        }
        records: list[MetricRecord] = []
        for phase, spec in config.throughput.items():
            metric = ThroughputMetric()
            lengths = data.samples.get(spec.samples, [])
            seconds = timing.phase_logical_ns[phase] / _NS
            if lengths or seconds:
                metric.accumulate(lengths=lengths, seconds=seconds, devices=spec.devices)
                # Mergeable partials: the window takes the iteration's sums and buckets.
                self.phase_windows[phase].merge(metric)
            values = {**metric.calculate(), "groups": data.groups.get(spec.samples, 0)}
            records.append(make_record(kind=phase, values=values, **common))
        if config.window is not None:
            lengths = data.samples.get(config.window.samples, [])
            seconds = timing.logical_ns / _NS
            metric = ThroughputMetric()
            metric.accumulate(lengths=lengths, seconds=seconds, devices=config.window.devices)
            self.window.merge(metric)
            values = {**metric.calculate(), "logical_seconds": seconds}
            records.append(make_record(kind="iteration", values=values, **common))
        return records

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> dict[str, Any]:
        window = self.window.calculate()
        return {
            "window": window,
            "phase_windows": {p: m.calculate() for p, m in self.phase_windows.items()},
            "counts": self.totals.calibrate(event.terminal_totals),
            "late_samples": self.timeline.late_samples,
        }
