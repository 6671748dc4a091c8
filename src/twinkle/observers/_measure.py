"""Measuring the run's timeline: a window's wall-clock accounting (:func:`measure_window`,
:class:`WindowTiming`) and an iteration's attributed view (:class:`IterationData`,
:class:`AttributedTiming`), from spans already placed on the run's clock
(docs/metrics.md, "The run timeline"). :mod:`twinkle.observers.timeline` decides which
spans go where; this module only measures."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import msgspec

from twinkle.observers._config import ObserverConfig
from twinkle.observers._intervals import (
    Interval,
    clip,
    intersect,
    length,
    merge,
    subtract,
    union_ns,
)

__all__ = [
    "PATH_KINDS",
    "Attributed",
    "AttributedTiming",
    "IterationData",
    "Piece",
    "WindowTiming",
    "critical_path",
    "measure_window",
    "thread_key",
]

# (phase or None, start_ns, end_ns, thread_id) of a span on the run's timeline
Piece = tuple[str | None, int, int, int]
# (start_ns, end_ns, on the engines' side) of a piece of the publish phase
PublishPiece = tuple[int, int, bool]
# (phase or None, start_ns, end_ns, error, thread_id, has an iteration attribute) of a
# span attributed to an iteration (or, until the first boundary, to the set-up)
Attributed = tuple[str | None, int, int, str | None, int, bool]


class WindowTiming(msgspec.Struct, frozen=True):
    """Wall-clock accounting of one stretch of the timeline, in integer nanoseconds.

    Like the other values the timeline hands out per iteration, a frozen :mod:`msgspec`
    struct: building one costs a tenth of a frozen dataclass.

    ``phase_ns``: union of each phase's spans clipped to the window; ``phase_logical_ns``:
    that union less the overhead on the same threads; ``busy_ns``: union of all phases;
    ``idle_ns`` = wall - busy; ``overlap_ns[(p, q)]`` = |p ∩ q|; ``overhead_ns``: union of
    twinkle's own spans; ``span_ns``: every span's clipped duration added (phase or not);
    ``path_ns``: the window's wall cut by what was running at each instant, in the
    order of :data:`PATH_KINDS` (see :func:`critical_path`): they add up to ``wall_ns``;
    ``unnamed_ns``: the union of the spans in no phase (but waits) less busy: idle time
    in which work ran that no phase names; ``unnamed_by_name``: the same per key of those
    spans (their name, or the key of the names beyond the kept ones), the keys whose is
    not 0 (two names running at once: each counts that time). ``sides_ns`` (a streaming
    run's; {} without ``config.streaming``): the union of each side's work, ``trainer``
    (training and the publish it ran) and ``engines`` (generation and the publish they
    ran), and of each side's publish, ``trainer_publish`` and ``engines_publish``.
    """

    wall_ns: int
    overhead_ns: int
    busy_ns: int
    span_ns: int
    phase_ns: dict[str, int]
    phase_logical_ns: dict[str, int]
    overlap_ns: dict[tuple[str, str], int]
    path_ns: dict[str, int]
    #: the critical path's stretches as (kind, start_ns, end_ns), in time order: one
    #: window's (for the trace); a sum of windows has none
    path_slices: tuple[tuple[str, int, int], ...] = ()
    unnamed_ns: int = 0
    unnamed_by_name: dict[str, int] = msgspec.field(default_factory=dict)
    sides_ns: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def logical_ns(self) -> int:
        return self.wall_ns - self.overhead_ns

    @property
    def idle_ns(self) -> int:
        return self.wall_ns - self.busy_ns

    @classmethod
    def empty(cls, config: ObserverConfig) -> WindowTiming:
        zero = dict.fromkeys(config.phases, 0)
        path = dict.fromkeys(PATH_KINDS, 0)
        sides = dict.fromkeys(SIDE_KEYS, 0) if config.streaming is not None else {}
        return cls(
            0, 0, 0, 0, zero, dict(zero), dict.fromkeys(config.pairs, 0), path, sides_ns=sides
        )

    def __add__(self, other: WindowTiming) -> WindowTiming:
        return WindowTiming(
            self.wall_ns + other.wall_ns,
            self.overhead_ns + other.overhead_ns,
            self.busy_ns + other.busy_ns,
            self.span_ns + other.span_ns,
            {p: v + other.phase_ns[p] for p, v in self.phase_ns.items()},
            {p: v + other.phase_logical_ns[p] for p, v in self.phase_logical_ns.items()},
            {k: v + other.overlap_ns[k] for k, v in self.overlap_ns.items()},
            {k: v + other.path_ns[k] for k, v in self.path_ns.items()},
            unnamed_ns=self.unnamed_ns + other.unnamed_ns,
            unnamed_by_name=_added(self.unnamed_by_name, other.unnamed_by_name),
            sides_ns=_added(self.sides_ns, other.sides_ns),
        )


def _added(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    if not b:
        return a
    out = dict(a)
    for key, ns in b.items():
        out[key] = out.get(key, 0) + ns
    return out


def thread_key(pid: int, thread_id: int) -> int:
    """One int per (process, thread): the thread ident in the low 64 bits."""
    return (pid << 64) | thread_id


def _by_thread(overhead: list[tuple[int, int, int]], lo: int, hi: int) -> dict[int, list[Interval]]:
    """The overhead in ``[lo, hi)`` per thread, clipped and merged."""
    by_thread: dict[int, list[Interval]] = {}
    for s, e, tid in overhead:
        if e > lo and s < hi:
            iv = (s if s > lo else lo, e if e < hi else hi)
            ivs = by_thread.get(tid)
            if ivs is None:
                by_thread[tid] = [iv]
            else:
                ivs.append(iv)
    return {tid: merge(ivs) for tid, ivs in by_thread.items()}


def _union_and_logical(
    threads: dict[int, list[Interval]], holes: dict[int, list[Interval]]
) -> tuple[list[Interval], int]:
    """A phase's spans (per thread): their union, merged, and its logical time: the union
    over threads of each thread's spans less the overhead on that thread (an observer
    running on another thread did not stall the phase)."""
    if len(threads) == 1:  # the common case: the union is the thread's own
        [(tid, ivs)] = threads.items()
        union = merge(ivs)
        hole = holes.get(tid)
        return union, length(subtract(union, hole) if hole else union)
    kept: list[Interval] = []
    for tid, ivs in threads.items():
        hole = holes.get(tid)
        kept.extend(subtract(merge(ivs), hole) if hole else ivs)
    return merge(iv for ivs in threads.values() for iv in ivs), union_ns(kept)


def measure_window(
    lo: int,
    hi: int,
    spans: list[Piece],
    overhead: list[tuple[int, int, int]],
    config: ObserverConfig,
    *,
    unnamed: Iterable[tuple[int, int, str]] = (),
    publish: Iterable[PublishPiece] = (),
) -> WindowTiming:
    """The :class:`WindowTiming` of ``[lo, hi)`` from the spans and overhead crossing it
    (``unnamed``: the spans among them in no phase that are not waits, as (start, end,
    key); ``publish``: the publish phase's, with the side each ran on)."""
    holes = _by_thread(overhead, lo, hi)
    # phase -> thread -> its spans clipped to the window (phases without spans absent)
    by_phase: dict[str, dict[int, list[Interval]]] = {}
    span_ns = 0
    for phase, start, end, tid in spans:
        if end <= lo or start >= hi:
            continue
        s = start if start > lo else lo
        e = end if end < hi else hi
        span_ns += e - s
        if phase is not None:
            threads = by_phase.get(phase)
            if threads is None:
                by_phase[phase] = {tid: [(s, e)]}
            elif tid in threads:
                threads[tid].append((s, e))
            else:
                threads[tid] = [(s, e)]
    phase_ns = dict.fromkeys(config.phases, 0)
    logical = dict(phase_ns)
    merged: dict[str, list[Interval]] = {}
    for phase, threads in by_phase.items():
        merged[phase], logical[phase] = _union_and_logical(threads, holes)
        phase_ns[phase] = length(merged[phase])
    own = merge(iv for ivs in holes.values() for iv in ivs)
    sides = _sides(lo, hi, merged, publish, config)
    engines_busier = bool(sides) and sides["engines"] > sides["trainer"]
    path, slices, busy = critical_path(lo, hi, merged, own, config, engines_busier=engines_busier)
    overlap_ns = dict.fromkeys(config.pairs, 0)
    if len(merged) > 1:
        for p, q in config.pairs:
            if p in merged and q in merged:
                overlap_ns[p, q] = length(intersect(merged[p], merged[q]))
    return WindowTiming(
        wall_ns=hi - lo,
        overhead_ns=length(own),
        busy_ns=length(busy),
        span_ns=span_ns,
        phase_ns=phase_ns,
        phase_logical_ns=logical,
        overlap_ns=overlap_ns,
        path_ns=path,
        path_slices=slices,
        sides_ns=sides,
        **_idle_work(unnamed, lo, hi, busy),
    )


def _sides(
    lo: int,
    hi: int,
    merged: dict[str, list[Interval]],
    publish: Iterable[PublishPiece],
    config: ObserverConfig,
) -> dict[str, int]:
    """:attr:`WindowTiming.sides_ns` of ``[lo, hi)`` (a streaming run's, else {}): each
    side's union, its phase's spans and the publish pieces that ran on it."""
    if config.streaming is None:
        return {}
    pieces = list(publish)
    trainer_publish = merge(clip([(s, e) for s, e, engines in pieces if not engines], lo, hi))
    engines_publish = merge(clip([(s, e) for s, e, engines in pieces if engines], lo, hi))
    generation, training = config.streaming
    return {
        "trainer": union_ns([*merged.get(training, []), *trainer_publish]),
        "engines": union_ns([*merged.get(generation, []), *engines_publish]),
        "trainer_publish": length(trainer_publish),
        "engines_publish": length(engines_publish),
    }


def _idle_work(
    unnamed: Iterable[tuple[int, int, str]], lo: int, hi: int, busy: list[Interval]
) -> dict[str, Any]:
    """``unnamed_ns`` and ``unnamed_by_name`` of a window: the spans' time in
    ``[lo, hi)`` outside ``busy``, together and per key."""
    by_key: dict[str, list[Interval]] = {}
    for s, e, key in unnamed:
        by_key.setdefault(key, []).append((s, e))
    merged = {key: merge(clip(ivs, lo, hi)) for key, ivs in by_key.items()}
    merged = {key: ivs for key, ivs in merged.items() if ivs}
    if not merged:
        return {}
    every = merge(iv for ivs in merged.values() for iv in ivs)
    idle = {key: length(subtract(ivs, busy)) for key, ivs in merged.items()}
    return {
        "unnamed_ns": length(subtract(every, busy)),
        "unnamed_by_name": {key: ns for key, ns in idle.items() if ns},
    }


#: the keys of :attr:`WindowTiming.sides_ns` (a streaming run's)
SIDE_KEYS = ("trainer", "engines", "trainer_publish", "engines_publish")

#: what the critical path passes through, in the order it is taken (docs/metrics.md,
#: "What limits the run")
PATH_KINDS = ("training", "publish", "generation", "other", "overhead", "idle")


def critical_path(
    lo: int,
    hi: int,
    merged: dict[str, list[Interval]],
    overhead: list[Interval],
    config: ObserverConfig,
    *,
    engines_busier: bool = False,
) -> tuple[dict[str, int], tuple[tuple[str, int, int], ...], list[Interval]]:
    """A window's wall cut by what its length waited on: at each instant the first that
    runs of the busier side's work (the trainer's training, or the engines' generation,
    then the publish phase, then the other side's: ``engines_busier``, the engines'
    union covering more of the window than the trainer's, which the other side waits
    for), then another phase, twinkle's own work, else idle. ``merged``: each phase's
    merged spans in the window; ``overhead``: twinkle's own work in it, merged. Without
    a streaming configuration nothing is known to be training or generation: every
    phase is ``other``. Returns the seconds per kind (in :data:`PATH_KINDS` order), the
    stretches in time order, and the union of every phase (sorted and disjoint;
    touching intervals may stay apart)."""
    roles: list[tuple[str, str | None]] = []
    if config.streaming is not None:
        generation, training = config.streaming
        trainer = [("training", training)]
        engines = [("generation", generation), ("publish", config.publish)]
        roles = [*engines, *trainer] if engines_busier else [*trainer, *reversed(engines)]
    named = {phase for _, phase in roles if phase is not None}
    others = merge(iv for p, ivs in merged.items() if p not in named for iv in ivs)
    parts = [(kind, merged.get(p, []) if p else []) for kind, p in roles]
    path = dict.fromkeys(PATH_KINDS, 0)
    slices: list[tuple[str, int, int]] = []
    # What the parts taken so far run: sorted and disjoint, as each part adds only what
    # none before it covered (a C-level sort of two sorted runs, no merge pass).
    covered: list[Interval] = []
    busy: list[Interval] = []
    for kind, ivs in [*parts, ("other", others), ("overhead", overhead)]:
        if kind == "overhead":
            busy = covered
        exposed = subtract(ivs, covered) if covered else ivs
        if exposed:
            path[kind] = length(exposed)
            slices += [(kind, s, e) for s, e in exposed]
            covered = sorted(covered + exposed) if covered else exposed
    idle = subtract([(lo, hi)], covered) if hi > lo else []
    slices += [("idle", s, e) for s, e in idle]
    path["idle"] = (hi - lo) - sum(path.values())
    # The stretches are disjoint and none is empty: no two start together.
    return path, tuple(sorted(slices, key=_start)), busy


_start = itemgetter(1)


class AttributedTiming(msgspec.Struct, frozen=True):
    """The work done for one iteration wherever it ran, in integer nanoseconds.

    ``phase_sum_ns`` adds span durations (nested/concurrent spans counted each time);
    ``phase_union_ns`` is their union; ``phase_logical_ns`` the union less the overhead on
    the threads the spans ran on; ``span_ns`` adds every attributed span's duration.
    """

    phase_sum_ns: dict[str, int]
    phase_union_ns: dict[str, int]
    phase_logical_ns: dict[str, int]
    phase_spans: dict[str, int]
    spans: int
    span_ns: int
    errors: int


@dataclass(slots=True)
class IterationData:
    """Everything attributed to one iteration, until it is finalised."""

    iteration: int
    #: (phase or None, start_ns, end_ns, error, thread_id, has an iteration attribute)
    spans: list[Attributed] = field(default_factory=list)
    samples: dict[str, list[int]] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    step: int = 0
    wall_ns: int = 0

    def attributed(
        self, config: ObserverConfig, overhead: list[tuple[int, int, int]]
    ) -> AttributedTiming:
        """The attributed view; ``overhead`` holds (start_ns, end_ns, thread_id) of
        twinkle's own work (only the threads a phase's spans ran on are deducted)."""
        # phase -> thread -> its spans (phases without spans absent)
        by_phase: dict[str, dict[int, list[Interval]]] = {}
        sums = dict.fromkeys(config.phases, 0)
        counts = dict(sums)
        errors = span_ns = 0
        for phase, start, end, error, tid, _ in self.spans:
            if error is not None:
                errors += 1
            span_ns += end - start
            if phase is not None:
                threads = by_phase.get(phase)
                if threads is None:
                    by_phase[phase] = {tid: [(start, end)]}
                elif tid in threads:
                    threads[tid].append((start, end))
                else:
                    threads[tid] = [(start, end)]
                sums[phase] += end - start
                counts[phase] += 1
        unions = dict.fromkeys(config.phases, 0)
        logical = dict(unions)
        if by_phase:
            ivs = [iv for threads in by_phase.values() for tivs in threads.values() for iv in tivs]
            # Only the overhead within the phases' spans can be deducted from them.
            holes = _by_thread(overhead, min(ivs)[0], max(e for _, e in ivs))
            for phase, threads in by_phase.items():
                union, logical[phase] = _union_and_logical(threads, holes)
                unions[phase] = length(union)
        return AttributedTiming(
            phase_sum_ns=sums,
            phase_union_ns=unions,
            phase_logical_ns=logical,
            phase_spans=counts,
            spans=len(self.spans),
            span_ns=span_ns,
            errors=errors,
        )
