"""The run's timeline itself: :class:`Timeline`, fed one event at a time, places every
span in the windows that tile the run and hands out each iteration once finalised.
What the windows and the two views mean is :mod:`twinkle.observers.timeline`'s
docstring (and docs/metrics.md); the built-in observer there owns one per run."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, cast

from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    SpanBatch,
)
from twinkle.hookspecs import OVERHEAD_SPAN
from twinkle.observers._config import ObserverConfig
from twinkle.observers._finalised import DRAIN, PARTIAL, WARMUP, Finished, RunTiming
from twinkle.observers._iteration_attr import iteration_of
from twinkle.observers._measure import (
    Attributed,
    IterationData,
    Piece,
    WindowTiming,
    measure_window,
)
from twinkle.observers._no_phase import NoPhase
from twinkle.observers._publish_sides import PublishSides
from twinkle.observers._span_ledger import SpanLedger
from twinkle.observers._waits import WAIT_PREFIX
from twinkle.observers._workers import WorkerPiece, measure_workers
from twinkle.observers.placement import SkewLedger, place_batch
from twinkle.perf import ClockAnchor

__all__ = ["Timeline"]


@dataclass(slots=True)
class _Window:
    """A window not yet finalised: its iteration (None: set-up) and bounds."""

    iteration: int | None
    start_ns: int
    end_ns: int | None = None
    closed_at: int = 0  # the number of the boundary that closed it (1 = the first)
    flags: tuple[str, ...] = ()  # an iteration's: WARMUP, DRAIN or PARTIAL


class Timeline:
    """Places events on the run's timeline and hands out iterations when finalised.

    One per run, fed once per event by
    :class:`~twinkle.observers.timeline.TimelineObserver`; the observers that read it
    (timing, throughput, memory, scalars) find it in the run's stash
    (:data:`~twinkle.observers.timeline.TIMELINE`).
    """

    def __init__(self) -> None:
        self.config = ObserverConfig.parse({})
        self.anchor: ClockAnchor | None = None
        #: windows not yet finalised, oldest first (the newest is open)
        self.windows: deque[_Window] = deque()
        self.boundaries = 0
        #: end of the last finalised window: time before it is in no more window
        self.horizon: int | None = None
        self.pieces: list[Piece] = []
        #: (start, end, key) of the pieces of spans in no phase but waits: work no phase
        #: names (the key: :meth:`NoPhase.add`'s)
        self.unnamed: list[tuple[int, int, str]] = []
        #: every span's worker and wait name, kept as long as its piece would be
        self.worker_pieces: list[WorkerPiece] = []
        self.publish = PublishSides()  # (the side of the pipeline each publish piece ran on)
        self.overhead: list[tuple[int, int, int]] = []
        #: the start of the newest finalised window: overhead is kept from there on (or
        #: from an earlier start of a span attributed to an iteration not finalised), for
        #: the late spans of the iterations still open (:meth:`_prune_overhead`)
        self._kept_from: int | None = None
        #: spans without an iteration attribute that start in the set-up window while it
        #: is the newest: the first boundary may still fall before one's start and take
        #: it for its iteration (:meth:`_split_newest`); never more than the set-up's
        #: pieces, which its window view holds until then anyway
        self._setup_spans: list[Attributed] = []
        self.open: dict[int, IterationData] = {}  # started, not finalised
        self.future: dict[int, IterationData] = {}  # observed, not (yet) started
        #: the newest finalised iteration: one at or below it that is not open is late
        #: (a high-water mark, not a set: memory stays O(1) per iteration)
        self.finalised_upto: int | None = None
        #: the iterations the last boundary (or the finish) finalised
        self.finished: list[Finished] = []
        self.run: RunTiming | None = None
        self._totals = WindowTiming.empty(self.config)
        self._setup = self._before_work = WindowTiming.empty(self.config)
        self._loop = WindowTiming.empty(self.config)
        self._first_work_ns: int | None = None
        #: where spans of a tear-down phase started (as sent, not clipped), since the
        #: newest boundary: the first of them in the last window ends the loop
        self._teardown_starts: list[int] = []
        self._setup_open = False  # a set-up window (of the run or a resumed segment) is
        self._tail_ns: int | None = None  # the end of the last segment's tear-down
        self._floor: int | None = None  # a resumed segment's set-up starts no earlier
        self._teardown = WindowTiming.empty(self.config)
        self.late_spans = self.late_ns = 0
        self.late_samples = 0
        self.misnumbered: set[tuple[str, str]] = set()  # (source, span name) said once
        #: worker batches checked for clock skew, and those placed by their arrival
        self.skew = SkewLedger()
        #: where every span went: by the place it was given, and by its source
        self.ledger = SpanLedger()
        self.unstarted: dict[int, IterationData] = {}
        #: the spans no phase names (twinkle's own and waits aside), by name
        self.no_phase = NoPhase()
        self.step = 0
        self.optimizer_steps = 0

    # -- events ----------------------------------------------------------------------

    def run_started(self, event: RunStarted) -> None:
        self.config = ObserverConfig.parse(event.config)
        self.publish = PublishSides.of(self.config)
        self.anchor = event.anchor
        self.skew = SkewLedger(self.config.clock_skew)
        self._totals = self._setup = self._before_work = WindowTiming.empty(self.config)
        self._loop = self._teardown = WindowTiming.empty(self.config)
        self._setup_open = True
        self.windows.append(_Window(None, event.monotonic_ns))

    def run_resumed(self, event: RunResumed) -> None:
        """A new segment begins (after the previous one's :meth:`run_finished`): the run's
        figures go on accumulating; a set-up window opens at the resume, and the time
        between the previous segment's tear-down and the resume is in no window."""
        self.run = None
        self.finished = []
        if self._tail_ns is not None:
            self.horizon = (
                self._tail_ns if self.horizon is None else max(self.horizon, self._tail_ns)
            )
        self._floor = self.horizon
        self._first_work_ns = None
        self._setup_open = True
        # What arrived after the previous segment finished belongs to no window of this
        # one (the segment's set-up would otherwise reach back over the gap).
        start = event.monotonic_ns
        self.pieces = [p for p in self.pieces if p[1] >= start]
        self.unnamed = [iv for iv in self.unnamed if iv[0] >= start]
        self.worker_pieces = [p for p in self.worker_pieces if p[2] >= start]
        self.publish.keep(from_start=start)
        self.overhead = [iv for iv in self.overhead if iv[0] >= start]
        self.windows.append(_Window(None, start))

    def iteration_started(self, event: IterationStarted) -> list[Finished]:
        """Open ``event.iteration``; returns (and keeps in :attr:`finished`) the
        iterations this boundary finalises."""
        # Spans without an attribute published before the boundary but starting at or
        # after it are this iteration's: attribution is by start time, not publish order
        # (the bus reads a boundary's time before it flushes the recorders).
        starting_here = self._split_newest(event.monotonic_ns)
        self._close_window(event.monotonic_ns, event.wall_ns)
        self.boundaries += 1
        # Only a tear-down span starting in the last window can end the loop.
        self._teardown_starts = [s for s in self._teardown_starts if s >= event.monotonic_ns]
        data = self.future.pop(event.iteration, None) or IterationData(event.iteration)
        data.spans.extend(starting_here)
        self.open[event.iteration] = data
        # The first iteration of a segment follows its set-up window: warm-up.
        first = bool(self.windows) and self.windows[-1].iteration is None
        flags = (WARMUP,) if first else ()
        self.windows.append(_Window(event.iteration, event.monotonic_ns, flags=flags))
        lag = self.config.finalise_lag
        done: list[Finished] = []
        while len(self.windows) > 1 and self.boundaries - self.windows[0].closed_at >= lag:
            done.extend(self._finalise(self.windows.popleft()))
        self.finished = done
        return done

    def run_finished(self, event: RunFinished) -> list[Finished]:
        """Every iteration still open, finalised at the run's end (also kept in
        :attr:`finished`), and the run figures (:attr:`run`)."""
        end = event.monotonic_ns
        loop_end = self._loop_end(end)
        # A span without an iteration attribute that starts at or after the loop's end
        # belongs to the tear-down, not to the last iteration (or the set-up).
        for span in self._split_newest(loop_end):
            self.ledger.place("teardown", span[2] - span[1])
        newest = self.windows[-1] if self.windows else None
        if newest is not None and newest.iteration is not None:
            newest.flags += (DRAIN if event.status == "ok" else PARTIAL,)
        self._close_window(loop_end, event.wall_ns - (end - loop_end))
        done: list[Finished] = []
        while self.windows:
            done.extend(self._finalise(self.windows.popleft()))
        tail = max([end, *(e for _, _, e, _ in self.pieces)])
        self._tail_ns = tail
        start = end if self.horizon is None else self.horizon
        teardown = self._measure(start, tail)
        self._totals = self._totals + teardown
        self._teardown = self._teardown + teardown  # every segment's
        self.pieces, self.overhead, self.worker_pieces, self.unnamed = [], [], [], []
        self.publish.keep()
        for iteration, data in sorted(self.future.items()):
            self.unstarted[iteration] = data
            for span in data.spans:
                self.ledger.place("unstarted", span[2] - span[1])
        self.future = {}
        self.run = RunTiming(
            total=self._totals,
            setup=self._setup,
            loop=self._loop,
            teardown=self._teardown,
            active_wall_ns=self._setup.wall_ns - self._before_work.wall_ns + self._loop.wall_ns,
            active_overhead_ns=(
                self._setup.overhead_ns - self._before_work.overhead_ns + self._loop.overhead_ns
            ),
            late_spans=self.late_spans,
            late_ns=self.late_ns,
        )
        self.finished = done
        return done

    def spans(self, event: SpanBatch) -> None:
        placement = place_batch(event, self.anchor, self.config.clock_skew)
        self.skew.note(event, placement)
        shift = placement.shift_ns
        phase_of = self.config.phase_of
        overhead = self.overhead
        horizon = self.horizon  # moves only when a window is finalised
        workers = self.worker_pieces
        source = event.source
        self.ledger.count(event)
        # (the loop runs per span of every worker report: what it reads, bound once)
        pieces, open_ = self.pieces, self.open
        teardown = self.config.teardown_phases
        sides = self.publish if self.publish.phase is not None else None
        loop_work = self.config.is_loop_work if self._setup_open else None
        for span in event.spans:
            start, end = span.start_ns + shift, span.end_ns + shift
            # A thread is one of its process's: idents of two processes may coincide.
            thread = (span.pid << 64) | span.thread_id  # (thread_key, inlined)
            name = span.name
            if name == OVERHEAD_SPAN:
                overhead.append((start, end, thread))
                continue
            phase = phase_of(name)
            unnamed = None if phase is not None else self._unnamed(name, span)
            attrs = span.attrs
            if horizon is not None and start < horizon:
                # Its time before the horizon is in windows already written: late.
                self.late_spans += 1
                self.late_ns += min(end, horizon) - start
            # its start as placed in the windows: never before the horizon (a resumed
            # segment's set-up floor included)
            placed = start if horizon is None or start >= horizon else horizon
            if horizon is None or end > horizon:
                pieces.append((phase, placed, end, thread))
                if unnamed is not None:
                    self.unnamed.append((placed, end, unnamed))
                engine = attrs.get("engine")
                worker = engine if isinstance(engine, str) and engine else source
                workers.append(
                    (worker, name if name.startswith(WAIT_PREFIX) else None, placed, end)
                )
                if sides is not None and phase is not None:
                    sides.note(phase, thread, placed, end, source=source, engine=engine)
            elif sides is not None and phase is not None:  # (wholly late: its thread ran it)
                sides.note_thread(phase, thread)
            if loop_work is not None and loop_work(phase):
                first = self._first_work_ns
                self._first_work_ns = placed if first is None else min(first, placed)
            if phase is not None and phase in teardown:
                self._teardown_starts.append(start)
            attr = attrs.get("iteration")
            data = open_.get(attr) if type(attr) is int else None  # (the common case)
            if data is not None:
                data.spans.append((phase, start, end, span.error, thread, True))
            else:
                attr = iteration_of(attr, source, name, self.misnumbered)
                self._attribute(attr, phase, start, end, span, thread=thread)

    def _unnamed(self, name: str, span: Any) -> str | None:
        """A span in no phase: counted by name if it is work no phase names (a wait is
        not), and then the key its idle time is measured under."""
        if name.startswith(WAIT_PREFIX):
            return None
        return self.no_phase.add(name, span.end_ns - span.start_ns)

    def _attribute(
        self, attr: int | None, phase: str | None, start: int, end: int, span: Any, *, thread: int
    ) -> None:
        explicit = attr is not None
        data: IterationData | None
        if attr is not None:
            data = self._for_iteration(attr)
        else:
            window = self._window_at(start)
            if window is None:
                data = None
            elif window.iteration is None:
                if window is self.windows[-1]:  # the first boundary may still take it
                    self._setup_spans.append((phase, start, end, span.error, thread, False))
                else:
                    self.ledger.place("setup", end - start)
                return
            else:
                data = self.open[window.iteration]
        if data is None:
            self.ledger.place("late", end - start)
            return
        data.spans.append((phase, start, end, span.error, thread, explicit))

    def samples(self, event: SamplesObserved) -> None:
        data = self._for_iteration(event.iteration)
        if data is None:
            self.late_samples += len(event.lengths)
            return
        data.samples.setdefault(event.phase, []).extend(event.lengths)
        data.groups[event.phase] = data.groups.get(event.phase, 0) + event.groups

    def optimizer_step(self, event: OptimizerStep) -> None:
        self.optimizer_steps += 1
        self.step = max(self.step, event.step)
        data = self._for_iteration(event.iteration)
        if data is not None:
            data.steps += 1
            data.step = max(data.step, event.step)

    # -- helpers ---------------------------------------------------------------------

    def _for_iteration(self, iteration: int) -> IterationData | None:
        """The iteration's data (made for one not started yet); None once finalised."""
        data = self.open.get(iteration)
        if data is not None:
            return data
        if self.finalised_upto is not None and iteration <= self.finalised_upto:
            return None
        data = self.future.get(iteration)
        if data is None:
            data = self.future[iteration] = IterationData(iteration)
        return data

    def _loop_end(self, finish_ns: int) -> int:
        """Where the loop ends: the finish, or earlier the start of the first span of a
        tear-down phase (``lifecycle.teardown``: stopping the workers) that starts in
        the last iteration's window."""
        starts, self._teardown_starts = self._teardown_starts, []
        if not self.windows or self.windows[-1].iteration is None:
            return finish_ns
        lo = self.windows[-1].start_ns
        return min((s for s in starts if lo <= s < finish_ns), default=finish_ns)

    def iteration_at(self, at_ns: int) -> int | None:
        """The iteration whose window, not yet finalised, holds ``at_ns`` (None: the
        set-up's, a finalised window's, or no window)."""
        window = self._window_at(at_ns)
        return None if window is None else window.iteration

    def is_finalised(self, iteration: int) -> bool:
        """Whether ``iteration``'s records were written (at or below the newest
        finalised iteration and not open: a later observation of it is late)."""
        upto = self.finalised_upto
        return upto is not None and iteration <= upto and iteration not in self.open

    def _window_at(self, start: int) -> _Window | None:
        """The window not yet finalised that holds ``start`` (the set-up window also
        takes what started before it); None when that window is finalised."""
        if self.horizon is not None and start < self.horizon:
            return None
        for window in reversed(self.windows):
            if start >= window.start_ns:
                return window
        return self.windows[0] if self.windows else None

    def _split_newest(self, at_ns: int) -> list[Attributed]:
        """The spans without an iteration attribute that the newest window took by their
        start before its end was known, but that start at or after its end ``at_ns`` (a
        boundary or the finish): removed from it, for what follows. A set-up window's
        other spans are placed now (no later boundary can take them)."""
        if not self.windows:
            return []
        newest = self.windows[-1]
        after: list[Attributed] = []
        if newest.iteration is None:
            pending, self._setup_spans = self._setup_spans, []
            for span in pending:
                if span[1] >= at_ns:
                    after.append(span)
                else:
                    self.ledger.place("setup", span[2] - span[1])
            return after
        data = self.open[newest.iteration]
        keep: list[Attributed] = []
        for span in data.spans:
            if not span[5] and span[1] >= at_ns:
                after.append(span)
            else:
                keep.append(span)
        if after:
            data.spans = keep
        return after

    def _close_window(self, end_ns: int, wall_ns: int) -> None:
        if not self.windows:
            return
        window = self.windows[-1]
        window.end_ns = end_ns
        window.closed_at = self.boundaries + 1  # the boundary that closes it, counted from 1
        if window.iteration is not None:
            data = self.open[window.iteration]
            data.wall_ns = wall_ns
            data.step = max(data.step, self.step)  # steps so far: the record's step axis

    def _finalise(self, window: _Window) -> list[Finished]:
        """Measure a closed window, fold it into the run and forget what it needed."""
        end = cast(int, window.end_ns)
        start = window.start_ns
        if window.iteration is None:
            # Set-up also holds whatever started before the run did (another process, or
            # the publish of run_started itself).
            start = min(
                [start, *(s for _, s, _, _ in self.pieces), *(s for s, _, _ in self.overhead)]
            )
            if self._floor is not None:  # a resumed segment's: never back into the last
                start = max(start, self._floor)
        timing = self._measure(start, end)
        self._totals = self._totals + timing
        self.horizon = end
        self._kept_from = start
        if window.iteration is None:
            self._setup = self._setup + timing  # every segment's set-up
            self._setup_open = False
            # Set-up before the first phase span is not the run's active time.
            first = end if self._first_work_ns is None else min(self._first_work_ns, end)
            self._before_work = self._before_work + self._measure(start, first)
        self.pieces = [p for p in self.pieces if p[2] > end]
        self.publish.keep(ending_after=end)
        self.unnamed = [iv for iv in self.unnamed if iv[1] > end]
        out: list[Finished] = []
        if window.iteration is not None:
            data = self.open.pop(window.iteration)
            upto = self.finalised_upto
            self.finalised_upto = window.iteration if upto is None else max(upto, window.iteration)
            self._loop = self._loop + timing
            spent = sum([span[2] - span[1] for span in data.spans])
            self.ledger.place("iterations", spent, len(data.spans))
            attributed = data.attributed(self.config, self.overhead)
            workers = measure_workers(start, end, self.worker_pieces)
            out.append(Finished(data, attributed, timing, workers, window.flags))
        self.worker_pieces = [p for p in self.worker_pieces if p[3] > end]
        self._prune_overhead()
        return out

    def _measure(self, start: int, end: int) -> WindowTiming:
        """The :class:`WindowTiming` of ``[start, end)`` from what the timeline holds."""
        return measure_window(
            start, end, self.pieces, self.overhead, self.config,
            unnamed=self.unnamed, publish=self.publish.sides(),
        )  # fmt: skip

    def _prune_overhead(self) -> None:
        """Forget overhead no window or attributed iteration can still need.

        The windows need none before the horizon, but an iteration still open may yet
        receive a span that started before it (late in the window view, whole in the
        attributed one: with ``finalise_lag`` 0, the next iteration's rollout that began
        in the window just finalised and ended after the boundary), and its logical time
        deducts the overhead on its thread. So overhead is kept from the start of the
        newest finalised window, one window behind the horizon (the overhead of the
        ``finalise_lag + 2`` newest windows, whatever the run's length), or from an
        earlier start of a span already attributed to an iteration not finalised."""
        kept_from = self._kept_from
        if kept_from is None:
            return
        for data in (*self.open.values(), *self.future.values()):
            kept_from = min([kept_from, *[span[1] for span in data.spans]])
        self.overhead = [iv for iv in self.overhead if iv[1] > kept_from]

    def accounting(self) -> dict[str, Any]:
        """Where every span went, for the summary (after the run finished)."""
        return self.ledger.as_dict(self.late_spans, self.late_ns, self._totals, self.no_phase)
