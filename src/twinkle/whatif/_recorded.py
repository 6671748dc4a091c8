"""What a recorded run did, read from its ``events.jsonl`` as the simulator replays it
(docs/metrics.md, "What if: predicting another configuration").

A streaming run (``config.streaming``) has two kinds of worker the simulator moves:

* **engines**: a worker is a generation span's ``engine`` attribute. Its *item* of an
  iteration is its spans carrying that ``engine`` and ``iteration`` (the demo's
  ``generate`` and ``reward``), in order; its *loads* are its spans of the publish
  phase carrying a ``version`` (``weights.load``). Its ``wait.*`` spans are what the
  schedule makes, not work: the simulator makes its own.
* **the trainer**: the thread that ran the training phase's spans. Its work of an
  iteration is its spans carrying that ``iteration`` (waits left out) and its
  observers' own, each after the gap the thread left before it; the time from its last
  span to the next iteration's start is kept too (the trainer's own untimed work).

How each is read is in :mod:`twinkle.whatif._workers`. Every duration and gap is kept
as recorded, in nanoseconds; what the simulator does with them is in
:mod:`twinkle.whatif._schedule`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.checks import as_int
from twinkle.errors import ReplayError
from twinkle.events import (
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
from twinkle.whatif._types import EngineRecord, Piece, TrainerIteration
from twinkle.whatif._workers import (
    engine_of,
    handoff_ns,
    iteration_of,
    load_of,
    read_engines,
    read_trainer,
    trainer_spans,
    trainer_thread,
    whole_iterations,
)

__all__ = ["EngineRecord", "Piece", "Recorded", "TrainerIteration", "read_recorded", "shifted"]

#: events of an iteration the simulator moves with the trainer's work
_MOVED = (SamplesObserved, ScalarsObserved, OptimizerStep, MemoryReadings)


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
    def wall_offset_ns(self) -> int:
        """The run's wall clock minus its monotonic one (``run_started``'s readings)."""
        return self.first.wall_ns - self.first.monotonic_ns

    @property
    def generation(self) -> str:
        assert self.config.streaming is not None
        return self.config.streaming[0]

    @property
    def training(self) -> str:
        assert self.config.streaming is not None
        return self.config.streaming[1]


class LogReader:
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
        #: the last event's time: the end of a run that did not finish
        self.last_ns = first.monotonic_ns

    def feed(self, event: Event) -> None:
        self.last_ns = max(self.last_ns, event.monotonic_ns)
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
        elif isinstance(event, _MOVED) and as_int(getattr(event, "iteration", None)) is not None:
            self.moved.append(event)
        elif isinstance(event, Snapshot):
            if self.buffer_size is None:
                self.buffer_size = as_int(event.state.get("buffer_size"))
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
    reader = LogReader(log, first)
    for event in events:
        reader.feed(event)
    if len(reader.begins) < 2:
        raise ReplayError(
            f"{log}: {len(reader.begins)} iteration(s) began; twinkle whatif needs a loop of "
            "at least two"
        )
    return _build(reader)


def _build(r: LogReader) -> Recorded:
    config = r.config
    generation, training = config.streaming  # type: ignore[misc]
    phase_of = config.phase_of
    first_begin = min(r.begins.values())
    waits = [s for s in r.spans if s.name.startswith(WAIT_PREFIX)]
    work = [s for s in r.spans if not s.name.startswith(WAIT_PREFIX)]
    engines = read_engines(work, waits, phase_of, generation, r)
    trainer_key = trainer_thread(work, phase_of, training, r.path)
    wait_end = {
        it: s.end_ns
        for s in waits
        if (s.pid, s.thread_id) == trainer_key and (it := iteration_of(s)) is not None
    }
    mine, lead = trainer_spans(work, trainer_key, sorted(r.begins), wait_end, r)
    trainer = read_trainer(mine, lead, wait_end, whole_iterations(engines, r), r)
    modeled = {id(s) for s in work if engine_of(s) is not None and iteration_of(s) is not None}
    modeled |= {id(s) for spans in (*mine.values(), *lead.values()) for s in spans}
    modeled |= {id(s) for s in work if load_of(s, phase_of, config.publish) in r.publications}
    setup_spans = [s for s in work if s.end_ns <= first_begin and id(s) not in modeled]
    last = trainer[-1]
    last_end = last.wait_end_ns + sum(p.gap_ns + p.duration_ns for p in last.pieces)
    teardown_spans = [s for s in work if s.start_ns >= last_end and id(s) not in modeled]
    ages = [
        it - v
        for s in work
        if phase_of(s.name) == generation
        and (it := iteration_of(s)) is not None
        and (v := as_int(s.attrs.get("version"))) is not None
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
        handoff_ns=handoff_ns(trainer, engines),
        setup_events=r.setup_events,
        setup_spans=setup_spans,
        teardown_spans=teardown_spans,
        finished=r.finished,
        engine_wait=_name([w for w in waits if engine_of(w) is not None], "wait.weights"),
        trainer_wait=_name([w for w in waits if (w.pid, w.thread_id) == trainer_key], None),
        load_name=_name(
            [s for s in work if load_of(s, phase_of, config.publish) is not None], "weights.load"
        ),
    )


def _name(spans: list[Span], default: str | None) -> Any:
    """The most common name of ``spans`` (``default`` when there are none)."""
    names = [s.name for s in spans]
    return max(sorted(set(names)), key=names.count) if names else default
