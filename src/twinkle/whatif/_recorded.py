"""What a recorded run did, read from its ``events.jsonl`` as the simulator replays it
(docs/metrics.md, "What if: predicting another configuration").

A streaming run (``config.streaming``) has two kinds of worker the simulator moves:

* **engines**: a worker is a generation span's ``engine`` attribute. Its *item* of an
  iteration is its spans carrying that ``engine`` and ``iteration`` (the demo's
  ``generate`` and ``reward``), in order; its *loads* are its spans of the publish
  phase carrying a ``version`` (``weights.load``). Its ``wait.*`` spans are what the
  schedule makes, not work: the simulator makes its own.
* **the trainer**: the thread that ran the training phase's spans. Its work of an
  iteration is its spans carrying that ``iteration`` (waits left out), each after the
  gap the thread left before it; the time from its last span to the next iteration's
  start is kept too (the trainer's own untimed work).

Every duration and gap is kept as recorded, in nanoseconds; what the simulator does
with them is in :mod:`twinkle.whatif._schedule`.
"""

from __future__ import annotations

import bisect
import itertools
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle.errors import ReplayError
from twinkle.events import (
    OVERHEAD_SPAN,
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
)
from twinkle.observers import ObserverConfig
from twinkle.observers._waits import WAIT_PREFIX
from twinkle.observers.placement import place_batch
from twinkle.perf import Span
from twinkle.run import iter_events

__all__ = ["EngineRecord", "Piece", "Recorded", "TrainerIteration", "read_recorded", "shifted"]

#: events of an iteration the simulator moves with the trainer's work
_MOVED = (SamplesObserved, ScalarsObserved, OptimizerStep, MemoryReadings)


@dataclass(frozen=True, slots=True)
class Piece:
    """One span of a worker's work: the gap before it (from the previous piece's end,
    or from when the work could begin), its duration and what it was."""

    name: str
    gap_ns: int
    duration_ns: int
    phase: str | None
    attrs: Mapping[str, Any]


@dataclass(slots=True)
class EngineRecord:
    """One engine: its items per iteration, its load time per weight version, and the
    medians of its gaps (before an item, before a load)."""

    name: str
    pid: int
    thread: int
    start_ns: int
    items: dict[int, tuple[Piece, ...]] = field(default_factory=dict)
    #: each item's recorded start (its first piece's)
    starts: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    loads: dict[int, int] = field(default_factory=dict)
    item_gap_ns: int = 0
    load_gap_ns: int = 0

    def item_ns(self, iteration: int) -> int:
        """The item's time from its first piece's start to its last's end."""
        pieces = self.items[iteration]
        return sum(p.duration_ns for p in pieces) + sum(p.gap_ns for p in pieces[1:])

    def item_end(self, iteration: int) -> int:
        """The recorded end of the item."""
        return self.starts[iteration] + self.item_ns(iteration)

    def load_ns(self, version: int) -> int:
        """The load of ``version``, else the median of its loads (0: none recorded)."""
        if version in self.loads:
            return self.loads[version]
        return int(statistics.median(self.loads.values())) if self.loads else 0


@dataclass(frozen=True, slots=True)
class TrainerIteration:
    """The trainer's iteration: when it began, when its rollouts were in (the end of
    its wait), its pieces (the first's gap from that end), the time after the last
    piece until the next iteration began (the run's end, for the last), and the
    iteration's events with their time after the piece that preceded them."""

    iteration: int
    begin_ns: int
    wait_end_ns: int
    pieces: tuple[Piece, ...]
    tail_ns: int
    events: tuple[tuple[int, int, Event], ...]  # (pieces before it, ns after, event)


