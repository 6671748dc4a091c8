"""Places spans, samples and steps into iterations; the accounting the observers share.

Rules (documented in docs/metrics.md):

* Iteration ``i`` spans the window ``[start_i, start_next)`` on the run's timeline (the
  last one ends at the run's finish). It is *finalised* when the next iteration starts or
  the run finishes; the bus flushes every recorder first, so all spans closed by then
  have arrived.
* A span belongs to the iteration named by its ``iteration`` attribute when it has one
  (streaming: the next rollout runs during this iteration's training), else to the
  iteration whose window holds its start. Spans that start before the first iteration
  are *setup*; spans for an iteration already finalised are *late*: both are counted in
  the run totals, never silently dropped.
* Spans of other processes are moved onto the run's timeline through the clock anchors.
* Overhead spans (``twinkle.observe``) are taken by time: their union inside the window
  is the observers' own time, deducted once from the iteration's wall seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunStarted,
    SamplesObserved,
    SpanBatch,
)
from twinkle.hookspecs import OVERHEAD_SPAN, hookimpl
from twinkle.observers._config import ObserverConfig
from twinkle.perf import ClockAnchor

__all__ = [
    "Finished",
    "IterationData",
    "IterationTiming",
    "Timeline",
    "TimelineObserver",
    "union_ns",
]

Interval = tuple[int, int]


def union_ns(intervals: Iterable[Interval]) -> int:
    """Length of the union of half-open intervals (overlaps counted once)."""
    total = 0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def _clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The parts of union(a) outside union(b)."""
    out: list[Interval] = []
    holes = _merge(b)
    j = 0
    for start, end in _merge(a):
        cur = start
        while j < len(holes) and holes[j][1] <= cur:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] < end:
            hs, he = holes[k]
            if hs > cur:
                out.append((cur, hs))
            cur = max(cur, he)
            if cur >= end:
                break
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


@dataclass(frozen=True, slots=True)
class IterationTiming:
    """Time accounting of one iteration, in integer nanoseconds.

    ``phase_sum_ns`` adds span durations (nested/concurrent spans counted each time);
    ``phase_union_ns`` is their union on the timeline; ``phase_logical_ns`` is the union
    minus the observers' overhead; ``overlap_ns`` = Σ phase unions - union of all phases.
    """

    wall_ns: int
    overhead_ns: int
    logical_ns: int
    busy_ns: int
    overlap_ns: int
    phase_sum_ns: dict[str, int]
    phase_union_ns: dict[str, int]
    phase_logical_ns: dict[str, int]
    phase_spans: dict[str, int]
    spans: int
    errors: int


@dataclass(slots=True)
class IterationData:
    """Everything attributed to one iteration, until it is finalised."""

    iteration: int
    start_ns: int
    end_ns: int | None = None
    #: (phase or None, start_ns, end_ns, error, thread_id) on the run's timeline
    spans: list[tuple[str | None, int, int, str | None, int]] = field(default_factory=list)
    samples: dict[str, list[int]] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    step: int = 0
    wall_ns: int = 0

    def timing(
        self, config: ObserverConfig, overhead: list[tuple[int, int, int]]
    ) -> IterationTiming:
        """The iteration's time accounting (``end_ns`` must be set).

        ``overhead`` holds (start_ns, end_ns, thread_id) of the observers' own work. The
        iteration's logical time deducts its union inside the window, whatever the
        thread; a phase's logical time deducts only overhead on the threads its spans
        ran on (an observer running on another thread did not stall that phase).
        """
        if self.end_ns is None:
            raise RuntimeError(f"iteration {self.iteration} is not finalised")
        lo, hi = self.start_ns, self.end_ns
        overhead_ns = union_ns(_clip(((s, e) for s, e, _ in overhead), lo, hi))
        wall_ns = hi - lo
        over_by_thread: dict[int, list[Interval]] = {}
        for s, e, tid in overhead:
            over_by_thread.setdefault(tid, []).append((s, e))
        by_phase: dict[str, list[Interval]] = {p: [] for p in config.phases}
        by_phase_thread: dict[str, dict[int, list[Interval]]] = {p: {} for p in config.phases}
        sums = dict.fromkeys(config.phases, 0)
        counts = dict.fromkeys(config.phases, 0)
        errors = 0
        for phase, start, end, error, tid in self.spans:
            errors += error is not None
            if phase is not None:
                by_phase[phase].append((start, end))
                by_phase_thread[phase].setdefault(tid, []).append((start, end))
                sums[phase] += end - start
                counts[phase] += 1
        logical: dict[str, int] = {}
        for phase, threads in by_phase_thread.items():
            kept: list[Interval] = []
            for tid, ivs in threads.items():
                kept.extend(_subtract(ivs, over_by_thread.get(tid, [])))
            logical[phase] = union_ns(kept)
        unions = {p: union_ns(iv) for p, iv in by_phase.items()}
        everything = [iv for ivs in by_phase.values() for iv in ivs]
        busy = union_ns(everything)
        return IterationTiming(
            wall_ns=wall_ns,
            overhead_ns=overhead_ns,
            logical_ns=wall_ns - overhead_ns,
            busy_ns=busy,
            overlap_ns=sum(unions.values()) - busy,
            phase_sum_ns=sums,
            phase_union_ns=unions,
            phase_logical_ns=logical,
            phase_spans=counts,
            spans=len(self.spans),
            errors=errors,
        )


