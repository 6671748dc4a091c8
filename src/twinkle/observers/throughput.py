"""Throughput observer: tokens per second per device, as the caller defines them.

The caller's configuration (``RunStarted.config``) says which spans make a phase, which
sample tag counts for it and which device count is its denominator. Per iteration it
emits one record per configured phase (``kind`` = the phase name: the iteration's tokens
of that tag over the phase's *attributed* logical seconds) and one ``iteration`` record
(effective tokens over the iteration's *window* logical seconds). At the finish, per
phase a ``window`` record (every sample of the tag over the phase's true union on the
run's timeline, less overhead) and one ``run`` record (every effective token over the
run's *active* logical seconds: from the first span of the loop's work or the first
boundary to the loop's end, so rollouts before the first boundary count in time as in
tokens). Both also hold the **steady state** (``steady_*``): the same figure over the
iterations whose window is not flagged warm-up, drain or partial. Every rate is a ratio
of totals (:class:`~twinkle.metric.ThroughputMetric`), never a mean of rates.
"""

from __future__ import annotations

from typing import Any

from twinkle.events import (
    IterationStarted,
    RunFinished,
    RunStarted,
    SamplesObserved,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.metric import ThroughputMetric
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._devices import placement_summary
from twinkle.observers.timeline import Finished, RunTiming, Timeline, timeline_for
from twinkle.reporting import MetricRecord, RunTotals, make_record

__all__ = ["ThroughputObserver"]

_NS = 1e9
#: the steady-state keys (``steady_<key>``) of the run and phase window records
_STEADY_KEYS = ("tokens", "seconds", "tokens_per_s", "tokens_per_s_per_device")
_WINDOW = ""  # the run window's steady-state metric, beside the phases'


class ThroughputObserver(BuiltinObserver):
    """Per iteration the figures of each phase's batch; windows over the run."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.run_id = ""
        #: every sample of each tag the run saw (lengths only; seconds come at the end)
        self.tag_lengths: dict[str, ThroughputMetric] = {}
        self.iterations = 0
        #: per tag [samples, tokens, groups]: the summary's counts are built from them
        #: (plain ints, no lock: observers never run concurrently)
        self.counts: dict[str, list[int]] = {}
        self.last_step = 0
        #: the run's windows, computed once at the finish (records and summary share them)
        self.run_window: dict[str, int | float] = {}
        self.phase_windows: dict[str, dict[str, int | float]] = {}
        #: the steady-state iterations' tokens and seconds: per phase, and the window's
        self.steady: dict[str, ThroughputMetric] = {}
        self.steady_iterations = 0
        #: per finished segment: the counts accumulated in it and its producers'
        #: terminal totals (a resumed run calibrates each segment against its own)
        self.segments: list[tuple[dict[str, int | float], dict[str, int | float]]] = []
        self._counted: dict[str, int | float] = {}  # the counts when the segment began

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = timeline_for(context, "throughput")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id
        config = self.timeline.config
        tags = {spec.samples for spec in config.throughput.values()}
        if config.window is not None:
            tags.add(config.window.samples)
        self.tag_lengths = {tag: ThroughputMetric() for tag in sorted(tags)}

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        lengths = event.lengths
        counts = self.counts.get(event.phase)
        if counts is None:
            counts = self.counts[event.phase] = [0, 0, 0]
        counts[0] += len(lengths)
        counts[1] += sum(lengths)
        counts[2] += event.groups
        metric = self.tag_lengths.get(event.phase)
        if metric is not None:
            metric.accumulate(lengths=lengths, seconds=0.0, devices=1)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.finished, event.monotonic_ns)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        tl = self.timeline
        records = self._emit(tl.finished, event.monotonic_ns)
        counted = self._counts().totals()
        before = self._counted
        self.segments.append(
            ({k: v - before.get(k, 0) for k, v in counted.items()}, dict(event.terminal_totals))
        )
        self._counted = counted
        run = tl.run
        if run is None:
            return records
        common: dict[str, Any] = {
            "run_id": self.run_id,
            "step": self.last_step,
            "iteration": max(self.iterations - 1, 0),
            "wall_ns": event.wall_ns,
            "monotonic_ns": event.monotonic_ns,
        }
        self.phase_windows = {
            phase: {**values, **self._steady_values(phase)}
            for phase, values in self._phase_windows(run).items()
        }
        self.run_window = {
            **self._run_window(run),
            "steady_iterations": self.steady_iterations,
            **self._steady_values(_WINDOW),
        }
        for phase, values in self.phase_windows.items():
            records.append(make_record(kind=phase, scope="window", values=values, **common))
        run_values: dict[str, int | float] = {
            **self.run_window,
            "iterations": self.iterations,
            "optimizer_updates": tl.optimizer_steps,
        }
        records.append(make_record(kind="run", scope="run", values=run_values, **common))
        return records

    def _window_metric(self, tag: str, seconds_ns: int, devices: float) -> ThroughputMetric:
        metric = ThroughputMetric()
        metric.merge(self.tag_lengths[tag])
        # The lengths went in with 0 s on 1 device: the device-seconds are all here.
        metric.accumulate(lengths=(), seconds=seconds_ns / _NS, devices=devices)
        return metric

    def _phase_windows(self, run: RunTiming) -> dict[str, dict[str, int | float]]:
        """Per phase: every sample of its tag over its run-level logical seconds."""
        return {
            phase: self._window_metric(
                spec.samples, run.total.phase_logical_ns[phase], spec.devices
            ).calculate()
            for phase, spec in self.timeline.config.throughput.items()
        }

    def _run_window(self, run: RunTiming) -> dict[str, int | float]:
        """Every effective token over the run's active logical seconds (no window
        configured: no tokens, the seconds alone)."""
        config = self.timeline.config
        active_ns = run.active_wall_ns - run.active_overhead_ns
        if config.window is None:
            metric = ThroughputMetric()
            metric.accumulate(lengths=(), seconds=active_ns / _NS, devices=1)
            return metric.calculate()
        return self._window_metric(
            config.window.samples, active_ns, config.window.devices
        ).calculate()

    def _steady_values(self, name: str) -> dict[str, int | float]:
        """``steady_<key>`` of the steady-state iterations (seconds 0 and rates
        undefined when there were none)."""
        metric = self.steady.get(name)
        if metric is None:
            metric = ThroughputMetric()
            metric.accumulate(lengths=(), seconds=0.0, devices=1)
        values = metric.calculate()
        return {f"steady_{key}": values[key] for key in _STEADY_KEYS}

    def _add_steady(self, name: str, lengths: Any, seconds: float, devices: float) -> None:
        metric = self.steady.get(name)
        if metric is None:
            metric = self.steady[name] = ThroughputMetric()
        metric.accumulate(lengths=lengths, seconds=seconds, devices=devices)

    def _emit(self, finished: list[Finished], monotonic_ns: int) -> list[MetricRecord]:
        config = self.timeline.config
        window = config.window
        batch = ThroughputMetric.calculate_batch
        records: list[MetricRecord] = []
        for done in finished:
            data = done.data
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
            samples = data.samples
            attributed = done.attributed.phase_logical_ns
            steady = done.steady
            self.steady_iterations += steady
            for phase, spec in config.throughput.items():
                lengths, seconds = samples.get(spec.samples, ()), attributed[phase] / _NS
                values = batch(lengths=lengths, seconds=seconds, devices=spec.devices)
                values["groups"] = data.groups.get(spec.samples, 0)
                records.append(make_record(kind=phase, values=values, attrs=done.attrs, **common))
                if steady:
                    self._add_steady(phase, lengths, seconds, spec.devices)
            if window is not None:
                lengths, seconds = samples.get(window.samples, ()), done.window.logical_ns / _NS
                values = batch(lengths=lengths, seconds=seconds, devices=window.devices)
                values["window_logical_seconds"] = seconds
                values["steady"] = int(steady)
                attrs = done.attrs
                records.append(make_record(kind="iteration", values=values, attrs=attrs, **common))
                if steady:
                    self._add_steady(_WINDOW, lengths, seconds, window.devices)
            elif steady:  # no window configured: the seconds alone, as the run's figure
                self._add_steady(_WINDOW, (), done.window.logical_ns / _NS, 1)
        return records

    def _counts(self) -> RunTotals:
        """The run's counters (``samples_<tag>``, ``tokens_<tag>``, ``groups_<tag>`` once
        a tag had groups, ``optimizer_updates`` once a step came)."""
        totals = RunTotals()
        for tag, (samples, tokens, groups) in self.counts.items():
            totals.add(f"samples_{tag}", samples)
            totals.add(f"tokens_{tag}", tokens)
            if groups:  # counts are >= 0: a tag that had groups
                totals.add(f"groups_{tag}", groups)
        if self.timeline.optimizer_steps:  # the timeline counts every step event
            totals.add("optimizer_updates", self.timeline.optimizer_steps)
        return totals

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> dict[str, Any]:
        return {
            "window": self.run_window,
            "phase_windows": self.phase_windows,
            "counts": self._calibrated(),
            "late_samples": self.timeline.late_samples,
            "missing_sample_tags": self._missing_tags(),
            "placement": self._placement(),
        }

    def _placement(self) -> dict[str, Any]:
        """The workers' devices and each denominator with where it came from."""
        config = self.timeline.config
        sources = config.device_sources
        window = config.window
        return placement_summary(
            config.placement,
            None if window is None else (window.devices, sources[None]),
            {p: (spec.devices, sources[p]) for p, spec in config.throughput.items()},
        )

    def _calibrated(self) -> dict[str, dict[str, int | float | None]]:
        """The counters, each segment's calibrated against its own terminal totals and
        summed: ``accumulated`` from the events; ``terminal`` the segments' terminal
        totals added (None when no segment gave one); ``final`` each segment's terminal
        total where it gave one, else its accumulated count, added; ``discrepancy`` the
        segments' ``terminal - accumulated`` added where they gave one."""
        out: dict[str, dict[str, int | float | None]] = {}
        for counted, terminal in self.segments:
            totals = RunTotals()
            for key, value in counted.items():
                totals.add(key, value)
            for key, entry in totals.calibrate(terminal).items():
                into = out.setdefault(
                    key, {"accumulated": 0, "terminal": None, "final": 0, "discrepancy": None}
                )
                for name, part in entry.items():
                    if part is not None:
                        now = into[name]
                        into[name] = part if now is None else now + part
        return dict(sorted(out.items()))

    def _missing_tags(self) -> dict[str, str]:
        """Each sample tag the configuration counts that no samples event carried, or
        only with empty lengths (its throughput is 0 for want of samples: a misspelt
        tag, samples never published, or none in them), with what counts it."""
        config = self.timeline.config
        users: dict[str, list[str]] = {}
        for phase, spec in config.throughput.items():
            users.setdefault(spec.samples, []).append(f"throughput.{phase}")
        if config.window is not None:
            users.setdefault(config.window.samples, []).append("window")
        return {
            tag: (
                f"counted by {', '.join(where)} but no samples event had phase={tag!r}; "
                f"publish bus.samples(phase={tag!r}, ...) or fix the tag (seen: "
                f"{sorted(self.counts) or 'none'})"
                if tag not in self.counts
                else f"counted by {', '.join(where)}, but every samples event with "
                f"phase={tag!r} had an empty lengths list: pass each sample's tokens"
            )
            for tag, where in sorted(users.items())
            if tag not in self.counts or not self.counts[tag][0]
        }