@dataclass(slots=True)
class Recorded:
    """The recorded run, as the simulator needs it."""

    path: Path
    first: RunStarted
    config: ObserverConfig
    engines: dict[str, EngineRecord]
    trainer: list[TrainerIteration]
    trainer_pid: int
    trainer_thread: int
    lag: int
    buffer_size: int | None
    handoff_ns: int
    setup_events: list[Event]
    setup_spans: list[Span]
    #: the spans the loop's model leaves out that began after the trainer's last work
    teardown_spans: list[Span]
    finished: RunFinished | None
    #: the names of an engine's wait for weights, the trainer's wait for rollouts (None:
    #: it recorded none) and an engine's load of weights
    engine_wait: str = "wait.weights"
    trainer_wait: str | None = None
    load_name: str = "weights.load"

    @property
    def generation(self) -> str:
        assert self.config.streaming is not None
        return self.config.streaming[0]

    @property
    def training(self) -> str:
        assert self.config.streaming is not None
        return self.config.streaming[1]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Reader:
    """One pass over the log: events sorted into what :class:`Recorded` holds."""

    def __init__(self, path: Path, first: RunStarted) -> None:
        self.path = path
        self.first = first
        self.config = ObserverConfig.parse(first.config)
        if self.config.streaming is None:
            raise ReplayError(
                f"{path}: the run has no config.streaming (which phase generates and which "
                "trains): twinkle whatif re-simulates a streaming RL loop and needs both"
            )
        self.spans: list[Span] = []
        self.begins: dict[int, int] = {}
        self.moved: list[Event] = []
        self.setup_events: list[Event] = []
        self.publications: dict[int, WeightsPublished] = {}
        self.buffer_size: int | None = None
        self.finished: RunFinished | None = None

    def feed(self, event: Event) -> None:
        if isinstance(event, SpanBatch):
            shift = place_batch(event, self.first.anchor, self.config.clock_skew).shift_ns
            self.spans.extend(shifted(s, shift) for s in event.spans)
        elif isinstance(event, IterationStarted):
            self.begins.setdefault(event.iteration, event.monotonic_ns)
        elif isinstance(event, RunResumed):
            raise ReplayError(
                f"{self.path}: the run was resumed (segment {event.segment}); twinkle whatif "
                "models one segment's loop: predict from a run that ran in one go"
            )
        elif isinstance(event, WeightsPublished):
            self.publications[event.version] = event
        elif isinstance(event, RunFinished):
            self.finished = event
        elif isinstance(event, _MOVED) and _int(getattr(event, "iteration", None)) is not None:
            self.moved.append(event)
        elif isinstance(event, Snapshot):
            if self.buffer_size is None:
                self.buffer_size = _int(event.state.get("buffer_size"))
        elif not self.begins:
            self.setup_events.append(event)


def shifted(span: Span, shift: int) -> Span:
    """``span`` moved by ``shift`` ns."""
    if not shift:
        return span
    return Span(span.name, span.start_ns + shift, span.end_ns + shift, span.thread_id,
                span.pid, span.attrs, span.error)  # fmt: skip


def read_recorded(run: str | os.PathLike[str]) -> Recorded:
    """Read the run at ``run`` (its directory or its ``events.jsonl``)."""
    path = Path(run)
    log = path / "events.jsonl" if path.is_dir() else path
    events = iter_events(log)
    first = next(events, None)
    if not isinstance(first, RunStarted):
        raise ReplayError(f"{log}: the log must start with run_started")
    reader = _Reader(log, first)
    for event in events:
        reader.feed(event)
    if len(reader.begins) < 2:
        raise ReplayError(
            f"{log}: {len(reader.begins)} iteration(s) began; twinkle whatif needs a loop of "
            "at least two"
        )
    return _build(reader)