Finished = tuple[IterationData, IterationTiming]
"""An iteration handed out when it is complete, with its time accounting."""

_T = TypeVar("_T")

# Timelines of runs in progress, by the identity of their RunStarted event: observers
# that need the iteration accounting (timing, throughput) share one per run instead of
# each placing every span again. A Timeline is a pure function of the events and takes
# each event once (by identity), so sharing changes no figure.
_RUNS: dict[int, tuple[RunStarted, Timeline]] = {}


class Timeline:
    """Attributes events to iterations and hands out each iteration when it is complete.

    Every event method may be called several times with the same event object (one call
    per observer sharing the timeline): only the first call acts, later ones return the
    same result.
    """

    _last_event: object
    _last_result: Any

    @classmethod
    def for_run(cls, event: RunStarted) -> Timeline:
        """The shared timeline of the run ``event`` starts (made on first request)."""
        entry = _RUNS.get(id(event))
        if entry is None or entry[0] is not event:
            timeline = cls()
            timeline.run_started(event)
            entry = _RUNS[id(event)] = (event, timeline)
        return entry[1]

    def release(self) -> None:
        """Forget this timeline in the registry of runs in progress (idempotent)."""
        for key, (_, timeline) in list(_RUNS.items()):
            if timeline is self:
                del _RUNS[key]

    def _once(self, event: object, compute: Callable[[], _T]) -> _T:
        if event is self._last_event:
            return cast(_T, self._last_result)
        result = compute()
        self._last_event = event
        self._last_result = result
        return result

    def __init__(self) -> None:
        self._last_event = None
        self._last_result = None
        self.config = ObserverConfig.parse({})
        self.anchor: ClockAnchor | None = None
        self.current: IterationData | None = None
        self.future: dict[int, IterationData] = {}
        self.finalised: set[int] = set()
        self.overhead: list[tuple[int, int, int]] = []
        self.setup_spans = 0
        self.late_spans = 0
        self.late_samples = 0
        self.step = 0
        self.optimizer_steps = 0

    # -- events ----------------------------------------------------------------------

    def run_started(self, event: RunStarted) -> None:
        self.config = ObserverConfig.parse(event.config)
        self.anchor = event.anchor

    def iteration_started(self, event: IterationStarted) -> Finished | None:
        """Open ``event.iteration``; returns the iteration it finalises, if any."""
        return self._once(event, lambda: self._iteration_started(event))

    def _iteration_started(self, event: IterationStarted) -> Finished | None:
        done = self._finalise(event.monotonic_ns, event.wall_ns)
        data = self.future.pop(event.iteration, None) or IterationData(event.iteration, 0)
        data.start_ns = event.monotonic_ns
        self.current = data
        self.prune_overhead()
        return done

    def run_finished(self, event: RunFinished) -> Finished | None:
        """The last iteration, finalised at the run's end (if one was open)."""
        return self._once(event, lambda: self._finalise(event.monotonic_ns, event.wall_ns))

    def spans(self, event: SpanBatch) -> None:
        self._once(event, lambda: self._spans(event))

    def _spans(self, event: SpanBatch) -> None:
        shift = event.anchor.shift_onto(self.anchor)
        for span in event.spans:
            start, end = span.start_ns + shift, span.end_ns + shift
            if span.name == OVERHEAD_SPAN:
                self.overhead.append((start, end, span.thread_id))
                continue
            target = self._target(span.attrs.get("iteration"), start)
            if target is None:
                continue
            target.spans.append(
                (self.config.phase_of(span.name), start, end, span.error, span.thread_id)
            )

    def samples(self, event: SamplesObserved) -> None:
        self._once(event, lambda: self._samples(event))

    def _samples(self, event: SamplesObserved) -> None:
        data = self._for_iteration(event.iteration)
        if data is None:
            self.late_samples += len(event.lengths)
            return
        data.samples.setdefault(event.phase, []).extend(event.lengths)
        data.groups[event.phase] = data.groups.get(event.phase, 0) + event.groups

    def optimizer_step(self, event: OptimizerStep) -> None:
        self._once(event, lambda: self._optimizer_step(event))

    def _optimizer_step(self, event: OptimizerStep) -> None:
        self.optimizer_steps += 1
        self.step = max(self.step, event.step)
        data = self._for_iteration(event.iteration)
        if data is not None:
            data.steps += 1
            data.step = max(data.step, event.step)

    # -- helpers ---------------------------------------------------------------------

    def _for_iteration(self, iteration: int) -> IterationData | None:
        cur = self.current
        if cur is not None and iteration == cur.iteration:
            return cur
        if iteration in self.finalised or (cur is not None and iteration < cur.iteration):
            return None
        data = self.future.get(iteration)
        if data is None:
            data = self.future[iteration] = IterationData(iteration, 0)
        return data

    def _target(self, attr: object, start: int) -> IterationData | None:
        if isinstance(attr, int) and not isinstance(attr, bool):
            data = self._for_iteration(attr)
            if data is None:
                self.late_spans += 1
            return data
        cur = self.current
        if cur is None:
            self.setup_spans += 1
            return None
        if start < cur.start_ns:
            self.late_spans += 1
            return None
        return cur

    def _finalise(self, end_ns: int, wall_ns: int) -> Finished | None:
        cur = self.current
        if cur is None:
            return None
        cur.end_ns = end_ns
        cur.wall_ns = wall_ns
        # Steps taken so far count for this iteration's records (the step axis).
        cur.step = max(cur.step, self.step)
        self.finalised.add(cur.iteration)
        self.current = None
        return cur, cur.timing(self.config, self.overhead)

    def prune_overhead(self) -> None:
        """Forget overhead no open or future iteration can still need (bounded memory)."""
        starts = [d.start_ns for d in (self.current,) if d is not None]
        for data in (self.current, *self.future.values()):
            if data is not None:
                starts.extend(s for _, s, _, _, _ in data.spans)
        if not starts:
            return
        horizon = min(starts)
        self.overhead = [iv for iv in self.overhead if iv[1] > horizon]


class TimelineObserver:
    """Base of the observers that read the iteration accounting (timing, throughput):
    it joins the run's shared :class:`Timeline` and feeds it spans, samples and steps.

    A subclass that overrides one of these hooks decorates it with ``@hookimpl`` again
    and calls ``super()``.
    """

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.run_id = ""

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id
        self.timeline = Timeline.for_run(event)

    @hookimpl
    def twinkle_spans(self, event: SpanBatch) -> None:
        self.timeline.spans(event)

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        self.timeline.samples(event)

    @hookimpl
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        self.timeline.optimizer_step(event)
