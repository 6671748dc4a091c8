"""The pieces of a recorded run the simulator moves: a span of work, an engine's items
and loads, the trainer's iterations (read by :mod:`twinkle.whatif._recorded`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.events import Event

__all__ = ["EngineRecord", "Piece", "TrainerIteration"]


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
    piece until the next iteration began (the run's end, for the last), the
    iteration's events with their time after the piece that preceded them, and its
    *lead*: the observers' spans still running when it began (their start from the
    begin, often negative), drawn where it begins without taking the trainer's time."""

    iteration: int
    begin_ns: int
    wait_end_ns: int
    pieces: tuple[Piece, ...]
    tail_ns: int
    events: tuple[tuple[int, int, Event], ...]  # (pieces before it, ns after, event)
    lead: tuple[Piece, ...] = ()  # (gap_ns: the start from the begin)