def _build(r: _Reader) -> Recorded:
    config = r.config
    generation, training = config.streaming  # type: ignore[misc]
    phase_of = config.phase_of
    first_begin = min(r.begins.values())
    waits = [s for s in r.spans if s.name.startswith(WAIT_PREFIX)]
    work = [s for s in r.spans if not s.name.startswith(WAIT_PREFIX)]
    engines = _engines(work, waits, phase_of, generation, r)
    trainer_key = _trainer_thread(work, phase_of, training, r.path)
    wait_end = {
        it: s.end_ns
        for s in waits
        if (s.pid, s.thread_id) == trainer_key and (it := _it(s)) is not None
    }
    trainer_spans = _trainer_spans(work, trainer_key, sorted(r.begins), wait_end, r)
    trainer = _trainer(trainer_spans, wait_end, r)
    modeled = {id(s) for s in work if _engine_of(s) is not None and _it(s) is not None}
    modeled |= {id(s) for t in trainer_spans.values() for s in t}
    modeled |= {id(s) for s in work if _load_of(s, phase_of, config.publish) in r.publications}
    setup_spans = [s for s in work if s.end_ns <= first_begin and id(s) not in modeled]
    last = trainer[-1]
    last_end = last.wait_end_ns + sum(p.gap_ns + p.duration_ns for p in last.pieces)
    teardown_spans = [s for s in work if s.start_ns >= last_end and id(s) not in modeled]
    ages = [
        it - v
        for s in work
        if phase_of(s.name) == generation
        and (it := _it(s)) is not None
        and (v := _int(s.attrs.get("version"))) is not None
    ]
    return Recorded(
        path=r.path,
        first=r.first,
        config=config,
        engines=engines,
        trainer=trainer,
        trainer_pid=trainer_key[0],
        trainer_thread=trainer_key[1],
        lag=max(ages, default=0),
        buffer_size=r.buffer_size,
        handoff_ns=_handoff(trainer, engines),
        setup_events=r.setup_events,
        setup_spans=setup_spans,
        teardown_spans=teardown_spans,
        finished=r.finished,
        engine_wait=_name([w for w in waits if _engine_of(w) is not None], "wait.weights"),
        trainer_wait=_name([w for w in waits if (w.pid, w.thread_id) == trainer_key], None),
        load_name=_name(
            [s for s in work if _load_of(s, phase_of, config.publish) is not None], "weights.load"
        ),
    )


def _name(spans: list[Span], default: str | None) -> Any:
    """The most common name of ``spans`` (``default`` when there are none)."""
    names = [s.name for s in spans]
    return max(sorted(set(names)), key=names.count) if names else default


def _it(span: Span) -> int | None:
    return _int(span.attrs.get("iteration"))


def _engine_of(span: Span) -> str | None:
    engine = span.attrs.get("engine")
    return engine if isinstance(engine, str) and engine else None


def _load_of(span: Span, phase_of: Any, publish: str | None) -> int | None:
    """The version a span loads onto an engine (a publish-phase span with ``engine``
    and ``version``), else None."""
    if publish is None or phase_of(span.name) != publish or _engine_of(span) is None:
        return None
    return _int(span.attrs.get("version"))


def _median(values: Iterable[int]) -> int:
    listed = list(values)
    return int(statistics.median(listed)) if listed else 0


def _pieces(spans: list[Span], ready_ns: int, phase_of: Any) -> tuple[Piece, ...]:
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


def _engines(
    work: list[Span], waits: list[Span], phase_of: Any, generation: str, r: _Reader
) -> dict[str, EngineRecord]:
    by_item: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for s in work:
        engine, it = _engine_of(s), _it(s)
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
        rec.items[it] = _pieces(spans, spans[0].start_ns, phase_of)
        rec.starts[it] = spans[0].start_ns
        tokens = [_int(s.attrs.get("tokens")) for s in spans if phase_of(s.name) == generation]
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
    rec: EngineRecord, work: list[Span], waits: list[Span], phase_of: Any, r: _Reader
) -> None:
    """The engine's loads, its first start and the medians of its gaps: before an item
    (from the previous item's end or the end of its wait for weights) and before a load
    (from its publication's start or the end of the item it had to finish first)."""
    my_waits = sorted((s for s in waits if _engine_of(s) == rec.name), key=lambda s: s.start_ns)
    ordered = sorted(rec.starts)
    gaps = []
    for prev, it in itertools.pairwise(ordered):
        ready = max(
            [rec.item_end(prev)]
            + [w.end_ns for w in my_waits if rec.item_end(prev) <= w.end_ns <= rec.starts[it]]
        )
        gaps.append(rec.starts[it] - ready)
    rec.item_gap_ns = max(0, _median(gaps))
    first = rec.starts[ordered[0]]
    rec.start_ns = min([first - rec.item_gap_ns] + [w.start_ns for w in my_waits[:1]])
    lag = max((it - v for it in rec.items if (v := _version(rec, it)) is not None), default=0)
    load_gaps = []
    for s in work:
        version = _load_of(s, phase_of, r.config.publish)
        if version is None or _engine_of(s) != rec.name:
            continue
        rec.loads[version] = s.end_ns - s.start_ns
        pub = r.publications.get(version)
        if pub is None:
            continue  # (the initial weights, loaded before the loop)
        needed = version - 1 + lag
        ready = max(pub.start_ns, rec.item_end(needed) if needed in rec.starts else pub.start_ns)
        load_gaps.append(s.start_ns - ready)
    rec.load_gap_ns = max(0, _median(load_gaps))


