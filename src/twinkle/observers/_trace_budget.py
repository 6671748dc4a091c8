"""The trace's size budget: which windows ``trace.json`` shows in full, which only in
outline, and which it leaves out (docs/metrics.md, "The trace and its budget").

The trace's lines are held per window of the run (a segment's set-up, then each
iteration's, by the time a line starts) until the window is decided:

* the newest windows are held while their lines fit in a quarter of the budget: at
  the end they are written in full (the tail: what a run did last);
* once the held lines pass that quarter, the oldest held window is decided. It is
  written in full when it is *notable* (a segment's set-up, its first
  :data:`FIRST_WINDOWS` iterations, the last iteration before it finished, or a *slow*
  one: its wall clock at least :data:`SLOW_FACTOR` times the lower median of the
  iteration windows before it, once :data:`SLOW_AFTER` were) while the windows in full
  fit in half the budget, or when it is any other window while the windows in full and
  the held ones fit in half (so a run whose trace fits in half its budget is written
  whole, and a long one keeps a quarter for its notable windows);
* else it keeps its outline (its iteration marker, weight publishes and critical path,
  not its spans, memory counters and arrows) while the outlines fit in an eighth; past
  that, it is left out.

A line arriving for a window already decided follows its fate while its share of the
budget holds it, else is left out. The held lines are bounded by the tail's quarter
(a window larger than that alone is decided at once, while still open), so the
sink's memory is too. Without a budget (``config.trace.budget_mb`` null) every line
is written as it comes.

A line may name the track it is drawn on (``(pid, tid)``; a counter's tid is 0): the
budget notes the tracks that a written line is on (:attr:`TraceBudget.shown`), so that
only those are named at the end (:meth:`TraceBudget.names`, in the last eighth), never
a track whose lines were all left out.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIRST_WINDOWS", "SLOW_AFTER", "SLOW_FACTOR", "Key", "TraceBudget"]

#: the track a line is drawn on: (pid, tid); None: a line on no track of its own
Key = tuple[int, int] | None

#: iterations of each segment written in full (the pipeline filling)
FIRST_WINDOWS = 3
#: a window this many times the median wall clock of the ones before it is slow...
SLOW_FACTOR = 2
#: ...once this many came before it
SLOW_AFTER = 3


class Fate(enum.IntEnum):
    LEFT_OUT = 0
    OUTLINE = 1
    FULL = 2

    def __reduce_ex__(self, protocol: object) -> tuple[type[Fate], tuple[int]]:
        # By value on every Python: early 3.11 releases (3.11.2, Debian 12's) pickle a
        # member as getattr(class, name), which a checkpoint's unpickler refuses (a
        # getattr reaches anything), so no checkpoint there would ever serve a resume.
        return Fate, (int(self),)


@dataclass(slots=True)
class _Window:
    start_ns: int
    notable: bool
    iteration: bool  # an iteration's (not a set-up's)
    end_ns: int | None = None
    outline: list[bytes] = field(default_factory=list)
    detail: list[bytes] = field(default_factory=list)
    #: the tracks its outline lines and its detail lines are on
    outline_keys: set[Key] = field(default_factory=set)
    detail_keys: set[Key] = field(default_factory=set)
    spans: int = 0
    outline_bytes: int = 0
    detail_bytes: int = 0

    @property
    def size(self) -> int:
        return self.outline_bytes + self.detail_bytes


class _LowerMedian:
    """The lower median of the values added so far, each added in O(log n): the lower
    half in a max-heap (negated), the upper half in a min-heap."""

    def __init__(self) -> None:
        self._low: list[int] = []  # negated; never shorter than the upper half
        self._high: list[int] = []

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    def value(self) -> int:
        return -self._low[0]

    def add(self, value: int) -> None:
        if self._low and value > -self._low[0]:
            heapq.heappush(self._high, value)
        else:
            heapq.heappush(self._low, -value)
        if len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))
        elif len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))


class TraceBudget:
    """Holds the trace's lines per window and hands out those to write (see the module
    doc); ``budget_bytes`` None writes every line at once."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget = budget_bytes
        self._starts: list[int] = []  # every window's start, in order
        self._fates = bytearray()  # per window decided: its Fate
        self._held: deque[tuple[int, _Window]] = deque()  # (index, window), oldest first
        self._held_bytes = 0
        self._newest: _Window | None = None  # (held or, when alone too large, decided)
        self._walls = _LowerMedian()  # of every closed iteration window's wall clock
        self._segment_iterations = 0
        self._ready: list[bytes] = []  # lines to write
        self.used = {Fate.FULL: 0, Fate.OUTLINE: 0}  # bytes written by windows' fates
        self.windows = dict.fromkeys(Fate, 0)
        self.spans_left_out = 0
        self.lines_left_out = 0
        self.names_left_out = 0
        #: the tracks a written line is on (None among them: lines on none)
        self.shown: set[Key] = set()

    # -- the windows -------------------------------------------------------------------

    def open(self, at_ns: int, *, iteration: bool) -> None:
        """A window opens at ``at_ns``: an iteration's, or a segment's set-up."""
        if self.budget is None:
            self.windows[Fate.FULL] += 1
            return
        if self._starts:
            at_ns = max(at_ns, self._starts[-1])  # (never before the last: by time order)
        self._close_newest(at_ns)
        if iteration:
            self._segment_iterations += 1
        else:
            self._segment_iterations = 0
        notable = not iteration or self._segment_iterations <= FIRST_WINDOWS
        self._starts.append(at_ns)
        self._fates.append(Fate.FULL)  # (until decided: held)
        self._newest = _Window(at_ns, notable, iteration)
        self._held.append((len(self._starts) - 1, self._newest))
        self._decide_over_budget()

    def segment_finished(self, at_ns: int) -> None:
        """The segment finished at ``at_ns``: its last window is notable (if still
        held)."""
        if self._newest is not None:
            self._newest.notable = True
            self._close_newest(at_ns)

    def _close_newest(self, end_ns: int) -> None:
        window = self._newest
        if window is None or window.end_ns is not None:
            return
        window.end_ns = max(end_ns, window.start_ns)
        if window.iteration:
            wall = window.end_ns - window.start_ns
            walls = self._walls
            if len(walls) >= SLOW_AFTER and wall >= SLOW_FACTOR * walls.value():
                window.notable = True
            walls.add(wall)

    # -- the lines ---------------------------------------------------------------------

    def add(
        self,
        at_ns: int,
        line: bytes,
        *,
        outline: bool = False,
        span: bool = False,
        key: Key = None,
    ) -> None:
        """A line of the trace, in the window holding ``at_ns`` (an ``outline`` line:
        a marker, a weight publish, a critical-path slice; a ``span``'s line counts as
        one when left out), on track ``key``."""
        if self.budget is None or not self._starts:  # (no window yet: nothing holds it)
            self._ready.append(line)
            self.shown.add(key)
            return
        starts = self._starts
        if at_ns >= starts[-1]:  # the newest window's: most lines
            index = len(starts) - 1
        else:  # (a line before the first window's start is the first window's)
            index = max(bisect.bisect_right(starts, at_ns) - 1, 0)
        first_held = self._held[0][0] if self._held else len(self._starts)
        if index >= first_held:
            window = self._held[index - first_held][1]
            if outline:
                window.outline.append(line)
                window.outline_bytes += len(line) + 2
                window.outline_keys.add(key)
            else:
                window.detail.append(line)
                window.detail_bytes += len(line) + 2
                window.detail_keys.add(key)
                window.spans += span
            self._held_bytes += len(line) + 2
            self._decide_over_budget()
            return
        fate = Fate(self._fates[index])
        if fate == Fate.OUTLINE and not outline:
            fate = Fate.LEFT_OUT
        if fate != Fate.LEFT_OUT and self.used[fate] + len(line) + 2 <= self._cap(fate):
            self._ready.append(line)
            self.used[fate] += len(line) + 2
            self.shown.add(key)
        else:
            self.lines_left_out += 1
            self.spans_left_out += span

    def add_spans(self, lines: list[tuple[int, bytes, Key]]) -> None:
        """Spans' lines, each ``(at_ns, line, key)``, as :meth:`add` takes them one by
        one (the same decisions, in order): those of the newest window, still held,
        without a call each (a worker's batch of spans is mostly that)."""
        starts = self._starts
        if self.budget is None or not starts or not self._held or self._newest is None:
            for at_ns, line, key in lines:
                self.add(at_ns, line, span=True, key=key)
            return
        newest_at, tail = starts[-1], self.budget // 4
        newest, held = self._newest, self._held
        newest_held = held[-1][1] is newest
        for at_ns, line, key in lines:
            if newest_held and at_ns >= newest_at:
                newest.detail.append(line)
                newest.detail_bytes += len(line) + 2
                newest.detail_keys.add(key)
                newest.spans += 1
                self._held_bytes += len(line) + 2
                if self._held_bytes > tail:
                    self._decide_over_budget()
                    newest_held = bool(held)  # (decided oldest first: the newest is last)
            else:
                self.add(at_ns, line, span=True, key=key)
                newest_held = bool(held) and held[-1][1] is newest

    def ready(self) -> list[bytes]:
        """The lines decided since the last call, to write now."""
        out, self._ready = self._ready, []
        return out

    def finish(self) -> list[bytes]:
        """Everything still held: the tail, in full (older windows decided as usual
        while it is over its budget)."""
        if self.budget is not None:
            while self._held:
                self._write(*self._held.popleft(), Fate.FULL)
        return self.ready()

    def names(self, lines: list[bytes]) -> list[bytes]:
        """Of the name lines ``lines`` (of the tracks and processes in :attr:`shown`,
        the first to name first), those that fit in the budget's last eighth; the
        others are left out, counted."""
        if self.budget is None:
            return lines
        cap, used = self.budget // 8, 0
        for count, line in enumerate(lines):
            used += len(line) + 2
            if used > cap:
                self.names_left_out += len(lines) - count
                return lines[:count]
        return lines

    def note(self) -> dict[str, Any]:
        """What the trace left out, for its ``args``."""
        return {
            "budget_bytes": self.budget,
            "windows_in_full": self.windows[Fate.FULL],
            "windows_in_outline": self.windows[Fate.OUTLINE],
            "windows_left_out": self.windows[Fate.LEFT_OUT],
            "spans_left_out": self.spans_left_out,
            "lines_left_out": self.lines_left_out,
            "names_left_out": self.names_left_out,
        }

    # -- deciding ----------------------------------------------------------------------

    def _decide_over_budget(self) -> None:
        tail = (self.budget or 0) // 4
        while self._held_bytes > tail:
            index, window = self._held[0]
            fate = self._fate(window)
            self._held.popleft()  # (after the fate: the ones held count for it)
            self._write(index, window, fate)

    def _cap(self, fate: Fate) -> int:
        """The bytes the windows of ``fate`` may take: half the budget in full, an
        eighth in outline."""
        return (self.budget or 0) // (2 if fate == Fate.FULL else 8)

    def _fate(self, window: _Window) -> Fate:
        full = self.used[Fate.FULL] + (window.size if window.notable else self._held_bytes)
        if full <= self._cap(Fate.FULL):
            return Fate.FULL
        if self.used[Fate.OUTLINE] + window.outline_bytes <= self._cap(Fate.OUTLINE):
            return Fate.OUTLINE
        return Fate.LEFT_OUT

    def _write(self, index: int, window: _Window, fate: Fate) -> None:
        self._held_bytes -= window.size
        self._fates[index] = fate
        self.windows[fate] += 1
        if fate == Fate.LEFT_OUT:
            self.lines_left_out += len(window.outline) + len(window.detail)
            self.spans_left_out += window.spans
        else:
            self._ready += window.outline
            self.shown |= window.outline_keys
            if fate == Fate.FULL:
                self._ready += window.detail
                self.shown |= window.detail_keys
                self.used[Fate.FULL] += window.size
            else:
                self.lines_left_out += len(window.detail)
                self.spans_left_out += window.spans
                self.used[Fate.OUTLINE] += window.outline_bytes
        window.outline, window.detail = [], []  # (written or left out: not held)
        window.outline_keys, window.detail_keys = set(), set()
