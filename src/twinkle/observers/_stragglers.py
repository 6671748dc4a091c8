"""Stragglers: each engine's and each trainer rank's seconds per unit of work per
iteration against the median of its peers', chronic or one-off, or an abstention when
the workloads are not comparable (docs/metrics.md, "Stragglers").

A worker is the ``engine`` attribute of a generation span (else the span's source),
and the source of a training span (a rank's worker report; the run's own process is
``main``). Its work on an iteration is its spans of the side's phase whose ``iteration``
attribute names it: their seconds added, less the time of the waits (``wait.*`` spans
of that iteration) their thread ran inside them (a rank waiting in a collective for a
slower one), and their units: the ``tokens`` attributes added (when every worker's
spans carry some on that iteration), else the spans counted (requests, micro-batches).
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass, field
from typing import Any

from twinkle.events import SpanBatch
from twinkle.observers._config import ObserverConfig
from twinkle.observers._intervals import Interval, clip, length, merge
from twinkle.observers._waits import WAIT_PREFIX

__all__ = ["SLOW", "StragglerLedger"]

#: a worker is slow on an iteration at this many times its peers' median seconds per unit
SLOW = 1.5
#: ... and chronic when slow on more than this share of the iterations compared (3 or
#: more): most of them, so that two equal workers whose times jitter are not called so
CHRONIC_SHARE = 0.5
CHRONIC_MIN = 3
#: workloads are comparable when each worker's units lie within this factor of the median
COMPARABLE = 2.0


@dataclass(slots=True)
class _Work:
    """One worker's work on one iteration: seconds, tokens, spans, spans with tokens."""

    ns: int = 0
    tokens: int = 0
    spans: int = 0
    with_tokens: int = 0


#: a process's thread: (source, pid, thread id), the clock its spans' times are read on
_Thread = tuple[str, int, int]


@dataclass(slots=True)
class _Iteration:
    """One side's work on one iteration: per worker, and each of its spans' stretch on
    its thread (until the iteration is finalised, when the waits inside are taken off)."""

    workers: dict[str, _Work] = field(default_factory=dict)
    stretches: list[tuple[str, _Thread, int, int]] = field(default_factory=list)

    def less_waits(self, waits: dict[_Thread, list[Interval]]) -> dict[str, _Work]:
        """The workers' work, ``waits`` (merged, per thread) inside their spans taken off
        it (in place: once, as the iteration is finalised)."""
        if waits:
            for worker, thread, start, end in self.stretches:
                inside = waits.get(thread)
                if inside:
                    self.workers[worker].ns -= length(clip(inside, start, end))
        return self.workers


@dataclass(slots=True)
class _Verdicts:
    """One worker's record over the iterations compared."""

    compared: int = 0
    slow: int = 0
    ratios: array[float] = field(default_factory=lambda: array("d"))  # (8 bytes each)
    #: per unit ("token", "span"): [nanoseconds, units] over the iterations measured so
    ns_units: dict[str, list[int]] = field(default_factory=dict)


class _Side:
    """One side's comparisons so far: per worker its record, and why iterations were
    not compared (counted)."""

    def __init__(self) -> None:
        self.verdicts: dict[str, _Verdicts] = {}
        self.abstained: dict[str, int] = {}
        self.units: set[str] = set()

    @property
    def empty(self) -> bool:
        """No iteration folded in yet (compared or abstained on)."""
        return not self.verdicts and not self.abstained

    def compare(self, workers: dict[str, _Work]) -> None:
        """Fold one iteration's work in: each worker against its peers' median."""
        tokens = all(w.with_tokens for w in workers.values())
        units, why = _units(workers, tokens)
        if units is None:
            self.abstained[why] = self.abstained.get(why, 0) + 1
            return
        unit = "token" if tokens else "span"
        self.units.add(unit)
        rates = {w: workers[w].ns / units[w] for w in workers}
        for name, peers in _peer_medians(rates).items():
            rate = rates[name]
            if not peers:
                continue  # (its peers took no time: nothing to compare with)
            record = self.verdicts.setdefault(name, _Verdicts())
            ratio = rate / peers
            record.compared += 1
            record.slow += ratio >= SLOW
            record.ratios.append(ratio)
            totals = record.ns_units.setdefault(unit, [0, 0])
            totals[0] += workers[name].ns
            totals[1] += units[name]

    def summary(self) -> dict[str, Any]:
        # The unit of every iteration compared; "mixed" when some had tokens and some not.
        unit = None if not self.units else min(self.units) if len(self.units) == 1 else "mixed"
        return {
            "unit": unit,
            "iterations_compared": max((v.compared for v in self.verdicts.values()), default=0),
            "abstained": dict(sorted(self.abstained.items())),
            "workers": {name: _worker(v) for name, v in sorted(self.verdicts.items())},
        }


def _peer_medians(rates: dict[str, float]) -> dict[str, float]:
    """Per worker, the median of the others' rates (as :func:`statistics.median` gives
    it), from one sort: without the worker at sorted place ``i``, the others' ``k``-th
    smallest is the ``k``-th of the whole, or the ``k + 1``-th from ``i`` on."""
    ordered = sorted(rates, key=rates.__getitem__)
    values = [rates[w] for w in ordered]
    n = len(values) - 1  # the peers of each

    def nth(k: int, i: int) -> float:
        return values[k if k < i else k + 1]

    medians = {}
    for i, name in enumerate(ordered):
        mid = n // 2
        medians[name] = nth(mid, i) if n % 2 else (nth(mid - 1, i) + nth(mid, i)) / 2
    return medians


