"""The run's timeline: where every span's time went, in two views (docs/metrics.md).

* **Windows tile the run.** The *set-up* window runs from the run's start (or an earlier
  span) to the first iteration boundary, iteration ``i``'s window from its boundary to
  the next (the last to the run's finish), the *tear-down* window from the finish to the
  end of the last span. Every span is clipped to each window it crosses, whichever
  iteration it serves: per-phase unions, busy (union of all phases), pairwise overlap,
  idle (no phase running) and overhead are measured on the wall clock, so busy <= wall
  and the run's figures are the sums of its windows' (true unions, not sums of
  per-iteration unions).
* **Attribution.** The work done *for* iteration ``i``, wherever it ran: spans whose
  ``iteration`` attribute is ``i``, and spans without one that start in ``i``'s window
  (by their start: one published before ``i``'s boundary that starts at or after it is
  ``i``'s). Per-phase throughput uses this view.
* **Bounded lag.** A window and its iteration are *finalised* (their records written)
  when ``finalise_lag`` further boundaries have passed after the window's end, or at the
  run's finish; the bus flushes every recorder before each boundary, so every span that
  closed by then is in. A span arriving later is *late*: its time before the finalised
  horizon is counted in ``late_seconds`` (summed) and its time after it in the windows
  as usual; a span attributed to a finalised iteration is counted as attributed late.
* Spans of other processes are moved onto the run's timeline through the clock anchors;
  a worker batch whose send those anchors put after its arrival (a clock ahead) or far
  before it (behind) is placed by its arrival instead and counted (``placement``).
  Overhead spans (``twinkle.observe``: every publish and dispatch on the caller's
  threads) are taken by time and deducted once; they are kept one window behind the
  horizon, for the late spans of iterations still open.
"""

from __future__ import annotations

from twinkle.errors import PluginError
from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    SpanBatch,
)
from twinkle.hookspecs import RunContext, StashKey, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._finalised import Finished, RunTiming
from twinkle.observers._measure import AttributedTiming, IterationData, WindowTiming
from twinkle.observers._timeline import Timeline

__all__ = [
    "AttributedTiming",
    "Finished",
    "IterationData",
    "RunTiming",
    "TIMELINE",
    "Timeline",
    "TimelineObserver",
    "timeline_for",
    "WindowTiming",
]


TIMELINE: StashKey[Timeline] = StashKey("twinkle.timeline")
"""The run's timeline in :attr:`RunContext.stash`, set by :class:`TimelineObserver`."""


def timeline_for(context: RunContext, observer: str) -> Timeline:
    """The run's timeline, for ``observer``; a clear error when nothing feeds one."""
    timeline = context.stash.get(TIMELINE)
    if timeline is None:
        raise PluginError(
            f"observer {observer!r} reads the run's timeline, but the built-in 'timeline' "
            "observer is not registered (blocked?): unblock 'timeline' or block "
            f"{observer!r} too"
        )
    return timeline


class TimelineObserver(BuiltinObserver):
    """The built-in ``timeline`` observer: owns the run's :class:`Timeline` (in its stash)
    and feeds it each event first (``tryfirst``): the others see it already placed."""

    def __init__(self) -> None:
        self.timeline = Timeline()

    @hookimpl(tryfirst=True)
    def twinkle_configure(self, context: RunContext) -> None:
        self.timeline = Timeline()
        context.stash[TIMELINE] = self.timeline

    @hookimpl(tryfirst=True)
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.timeline.run_started(event)

    @hookimpl(tryfirst=True)
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        self.timeline.run_resumed(event)

    @hookimpl(tryfirst=True)
    def twinkle_spans(self, event: SpanBatch) -> None:
        self.timeline.spans(event)

    @hookimpl(tryfirst=True)
    def twinkle_samples(self, event: SamplesObserved) -> None:
        self.timeline.samples(event)

    @hookimpl(tryfirst=True)
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        self.timeline.optimizer_step(event)

    @hookimpl(tryfirst=True)
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        self.timeline.iteration_started(event)

    @hookimpl(tryfirst=True)
    def twinkle_run_finished(self, event: RunFinished) -> None:
        self.timeline.run_finished(event)
