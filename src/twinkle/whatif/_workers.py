"""The engines' and the trainer's work, read from a recorded run's spans
(:mod:`twinkle.whatif._recorded` says what each is)."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinkle.checks import as_int
from twinkle.errors import ReplayError
from twinkle.events import OVERHEAD_SPAN, Event
from twinkle.observers._iteration_attr import iteration_number
from twinkle.perf import Span
from twinkle.whatif._types import EngineRecord, Piece, TrainerIteration

if TYPE_CHECKING:
    from twinkle.whatif._recorded import LogReader

__all__ = [
    "engine_of",
    "handoff_ns",
    "iteration_of",
    "load_of",
    "read_engines",
    "read_trainer",
    "trainer_spans",
    "trainer_thread",
    "whole_iterations",
]


def iteration_of(span: Span) -> int | None:
    return iteration_number(span.attrs.get("iteration"))


def engine_of(span: Span) -> str | None:
    engine = span.attrs.get("engine")
    return engine if isinstance(engine, str) and engine else None


def load_of(span: Span, phase_of: Any, publish: str | None) -> int | None:
    """The version a span loads onto an engine (a publish-phase span with ``engine``
    and ``version``), else None."""
    if publish is None or phase_of(span.name) != publish or engine_of(span) is None:
        return None
    return as_int(span.attrs.get("version"))


def median_ns(values: Iterable[int]) -> int:
    listed = list(values)
    return int(statistics.median(listed)) if listed else 0


def pieces_of(spans: list[Span], ready_ns: int, phase_of: Any) -> tuple[Piece, ...]:
    """``spans`` (sorted, none inside another) as pieces, the first's gap from
    ``ready_ns``."""
    out: list[Piece] = []
    at = ready_ns
    for s in spans:
        if s.end_ns <= at and out:
            continue  # (inside the previous one: its time is counted there)
        gap = max(0, s.start_ns - at)
        out.append(Piece(s.name, gap, s.end_ns - s.start_ns, phase_of(s.name), dict(s.attrs)))
        at = max(at, s.end_ns)
    return tuple(out)


def read_engines(
    work: list[Span], waits: list[Span], phase_of: Any, generation: str, r: LogReader
) -> dict[str, EngineRecord]:
    by_item: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for s in work:
        engine, it = engine_of(s), iteration_of(s)
        if engine is not None and it is not None:
            by_item[engine, it].append(s)
    engines: dict[str, EngineRecord] = {}
    for (name, it), spans in sorted(by_item.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        spans.sort(key=lambda s: s.start_ns)
        if not any(phase_of(s.name) == generation for s in spans):
            continue  # (an engine's span of an iteration that generated nothing)
        rec = engines.get(name)
        if rec is None:
            rec = engines[name] = EngineRecord(name, spans[0].pid, spans[0].thread_id, 0)
        rec.items[it] = pieces_of(spans, spans[0].start_ns, phase_of)
        rec.starts[it] = spans[0].start_ns
        tokens = [as_int(s.attrs.get("tokens")) for s in spans if phase_of(s.name) == generation]
        if any(t is not None for t in tokens):
            rec.tokens[it] = sum(t for t in tokens if t is not None)
    if not engines:
        raise ReplayError(
            f"{r.path}: no generation span carries an 'engine' and an 'iteration' attribute: "
            "twinkle whatif needs them to tell the engines' work apart"
        )
    for rec in engines.values():
        _engine_gaps(rec, work, waits, phase_of, r)
    return engines


def _engine_gaps(
    rec: EngineRecord, work: list[Span], waits: list[Span], phase_of: Any, r: LogReader
) -> None:
    """The engine's loads, its first start and the medians of its gaps: before an item
    (from the previous item's end or the end of its wait for weights) and before a load
    (from its publication's start or the end of the item it had to finish first)."""
    my_waits = sorted((s for s in waits if engine_of(s) == rec.name), key=lambda s: s.start_ns)
    ordered = sorted(rec.starts)
    gaps = []
    for prev, it in itertools.pairwise(ordered):
        ready = max(
            [rec.item_end(prev)]
            + [w.end_ns for w in my_waits if rec.item_end(prev) <= w.end_ns <= rec.starts[it]]
        )
        gaps.append(rec.starts[it] - ready)
    rec.item_gap_ns = max(0, median_ns(gaps))
    first = rec.starts[ordered[0]]
    rec.start_ns = min([first - rec.item_gap_ns] + [w.start_ns for w in my_waits[:1]])
    lag = max((it - v for it in rec.items if (v := _version(rec, it)) is not None), default=0)
    load_gaps = []
    for s in work:
        version = load_of(s, phase_of, r.config.publish)
        if version is None or engine_of(s) != rec.name:
            continue
        rec.loads[version] = s.end_ns - s.start_ns
        pub = r.publications.get(version)
        if pub is None:
            continue  # (the initial weights, loaded before the loop)
        needed = version - 1 + lag
        ready = max(pub.start_ns, rec.item_end(needed) if needed in rec.starts else pub.start_ns)
        load_gaps.append(s.start_ns - ready)
    rec.load_gap_ns = max(0, median_ns(load_gaps))


def _version(rec: EngineRecord, it: int) -> int | None:
    for p in rec.items[it]:
        v = as_int(p.attrs.get("version"))
        if v is not None:
            return v
    return None


def trainer_thread(work: list[Span], phase_of: Any, training: str, path: Path) -> tuple[int, int]:
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for s in work:
        if phase_of(s.name) == training and iteration_of(s) is not None and engine_of(s) is None:
            counts[s.pid, s.thread_id] += 1
    if not counts:
        raise ReplayError(
            f"{path}: no span of the training phase carries an 'iteration' attribute: "
            "twinkle whatif needs the trainer's work per iteration"
        )
    return max(counts, key=lambda k: counts[k])


def whole_iterations(engines: Mapping[str, EngineRecord], r: LogReader) -> list[int]:
    """The iterations every engine made its item of: all but those the run stopped in
    (at its end); an iteration missing an item before that is refused, by name."""
    order = sorted(r.begins)
    missing = {it: [e for e in engines if it not in engines[e].items] for it in order}
    whole = [it for it in order if not missing[it]]
    cut = [it for it in order if missing[it]]
    if len(whole) < 2:
        raise ReplayError(
            f"{r.path}: {len(whole)} iteration(s) have every engine's rollouts; twinkle "
            "whatif needs a loop of at least two"
        )
    if cut and cut[0] < whole[-1]:
        it = cut[0]
        raise ReplayError(
            f"{r.path}: iteration {it} has no rollout from engine(s) "
            f"{', '.join(sorted(missing[it]))}: twinkle whatif needs every engine's share "
            "of each iteration (only the iterations a run stopped in, at its end, are left out)"
        )
    return whole


def read_trainer(
    mine: dict[int, list[Span]],
    lead: dict[int, list[Span]],
    wait_end: dict[int, int],
    whole: list[int],
    r: LogReader,
) -> list[TrainerIteration]:
    """The trainer's iterations ``whole``; the last one's tail runs to the next
    iteration's start (one the run stopped in), else to the run's end."""
    order = sorted(r.begins)
    moved: dict[int, list[Event]] = defaultdict(list)
    for event in r.moved:
        moved[event.iteration].append(event)  # type: ignore[attr-defined]
    end = r.finished.monotonic_ns if r.finished is not None else r.last_ns
    out = []
    for k, it in enumerate(order):
        if it not in whole:
            continue
        begin = r.begins[it]
        spans = sorted(mine.get(it, ()), key=lambda s: s.start_ns)
        ready = wait_end.get(it, begin)
        pieces = pieces_of(spans, ready, r.config.phase_of)
        last = ready + sum(p.gap_ns + p.duration_ns for p in pieces)
        following = r.begins[order[k + 1]] if k + 1 < len(order) else end
        tail = max(0, following - last)
        out.append(
            TrainerIteration(
                it,
                begin,
                ready,
                pieces,
                tail,
                _placed(moved[it], ready, pieces),
                tuple(
                    Piece(s.name, s.start_ns - begin, s.end_ns - s.start_ns, None, dict(s.attrs))
                    for s in lead.get(it, ())
                ),
            )
        )
    return out


def trainer_spans(
    work: list[Span], key: tuple[int, int], order: list[int], wait_end: dict[int, int], r: LogReader
) -> tuple[dict[int, list[Span]], dict[int, list[Span]]]:
    """The trainer's spans of each iteration: those carrying it, and its observers' own
    (:data:`OVERHEAD_SPAN`) from the end of its wait until the next iteration's start;
    and each iteration's lead (an observer's span still running when it began)."""
    mine: dict[int, list[Span]] = defaultdict(list)
    lead: dict[int, list[Span]] = defaultdict(list)
    starts = [wait_end.get(it, r.begins[it]) for it in order]
    for s in work:
        if (s.pid, s.thread_id) != key:
            continue
        it = iteration_of(s)
        if it is not None and s.name != OVERHEAD_SPAN:
            mine[it].append(s)
        elif s.name == OVERHEAD_SPAN and s.start_ns >= starts[0]:
            k = bisect.bisect_right(starts, s.start_ns) - 1
            if k + 1 == len(order) or s.end_ns <= r.begins[order[k + 1]]:
                mine[order[k]].append(s)
            else:
                lead[order[k + 1]].append(s)
    return mine, lead


def _placed(
    events: list[Event], ready: int, pieces: tuple[Piece, ...]
) -> tuple[tuple[int, int, Event], ...]:
    """Each event with the number of pieces that ended before it and its time after the
    last of them (or after the wait's end)."""
    ends, at = [], ready
    for p in pieces:
        at += p.gap_ns + p.duration_ns
        ends.append(at)
    out = []
    for event in events:
        t = event.monotonic_ns
        before = sum(1 for e in ends if e <= t)
        since = ends[before - 1] if before else ready
        out.append((before, max(0, t - since), event))
    return tuple(out)


def handoff_ns(trainer: list[TrainerIteration], engines: Mapping[str, EngineRecord]) -> int:
    """The median time from an iteration's last item (or its start, when the items were
    in already) to the end of the trainer's wait for them."""
    gaps = []
    for t in trainer:
        ends = [e.item_end(t.iteration) for e in engines.values() if t.iteration in e.items]
        if ends:
            gaps.append(t.wait_end_ns - max(t.begin_ns, *ends))
    return max(0, median_ns(gaps))
