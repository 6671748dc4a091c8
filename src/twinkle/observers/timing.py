"""Timing observer: where the run's time went, in the window and attributed views.

Per iteration one ``timing`` record (scope ``iteration``) holds both views of
docs/metrics.md: ``window_*`` keys measure the wall clock from this iteration's boundary
to the next (every span clipped to it, whichever iteration it serves: busy <= wall,
consecutive windows tile the run); ``attributed_*`` keys measure the work done for this
iteration wherever it ran. At the finish one ``timing`` record of scope ``run`` holds the
run's true unions, pairwise overlaps, idle time, the generation running while training runs,
and the set-up and tear-down windows; it is the sum of every window's figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from twinkle.events import (
    IterationStarted,
    RunFinished,
    RunResumed,
    RunStarted,
    Snapshot,
    SpanBatch,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._config import ObserverConfig
from twinkle.observers._driver_health import DRIVER_KEYS, DriverLedger, never_trained
from twinkle.observers._limits import LimitsLedger, path_values
from twinkle.observers._stragglers import StragglerLedger
from twinkle.observers._waits import PolicyAges
from twinkle.observers._workers import WorkerLedger
from twinkle.observers.timeline import (
    AttributedTiming,
    Finished,
    RunTiming,
    Timeline,
    WindowTiming,
    timeline_for,
)
from twinkle.reporting import MetricRecord, make_record

__all__ = [
    "AttributedKeys",
    "TimingObserver",
    "WindowKeys",
    "attributed_keys",
    "attributed_values",
    "run_values",
    "window_values",
]

_NS = 1e9


@dataclass(frozen=True, slots=True)
class WindowKeys:
    """The value keys of a stretch of the timeline, ``<prefix><name>``, spelled once per
    run (in the config's order of phases and pairs, as :func:`measure_window` fills them)."""

    #: wall, overhead, logical, busy, idle, span and unnamed seconds
    totals: tuple[str, str, str, str, str, str, str]
    #: (phase, its seconds key, its logical seconds key)
    phases: tuple[tuple[str, str, str], ...]
    #: ((p, q), its overlap key)
    pairs: tuple[tuple[tuple[str, str], str], ...]

    @classmethod
    def of(cls, config: ObserverConfig, prefix: str) -> WindowKeys:
        return cls(
            (
                f"{prefix}wall_seconds",
                f"{prefix}overhead_seconds",
                f"{prefix}logical_seconds",
                f"{prefix}busy_seconds",
                f"{prefix}idle_seconds",
                f"{prefix}span_seconds",
                f"{prefix}unnamed_seconds",
            ),
            tuple(
                (p, f"{prefix}{p}_seconds", f"{prefix}{p}_logical_seconds") for p in config.phases
            ),
            tuple(((p, q), f"{prefix}overlap_{p}_{q}_seconds") for p, q in config.pairs),
        )


#: per phase: (phase, its sum, union, logical seconds and spans keys)
AttributedKeys = tuple[tuple[str, str, str, str, str], ...]


def attributed_keys(config: ObserverConfig) -> AttributedKeys:
    """The ``attributed_<phase>_*`` keys of every phase, in config order."""
    return tuple(
        (
            p,
            f"attributed_{p}_sum_seconds",
            f"attributed_{p}_seconds",
            f"attributed_{p}_logical_seconds",
            f"attributed_{p}_spans",
        )
        for p in config.phases
    )


def window_values(t: WindowTiming, keys: WindowKeys) -> dict[str, int | float]:
    """Flat values (seconds) of one stretch of the timeline."""
    wall, overhead, logical, busy, idle, span, unnamed = keys.totals
    values: dict[str, int | float] = {
        wall: t.wall_ns / _NS,
        overhead: t.overhead_ns / _NS,
        logical: t.logical_ns / _NS,
        busy: t.busy_ns / _NS,
        idle: t.idle_ns / _NS,
        span: t.span_ns / _NS,
        unnamed: t.unnamed_ns / _NS,
    }
    phase_ns, logical_ns = t.phase_ns, t.phase_logical_ns
    for phase, seconds_key, logical_key in keys.phases:
        values[seconds_key] = phase_ns[phase] / _NS
        values[logical_key] = logical_ns[phase] / _NS
    overlap_ns = t.overlap_ns
    for pair, key in keys.pairs:
        values[key] = overlap_ns[pair] / _NS
    return values


def attributed_values(t: AttributedTiming, keys: AttributedKeys) -> dict[str, int | float]:
    """Flat values of one iteration's attributed view (keys ``attributed_*``)."""
    values: dict[str, int | float] = {
        "attributed_spans": t.spans,
        "attributed_span_errors": t.errors,
        "attributed_span_seconds": t.span_ns / _NS,
    }
    for phase, sum_key, union_key, logical_key, spans_key in keys:
        values[sum_key] = t.phase_sum_ns[phase] / _NS
        values[union_key] = t.phase_union_ns[phase] / _NS
        values[logical_key] = t.phase_logical_ns[phase] / _NS
        values[spans_key] = t.phase_spans[phase]
    return values


def _edge_values(t: WindowTiming, name: str) -> dict[str, int | float]:
    """The set-up windows', the loop's or the tear-down windows' wall, overhead, busy
    and idle seconds."""
    return {
        f"{name}_wall_seconds": t.wall_ns / _NS,
        f"{name}_overhead_seconds": t.overhead_ns / _NS,
        f"{name}_busy_seconds": t.busy_ns / _NS,
        f"{name}_idle_seconds": t.idle_ns / _NS,
    }


def run_values(run: RunTiming, config: ObserverConfig, iterations: int) -> dict[str, int | float]:
    """Flat values of the run-level record (scope ``run``)."""
    values: dict[str, int | float] = {
        **window_values(run.total, WindowKeys.of(config, "")),
        "active_wall_seconds": run.active_wall_ns / _NS,
        "active_logical_seconds": (run.active_wall_ns - run.active_overhead_ns) / _NS,
        **_edge_values(run.setup, "setup"),
        **_edge_values(run.loop, "loop"),
        **_edge_values(run.teardown, "teardown"),
        "late_spans": run.late_spans,
        "late_seconds": run.late_ns / _NS,
        "iterations": iterations,
    }
    if config.streaming is not None:
        generation, training = config.streaming
        hidden = run.total.overlap_ns.get((generation, training))
        if hidden is None:  # config order put training first
            hidden = run.total.overlap_ns[(training, generation)]
        total = run.total.phase_ns[generation]
        values["generation_hidden_seconds"] = hidden / _NS
        values["generation_hidden_share"] = hidden / total if total else math.nan
    return values


class TimingObserver(BuiltinObserver):
    """Time accounting per iteration and for the run; a deterministic function of the
    events (read from the run's timeline)."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.run_id = ""
        self.iterations = 0
        self.run_seconds: dict[str, int | float] = {}
        #: each window's verdict, the steady state's timing: what limits the run
        self.limits = LimitsLedger()
        self.limits_summary: dict[str, Any] = {}
        #: each side's workers compared per iteration
        self.stragglers = StragglerLedger()
        #: the streaming driver's snapshots by window; policy ages
        self.driver = DriverLedger()
        self.ages = PolicyAges()
        #: each worker's time no span covers and its waits, per window
        self.workers = WorkerLedger()
        # The per-iteration record's keys, spelled once the config is known.
        self.window_keys = WindowKeys.of(self.timeline.config, "window_")
        self.attributed_keys: AttributedKeys = ()

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = timeline_for(context, "timing")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id
        config = self.timeline.config
        self.window_keys = WindowKeys.of(config, "window_")
        self.attributed_keys = attributed_keys(config)

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        self.driver.resumed()
        self.workers.resumed()

    @hookimpl
    def twinkle_snapshot(self, event: Snapshot) -> None:
        self.driver.snapshot(event.state, self.timeline.iteration_at(event.monotonic_ns))

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        config = self.timeline.config
        self.stragglers.spans(event, config)
        self.ages.spans(event, config)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.finished, event.monotonic_ns)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        tl = self.timeline
        records = self._emit(tl.finished, event.monotonic_ns)
        if tl.run is None:
            return records
        self.run_seconds = run_values(tl.run, tl.config, self.iterations)
        self.run_seconds.update(path_values(tl.run.loop, "loop_"))
        if self.limits.steady is not None:
            self.run_seconds.update(path_values(self.limits.steady, "steady_"))
        self.limits_summary = self.limits.summary(tl.run.loop, tl.config)
        # Stragglers over the steady state (every iteration when there is none).
        self.limits_summary["stragglers"] = self.stragglers.summary()
        self.limits_summary["driver"] = self.driver.summary()
        self.limits_summary["policy_age"] = self.ages.summary()
        self.limits_summary["workers"] = self.workers.summary()
        self.limits_summary["never_trained"] = never_trained(
            self.limits_summary["driver"], _unstarted(tl)
        )
        records.append(
            make_record(
                kind="timing",
                scope="run",
                run_id=self.run_id,
                step=tl.step,
                iteration=max(self.iterations - 1, 0),
                wall_ns=event.wall_ns,
                monotonic_ns=event.monotonic_ns,
                values=self.run_seconds,
            )
        )
        return records

    def _emit(self, finished: list[Finished], monotonic_ns: int) -> list[MetricRecord]:
        records = []
        for done in finished:
            self.iterations += 1
            values = window_values(done.window, self.window_keys)
            values["window_steady"] = int(done.steady)
            values.update(path_values(done.window, "window_"))
            found = self.limits.add(done.window, done.steady, self.timeline.config)
            self.stragglers.finalise(done.data.iteration, done.steady)
            values.update(attributed_values(done.attributed, self.attributed_keys))
            attrs = {"window_verdict": found}
            records.append(self._record("timing", done, monotonic_ns, values, attrs))
            waits = self.workers.window(done.window.wall_ns, done.workers, done.steady)
            if waits is not None:
                records.append(self._record("waits", done, monotonic_ns, *waits))
            ages = self.ages.finalise(done.data.iteration, done.steady)
            driver = self.driver.values(done.data.iteration)
            if driver is not None or ages is not None:
                # (what is not known, nan: written as null and named in attrs.nonfinite)
                health: dict[str, int | float] = dict.fromkeys(DRIVER_KEYS, math.nan)
                health.update(driver or {})
                health.update(ages or {})
                records.append(self._record("driver", done, monotonic_ns, health))
        return records

    def _record(
        self,
        kind: str,
        done: Finished,
        monotonic_ns: int,
        values: dict[str, int | float],
        attrs: dict[str, Any] | None = None,
    ) -> MetricRecord:
        """An iteration's record (written when ``done`` was finalised), with its
        window's flags."""
        return make_record(
            kind=kind,
            scope="iteration",
            run_id=self.run_id,
            step=done.data.step,
            iteration=done.data.iteration,
            wall_ns=done.data.wall_ns,
            monotonic_ns=monotonic_ns,
            values=values,
            attrs={**done.attrs, **(attrs or {})},
        )

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        tl = self.timeline
        return {
            "iterations": self.iterations,
            "seconds": self.run_seconds,
            "spans": tl.accounting(),
            "unstarted_iterations": _unstarted(tl),
            "finalise_lag": tl.config.finalise_lag,
            "clock_skew": tl.skew.summary(),
            "limits": self.limits_summary,
        }


def _unstarted(tl: Timeline) -> dict[str, dict[str, Any]]:
    """Per iteration observed but never started: its spans, their seconds, and its
    samples and tokens per tag."""
    return {
        str(it): {
            "spans": len(data.spans),
            "span_seconds": sum(s[2] - s[1] for s in data.spans) / _NS,
            "samples": {tag: len(v) for tag, v in sorted(data.samples.items())},
            "tokens": {tag: sum(v) for tag, v in sorted(data.samples.items())},
        }
        for it, data in sorted(tl.unstarted.items())
    }