class StragglerLedger:
    """Collects each side's work per iteration and worker from span batches, and folds
    an iteration in when it is finalised (its work then forgotten: until then, a tuple
    per phase span and wait of the iteration; after, memory grows with
    the workers, and by 8 bytes per worker and iteration compared, the ratios whose
    exact median is reported; once a side has a steady iteration folded in, the
    summary reads its steady state's alone, and every iteration's are dropped). A span
    arriving after its iteration was finalised is not counted."""

    def __init__(self) -> None:
        #: side -> iteration -> its workers' work, for the iterations not finalised yet
        self.work: dict[str, dict[int, _Iteration]] = {"generation": {}, "training": {}}
        #: iteration -> thread -> the waits it ran, for the iterations not finalised yet
        self.waits: dict[int, dict[_Thread, list[Interval]]] = {}
        #: per side: over the steady state, and over every iteration (until the steady
        #: state has one: the summary reads that side's steady state's from then on)
        self.steady = {side: _Side() for side in self.work}
        self.every = {side: _Side() for side in self.work}
        self.finalised: int | None = None

    def spans(self, event: SpanBatch, config: ObserverConfig) -> None:
        if config.streaming is None:
            return
        generation, training = config.streaming
        phase_of, finalised, source = config.phase_of, self.finalised, event.source
        for span in event.spans:
            name = span.name
            phase = phase_of(name)
            if phase == generation:
                side = "generation"
            elif phase == training:
                side = "training"
            elif name.startswith(WAIT_PREFIX):
                side = None
            else:
                continue
            attrs = span.attrs
            iteration = attrs.get("iteration")
            if type(iteration) is not int or iteration < 0:
                continue  # (none: docs/metrics.md "Attribution", iteration_number inlined)
            if finalised is not None and iteration <= finalised:
                continue  # (late: its iteration was compared already)
            thread = (source, span.pid, span.thread_id)
            if side is None:
                waits = self.waits.setdefault(iteration, {})
                waits.setdefault(thread, []).append((span.start_ns, span.end_ns))
                continue
            worker = source
            if side == "generation":
                engine = attrs.get("engine")
                if isinstance(engine, str) and engine:
                    worker = engine
            data = self.work[side].get(iteration)
            if data is None:
                data = self.work[side][iteration] = _Iteration()
            work = data.workers.get(worker)
            if work is None:
                work = data.workers[worker] = _Work()
            work.ns += span.end_ns - span.start_ns
            work.spans += 1
            data.stretches.append((worker, thread, span.start_ns, span.end_ns))
            tokens = attrs.get("tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
                work.tokens += tokens
                work.with_tokens += 1

    def finalise(self, iteration: int, steady: bool) -> None:
        """Compare ``iteration``'s workers (its window finalised), then forget them."""
        self.finalised = iteration if self.finalised is None else max(self.finalised, iteration)
        waits = {thread: merge(ivs) for thread, ivs in self.waits.pop(iteration, {}).items()}
        for side, by_iteration in self.work.items():
            data = by_iteration.pop(iteration, None)
            if data is None:
                continue
            workers = data.less_waits(waits)
            if steady:
                self.steady[side].compare(workers)
            if self.steady[side].empty:
                self.every[side].compare(workers)
            else:  # (never read again: its ratios would grow the state for nothing)
                self.every.pop(side, None)

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``stragglers``: per side, over the steady state (every
        iteration when no steady iteration had work to compare), each worker's seconds
        per unit and how often it was slow."""
        out: dict[str, Any] = {}
        for side in self.work:
            chosen = self.steady[side]
            if chosen.empty:  # (then every iteration's is still there)
                chosen = self.every[side]
            out[side] = chosen.summary()
        return out


def _units(workers: dict[str, _Work], tokens: bool) -> tuple[dict[str, int] | None, str]:
    """Each worker's units on one iteration, or None and why they are not comparable."""
    if len(workers) < 2:
        return None, "fewer than two workers did this side's work"
    units = {name: (w.tokens if tokens else w.spans) for name, w in workers.items()}
    middle = statistics.median(units.values())
    if not middle or any(
        not middle / COMPARABLE <= u <= middle * COMPARABLE for u in units.values()
    ):
        what = "tokens" if tokens else "spans"
        return None, f"a worker's {what} lay beyond {COMPARABLE:g}x the median: not comparable"
    return units, ""


def _worker(v: _Verdicts) -> dict[str, Any]:
    chronic = v.compared >= CHRONIC_MIN and v.slow > CHRONIC_SHARE * v.compared
    return {
        # per unit, over the iterations measured in it
        **{
            f"seconds_per_{unit}": ns / 1e9 / units if units else None
            for unit, (ns, units) in sorted(v.ns_units.items())
        },
        "median_ratio_to_peers": statistics.median(v.ratios),
        "slow_iterations": v.slow,
        "compared_iterations": v.compared,
        "verdict": "chronic" if chronic else "one-off" if v.slow else "ok",
    }
