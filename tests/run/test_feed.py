"""The log feeder replay and a resuming session share: events submitted in order and
counted, up to a limit, and a segment the log leaves running closed as an error."""

from __future__ import annotations

from typing import Any

from twinkle.events import IterationStarted, RunFinished, RunStarted
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.perf import ClockAnchor
from twinkle.plugins import make_plugin_manager
from twinkle.run import Run
from twinkle.run._feed import LogFeeder


class Seen:
    def __init__(self) -> None:
        self.events: list[Any] = []

    @hookimpl
    def twinkle_event(self, event: Any) -> None:
        self.events.append(event)


def _run() -> tuple[Run, Seen]:
    seen = Seen()
    pm = make_plugin_manager(autoload=False, builtins=False, plugins=[("seen", seen)])
    run = Run(pm, RunContext("r", None, {}, replay=True), background=False)
    run.start()
    return run, seen


def _log(iterations: int) -> list[Any]:
    anchor = ClockAnchor(monotonic_ns=0, wall_ns=1_000, pid=1, hostname="h")
    started = RunStarted("r", 0, 1_000, anchor=anchor, config={})
    return [started, *(IterationStarted("r", 10 * i, 1_000 + 10 * i, i) for i in range(iterations))]


def test_feeding_counts_the_events_and_stops_at_the_limit_counting_those_fed_before() -> None:
    run, seen = _run()
    feeder = LogFeeder(run)
    log = _log(4)
    assert feeder.feed(iter(log[:2])) == 2
    calls: list[int] = []
    assert feeder.feed(iter(log[2:]), limit=4, after_each=lambda: calls.append(1)) == 4
    assert [e.TYPE for e in seen.events] == ["run_started"] + ["iteration_started"] * 3
    assert feeder.last is log[3] and calls == [1, 1]
    run.close()


def test_a_segment_the_log_leaves_running_is_closed_as_an_error_at_the_given_time() -> None:
    run, seen = _run()
    feeder = LogFeeder(run)
    feeder.feed(_log(2))
    assert feeder.close_unfinished("it died", ns=25, wall_ns=1_025) is True
    finished = seen.events[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error, finished.monotonic_ns, finished.wall_ns) == (
        "error",
        "it died",
        25,
        1_025,
    )
    # a finished segment is left as it is
    assert feeder.close_unfinished("again", ns=30, wall_ns=1_030) is False
    assert seen.events[-1] is finished
    run.close()
