"""The first pass of a resuming session over the run's log (:class:`Scan`): what the
log holds and where it stops, checked before anything is opened or written; from a
checkpoint, only the events after it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    read_back,
)
from twinkle.observers import ClockSkewTolerance
from twinkle.observers.placement import LatestTime
from twinkle.observers.sinks import EVENTS_FILE
from twinkle.run._checkpoint import Checkpoint
from twinkle.run._config import resumable_key
from twinkle.run._replay import iter_events
from twinkle.run._run import Run

__all__ = ["Scan", "fixed_config", "logged_events", "note", "scan_of"]


@dataclass(slots=True)
class Scan:
    """The first pass over an existing log (before anything is opened or written)."""

    started: RunStarted
    #: the latest time the events reach on the run's clock (spans placed as the
    #: timeline places them: from ``started``'s anchor, under the run's skew tolerance)
    latest: LatestTime
    events: int = 0
    segments: int = 1
    finished: RunFinished | None = None
    last_iteration: int | None = None
    optimizer_steps: int = 0


def logged_events(log: Path, checkpoint: Checkpoint | None) -> Iterator[Any]:
    """The log's events: after ``checkpoint``'s when there is one, else all. A torn last
    line is not logged: the resume's event log moves it aside and says so."""
    after = None if checkpoint is None else (checkpoint.files[EVENTS_FILE].size, checkpoint.events)
    return iter_events(log, after=after, warn_torn=False)


def scan_of(checkpoint: Checkpoint, checker: Run) -> Scan:
    """The scan of the events ``checkpoint`` stands for (its figures), and ``checker``
    given its segments and order, to check the events after them."""
    state, figures = checkpoint.state(), checkpoint.scan
    segments = state["segments"]
    checker.segments = [dataclasses.replace(s) for s in segments]  # (its own: it adds)
    checker.restore_order(state["order"])
    started = segments[0].start
    latest = LatestTime(started.anchor, ClockSkewTolerance.parse(started.config))
    latest.ns, latest.wall_ns = figures["last_ns"], figures["last_wall_ns"]
    return Scan(
        started,
        latest,
        events=checkpoint.events,
        segments=figures["segments"],
        finished=segments[-1].finish,
        last_iteration=figures["last_iteration"],
        optimizer_steps=figures["optimizer_steps"],
    )


def fixed_config(config: Any) -> bytes:
    """``config`` but for the keys a resume may change (:func:`resumable_key`), as
    comparable bytes (plain JSON data, keys sorted)."""
    fixed = {k: v for k, v in read_back(config).items() if not resumable_key(k)}
    return orjson.dumps(fixed, option=orjson.OPT_SORT_KEYS)


def note(scan: Scan, event: Any) -> None:
    """Fold one checked event of an existing log into its scan."""
    scan.events += 1
    kind = type(event)
    # (spans where the timeline puts them: a skewed worker's must not carry its clock
    # into the next segment's, through the resumed clock's start)
    scan.latest.note(event)
    if kind is IterationStarted:
        scan.last_iteration = event.iteration
    elif kind is OptimizerStep:
        scan.optimizer_steps = event.step
    elif kind is RunFinished:
        scan.finished = event
    elif kind is RunResumed:
        scan.finished = None
        scan.segments += 1