def _version(rec: EngineRecord, it: int) -> int | None:
    for p in rec.items[it]:
        v = _int(p.attrs.get("version"))
        if v is not None:
            return v
    return None


def _trainer_thread(work: list[Span], phase_of: Any, training: str, path: Path) -> tuple[int, int]:
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for s in work:
        if phase_of(s.name) == training and _it(s) is not None and _engine_of(s) is None:
            counts[s.pid, s.thread_id] += 1
    if not counts:
        raise ReplayError(
            f"{path}: no span of the training phase carries an 'iteration' attribute: "
            "twinkle whatif needs the trainer's work per iteration"
        )
    return max(counts, key=lambda k: counts[k])


def _trainer(
    mine: dict[int, list[Span]], wait_end: dict[int, int], r: _Reader
) -> list[TrainerIteration]:
    order = sorted(r.begins)
    moved: dict[int, list[Event]] = defaultdict(list)
    for event in r.moved:
        moved[event.iteration].append(event)  # type: ignore[attr-defined]
    end = r.finished.monotonic_ns if r.finished is not None else None
    out = []
    for k, it in enumerate(order):
        begin = r.begins[it]
        spans = sorted(mine.get(it, ()), key=lambda s: s.start_ns)
        ready = wait_end.get(it, begin)
        pieces = _pieces(spans, ready, r.config.phase_of)
        last = ready + sum(p.gap_ns + p.duration_ns for p in pieces)
        following = r.begins[order[k + 1]] if k + 1 < len(order) else end
        tail = max(0, following - last) if following is not None else 0
        out.append(
            TrainerIteration(it, begin, ready, pieces, tail, _placed(moved[it], ready, pieces))
        )
    return out


def _trainer_spans(
    work: list[Span], key: tuple[int, int], order: list[int], wait_end: dict[int, int], r: _Reader
) -> dict[int, list[Span]]:
    """The trainer's spans of each iteration: those carrying it, and its observers' own
    (:data:`OVERHEAD_SPAN`) from the end of its wait to the next iteration's start."""
    mine: dict[int, list[Span]] = defaultdict(list)
    starts = [wait_end.get(it, r.begins[it]) for it in order]
    for s in work:
        if (s.pid, s.thread_id) != key:
            continue
        it = _it(s)
        if it is not None and s.name != OVERHEAD_SPAN:
            mine[it].append(s)
        elif s.name == OVERHEAD_SPAN and s.start_ns >= starts[0]:
            k = bisect.bisect_right(starts, s.start_ns) - 1
            if k + 1 == len(order) or s.start_ns < r.begins[order[k + 1]]:
                mine[order[k]].append(s)
    return mine


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


def _handoff(trainer: list[TrainerIteration], engines: Mapping[str, EngineRecord]) -> int:
    """The median time from an iteration's last item (or its start, when the items were
    in already) to the end of the trainer's wait for them."""
    gaps = []
    for t in trainer:
        ends = [e.item_end(t.iteration) for e in engines.values() if t.iteration in e.items]
        if ends:
            gaps.append(t.wait_end_ns - max(t.begin_ns, *ends))
    return max(0, _median(gaps))
