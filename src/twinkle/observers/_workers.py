"""Each worker's time that no span covers, and its waits, per window (docs/metrics.md,
"Waits and unaccounted time").

A worker is a span's ``engine`` attribute, else its batch's source (the process or rank
whose recorder sent it). In a window, a worker's *covered* time is the union of its
spans there; the rest of the window is its *unaccounted* time: idle, blocked on
something no span names, or doing work nobody timed (twinkle's own spans are no
worker's: its time is the window's overhead). A ``wait.<what>`` span is a wait: its
time counts per name and worker, as the union of those spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from twinkle.observers._intervals import Interval, union_ns

__all__ = ["WorkerLedger", "WorkerPiece", "WorkerTiming", "measure_workers"]

# (worker, wait name or None, start_ns, end_ns) of a span on the run's timeline
WorkerPiece = tuple[str, str | None, int, int]


class WorkerTiming(msgspec.Struct, frozen=True):
    """One window's per-worker coverage and waits, in integer nanoseconds.

    ``covered_ns``: per worker with a span crossing the window, the union of its spans
    clipped to it; ``wait_ns``: per (``wait.*`` name, worker), the union of those spans
    clipped to it."""

    covered_ns: dict[str, int]
    wait_ns: dict[tuple[str, str], int]


def measure_workers(lo: int, hi: int, pieces: list[WorkerPiece]) -> WorkerTiming:
    """The :class:`WorkerTiming` of ``[lo, hi)`` from the pieces crossing it."""
    by_worker: dict[str, list[Interval]] = {}
    by_wait: dict[tuple[str, str], list[Interval]] = {}
    for worker, wait, start, end in pieces:
        if end <= lo or start >= hi:
            continue
        iv = (start if start > lo else lo, end if end < hi else hi)
        by_worker.setdefault(worker, []).append(iv)
        if wait is not None:
            by_wait.setdefault((wait, worker), []).append(iv)
    return WorkerTiming(
        {w: union_ns(ivs) for w, ivs in sorted(by_worker.items())},
        {key: union_ns(ivs) for key, ivs in sorted(by_wait.items())},
    )


@dataclass(slots=True)
class _Totals:
    """Over some windows: per worker, its unaccounted nanoseconds and the wall of the
    windows it was counted in; per (wait name, worker), the wait's nanoseconds."""

    unaccounted_ns: dict[str, int] = field(default_factory=dict)
    wall_ns: dict[str, int] = field(default_factory=dict)
    wait_ns: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(
        self, unaccounted: dict[str, int], wall: int, waits: dict[tuple[str, str], int]
    ) -> None:
        for worker, ns in unaccounted.items():
            self.unaccounted_ns[worker] = self.unaccounted_ns.get(worker, 0) + ns
            self.wall_ns[worker] = self.wall_ns.get(worker, 0) + wall
        for key, ns in waits.items():
            self.wait_ns[key] = self.wait_ns.get(key, 0) + ns

    def _figure(self, ns: int, worker: str) -> dict[str, float | None]:
        wall = self.wall_ns.get(worker, 0)
        return {"seconds": ns / 1e9, "share": ns / wall if wall else None}

    def summary(self) -> dict[str, Any]:
        waits: dict[str, dict[str, dict[str, float | None]]] = {}
        for (name, worker), ns in sorted(self.wait_ns.items()):
            waits.setdefault(name, {})[worker] = self._figure(ns, worker)
        return {
            "unaccounted": {
                w: self._figure(ns, w) for w, ns in sorted(self.unaccounted_ns.items())
            },
            "waits": waits,
        }


@dataclass(slots=True)
class WorkerLedger:
    """The workers seen in the segment's loop so far, the wait names seen in the run,
    and the workers' unaccounted time and waits summed over the loop and the steady
    state."""

    workers: set[str] = field(default_factory=set)
    waits: set[str] = field(default_factory=set)
    loop: _Totals = field(default_factory=_Totals)
    steady: _Totals = field(default_factory=_Totals)

    def resumed(self) -> None:
        """A new segment: its workers are those it sees."""
        self.workers = set()

    def window(
        self, wall_ns: int, timing: WorkerTiming, steady: bool
    ) -> tuple[dict[str, int | float], dict[str, Any]] | None:
        """A finalised window's ``waits`` record values and attrs (None: no worker yet).

        Its workers: those with a span in it or in an earlier window of the segment's
        loop (a worker with nothing in the window is unaccounted for all of it)."""
        self.workers.update(timing.covered_ns)
        waits: dict[str, int] = {}
        for (name, _), ns in timing.wait_ns.items():
            waits[name] = waits.get(name, 0) + ns
        self.waits.update(waits)
        if not self.workers:
            return None
        unaccounted = {w: wall_ns - timing.covered_ns.get(w, 0) for w in sorted(self.workers)}
        self.loop.add(unaccounted, wall_ns, timing.wait_ns)
        if steady:
            self.steady.add(unaccounted, wall_ns, timing.wait_ns)
        most = max(unaccounted, key=unaccounted.__getitem__)  # ties: the first name
        values: dict[str, int | float] = {
            "unaccounted_seconds_max": unaccounted[most] / 1e9,
            "unaccounted_seconds_min": min(unaccounted.values()) / 1e9,
            "unaccounted_seconds_mean": sum(unaccounted.values()) / len(unaccounted) / 1e9,
            "unaccounted_workers": len(unaccounted),
        }
        for name in sorted(self.waits):
            values[f"{name}_seconds"] = waits.get(name, 0) / 1e9
        return values, {"unaccounted_argmax_worker": most}

    def summary(self) -> dict[str, Any]:
        """Over the steady state (the loop when it has none; ``over`` says which), per
        worker its ``unaccounted`` time and per wait name and worker its ``waits``: each
        ``seconds`` and their ``share`` of the wall of the windows the worker was
        counted in."""
        totals, over = (self.steady, "steady state") if self.steady.wall_ns else (self.loop, "loop")
        if not totals.wall_ns:
            return {}
        return {"over": over, **totals.summary()}
