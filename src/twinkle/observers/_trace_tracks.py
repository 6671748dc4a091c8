"""The trace's tracks: which track an interval is drawn on (lanes for spans that
overlap without nesting), what a track is named after, and the marker tracks of the
run's process (:class:`~twinkle.observers._trace_lines.TraceLines`, "Tracks")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, final

from twinkle.observers._config import ObserverConfig

__all__ = [
    "ARROW_MEMORY",
    "ITERATIONS_TRACK",
    "LANE_MEMORY",
    "PATH_TRACK",
    "TRAINER_TRACK",
    "WEIGHTS_TRACK",
    "PathSlices",
    "Track",
    "nest",
    "trim",
    "training_phase",
]

#: the marker tracks of the run's process: iteration starts, weight publishes, what each
#: window's length waited on
ITERATIONS_TRACK = "iterations"
WEIGHTS_TRACK = "weights"
PATH_TRACK = "critical path"


@dataclass(frozen=True, slots=True)
class PathSlices:
    """A finalised window's critical path, queued for the trace like an event."""

    TYPE: ClassVar[str] = "critical path"
    slices: tuple[tuple[str, int, int], ...]


#: the name of a track carrying the run's training phase
TRAINER_TRACK = "trainer"
#: arrow ends remembered while they wait for their other end (per side)
ARROW_MEMORY = 4096


def training_phase(config: ObserverConfig | None) -> str | None:
    """The run's training phase: ``streaming.training``, else a phase named ``train``."""
    if config is None:
        return None
    if config.streaming is not None:
        return config.streaming[1]
    return "train" if "train" in config.phases else None


@final
class Track:
    """One track of the trace and what it has carried so far (its name follows from
    that at close: :class:`~twinkle.observers._trace_lines.TraceLines`, "Tracks")."""

    __slots__ = ("key", "label", "own", "roles", "tid", "trainer", "where")

    def __init__(self, pid: int, tid: int, label: str | None, where: str | None) -> None:
        self.tid = tid
        self.key = (pid, tid)  # its lines' key in the trace's budget
        self.label = label  # a marker track's fixed name
        self.where = where  # "thread N", "thread N, lane k", "lane k" or None
        self.trainer = False  # carried a span of the run's training phase
        self.roles: dict[str, int] = {}  # the caller's spans per role, in order seen
        self.own: str | None = None  # the source of twinkle's first span here

    def title(self) -> str:
        if self.label is not None:
            label = self.label
        elif self.trainer:
            label = TRAINER_TRACK
        elif self.roles:
            label = max(self.roles, key=self.roles.__getitem__)  # a tie: the first seen
        else:
            label = self.own or "spans"
        return label if self.where is None else f"{label} ({self.where})"


#: outermost spans remembered per lane, the oldest of them as one stretch (a span
#: reaching back into that stretch nests only when it encloses it whole)
LANE_MEMORY = 512


def nest(tops: list[tuple[int, int]], start: int, end: int) -> bool:
    """Put the span ``[start, end)`` on the lane whose outermost spans are ``tops``
    (disjoint, in time order) when it nests with all of them, and say whether it did.

    Spans of one thread arrive in the order they closed, so a newcomer either lies
    inside the last outermost span, or after the spans it does not enclose: it must
    enclose every outermost span it reaches back into, never start in the middle of
    one. Amortised O(1): the spans it encloses leave the list for it."""
    if tops and end < tops[-1][1]:  # closed before the last: only inside it is safe
        last_start, last_end = tops[-1]
        return last_start <= start and end <= last_end
    first = len(tops)
    while first and tops[first - 1][1] > start:
        first -= 1
    if first < len(tops) and tops[first][0] < start:
        return False  # it starts in the middle of a span it does not enclose
    del tops[first:]
    tops.append((start, end))
    trim(tops)
    return True


def trim(tops: list[tuple[int, int]]) -> None:
    """Keep a lane's outermost spans to :data:`LANE_MEMORY`: the oldest become one
    stretch, from the first's start to the last's end. A span reaching back into it
    then nests only when it encloses it whole (else it goes to another lane: never one
    drawn half over a span forgotten), and it is never the lane's last (``nest``
    checks a newcomer that closed first against the last only)."""
    if len(tops) > LANE_MEMORY:
        cut = len(tops) - LANE_MEMORY + 1
        tops[:cut] = [(tops[0][0], tops[cut - 1][1])]
