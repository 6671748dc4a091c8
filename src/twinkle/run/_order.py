"""The order a run's events must keep, checked once for a live session and a replay alike.

:class:`EventOrder` checks the lifecycle of a run's segments (``run_started`` first and
once, ``run_finished`` once per segment, then only ``run_resumed`` begins the next, its
``backends_closed`` after it) and that iterations and optimizer steps only go forward
and boundaries never go back in time. Only the event types in :data:`ORDERED` carry
such checks; :class:`~twinkle.run.Run` sends every other one out unchecked.
"""

from __future__ import annotations

import threading
from typing import Any, Final, cast

from twinkle.errors import RecordError
from twinkle.events import (
    BackendsClosed,
    Event,
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    read_back,
)
from twinkle.run._config import (
    RESUMABLE_CONFIG,
    describe_config_changes,
    refused_config_keys,
)
from twinkle.run._summary import Segment

__all__ = ["ORDERED", "EventOrder"]

#: the event types whose place in the run is checked (:meth:`EventOrder.check`)
ORDERED: Final[frozenset[type[Event]]] = frozenset(
    {RunStarted, RunResumed, RunFinished, BackendsClosed, IterationStarted, OptimizerStep}
)


class EventOrder:
    """The order the events of a run must keep: iterations and optimizer steps only go
    forward (across segments too), and no boundary comes before the previous one.

    Its state (the last boundary, iteration and step) is what a checkpoint keeps of it;
    :attr:`lock` makes checking an event and queueing it for dispatch one step.
    """

    __slots__ = ("last_boundary", "last_iteration", "last_step", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_boundary: tuple[str, int] | None = None
        self.last_iteration: int | None = None
        self.last_step = 0

    def restore(self, order: tuple[Any, ...]) -> None:
        """The state a checkpoint left: (last boundary, last iteration, last step)."""
        self.last_boundary, self.last_iteration, self.last_step = order

    def mark(self, segments: list[Segment]) -> tuple[Any, ...]:
        """What :meth:`check` may change of this state and of ``segments``, for
        :meth:`roll_back` when the event checked cannot be queued after all."""
        last = segments[-1] if segments else None
        kept = (
            None
            if last is None
            else (last.finish, last.backends, last.first_iteration, last.last_iteration)
        )
        return self.last_boundary, self.last_iteration, self.last_step, len(segments), kept

    def roll_back(self, mark: tuple[Any, ...], segments: list[Segment]) -> None:
        """This state and ``segments`` as :meth:`mark` found them."""
        self.last_boundary, self.last_iteration, self.last_step, count, kept = mark
        del segments[count:]
        if kept is not None:
            last = segments[-1]
            last.finish, last.backends, last.first_iteration, last.last_iteration = kept

    def check(self, event: Event, segments: list[Segment], run_id: str) -> None:
        """Check that ``event`` (of a type in :data:`ORDERED`) fits run ``run_id`` so far,
        and note it: a boundary begins a segment of ``segments`` or finishes the last
        one. A misfit raises :class:`~twinkle.errors.RecordError` and changes nothing.
        The caller holds :attr:`lock`, or is dispatching (an observer publishing)."""
        kind = type(event)
        if not segments:
            if kind is not RunStarted:
                raise RecordError(
                    f"the first event of run {run_id!r} must be run_started, got {event.TYPE!r}"
                )
            self.boundary(event, "run_started")
            segments.append(Segment(cast(RunStarted, event)))
        elif kind is RunStarted:
            raise RecordError(
                f"event run_started starts run {event.run_id!r} a second time; a restarted "
                "run continues with run_resumed (a RunSession on the same run directory "
                "does that), and a replay takes one run's log at a time"
            )
        elif kind is RunResumed:
            self._resumed(cast(RunResumed, event), segments, run_id)
        elif kind is BackendsClosed:
            _backends_closed(cast(BackendsClosed, event), segments[-1], run_id)
        else:
            self._in_segment(event, segments, run_id)

    def _resumed(self, resumed: RunResumed, segments: list[Segment], run_id: str) -> None:
        """``run_resumed`` begins the next segment, once the last one finished."""
        if segments[-1].finish is None:
            raise RecordError(
                f"event run_resumed (segment {resumed.segment}) comes before segment "
                f"{len(segments) - 1} of run {run_id!r} finished: a segment ends with "
                "run_finished first"
            )
        if resumed.segment != len(segments):
            raise RecordError(
                f"event run_resumed says segment {resumed.segment}, but run {run_id!r} has "
                f"had {len(segments)} segment(s): the next is {len(segments)}"
            )
        _check_resumed_config(resumed, segments[0], run_id)
        self.boundary(resumed, "run_resumed")
        segments.append(Segment(resumed))

    def _in_segment(self, event: Event, segments: list[Segment], run_id: str) -> None:
        """``run_finished``, ``iteration_started`` and ``optimizer_step`` of the last
        segment: after its ``run_finished``, iterations and steps are refused (and the
        other events go out unchecked)."""
        kind = type(event)
        segment = segments[-1]
        if segment.finish is not None and kind is not RunFinished:
            if kind is IterationStarted or kind is OptimizerStep:
                raise RecordError(
                    f"event {event.TYPE!r} comes after run {run_id!r} finished "
                    f"(segment {len(segments) - 1}); publish before finish()"
                )
            return
        if kind is RunFinished:
            if segment.finish is not None:
                raise RecordError(
                    f"event run_finished finishes segment {len(segments) - 1} of run "
                    f"{run_id!r} a second time"
                )
            self.boundary(event, "run_finished")
            segment.finish = cast(RunFinished, event)
        elif kind is IterationStarted:
            iteration = cast(IterationStarted, event).iteration
            self.iteration(cast(IterationStarted, event), run_id)
            if segment.first_iteration is None:
                segment.first_iteration = iteration
            segment.last_iteration = iteration
        elif kind is OptimizerStep:
            self.step(cast(OptimizerStep, event), run_id)

    def boundary(self, event: Event, what: str) -> None:
        last = self.last_boundary
        if last is not None and event.monotonic_ns < last[1]:
            raise RecordError(
                f"event {what} at monotonic {event.monotonic_ns} ns comes before the "
                f"previous boundary ({last[0]} at {last[1]} ns): the run's clock went "
                "backwards — it must be monotonic (time.perf_counter_ns, or a ManualClock "
                "that only advances) — or two threads published boundaries at once "
                "(publish iterations and finish() from one thread)"
            )
        self.last_boundary = (what, event.monotonic_ns)

    def iteration(self, event: IterationStarted, run_id: str) -> None:
        last = self.last_iteration
        if last is not None and event.iteration <= last:
            again = "repeats" if event.iteration == last else "goes backwards from"
            raise RecordError(
                f"iteration_started {event.iteration} {again} iteration {last} of run "
                f"{run_id!r}: iterations only go forward, so the next is {last + 1} or more "
                "(a resumed run numbers on after its last iteration too)"
            )
        self.boundary(event, f"iteration_started {event.iteration}")
        self.last_iteration = event.iteration

    def step(self, event: OptimizerStep, run_id: str) -> None:
        if event.step <= self.last_step:
            again = "repeats" if event.step == self.last_step else "goes backwards from"
            raise RecordError(
                f"optimizer_step step={event.step} {again} step {self.last_step} of run "
                f"{run_id!r}: step counts the optimizer steps so far (1-based) and only "
                f"grows: the next is {self.last_step + 1}"
            )
        self.last_step = event.step


def _check_resumed_config(resumed: RunResumed, first: Segment, run_id: str) -> None:
    """A segment may change only :data:`RESUMABLE_CONFIG` of the run's configuration, as
    the ``first`` segment logged it (a resuming :class:`~twinkle.run.RunSession` refuses
    any other change before it publishes anything: only a log put together by hand gets
    here)."""
    logged = read_back(dict(first.start.config))
    given = read_back(dict(resumed.config))
    keys = refused_config_keys(logged, given)
    if keys:
        raise RecordError(
            f"event run_resumed (segment {resumed.segment}) changes the configuration "
            f"of run {run_id!r} at {list(keys)} "
            f"({describe_config_changes(keys, logged, given)}): a resumed run may "
            f"change only {RESUMABLE_CONFIG}; resume with the run's configuration, or "
            "start a new run with another run id"
        )


def _backends_closed(event: BackendsClosed, segment: Segment, run_id: str) -> None:
    """``backends_closed`` comes once per segment, after its ``run_finished``."""
    if segment.finish is None or segment.backends is not None:
        when = "before its run_finished" if segment.finish is None else "a second time"
        raise RecordError(
            f"event backends_closed comes {when} in segment {segment.number} of run "
            f"{run_id!r}: a segment's backends close once, after it finished"
        )
    segment.backends = event
