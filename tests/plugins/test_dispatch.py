"""twinkle.plugins._hookcalls and _dispatch: each observer called in isolation (a raising one
logged, counted and skipped), its time counted as overhead, events published from inside a
hook dispatched after the current one."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.errors import TwinkleError
from twinkle.events import Event, IterationStarted, RunStarted, ScalarsObserved
from twinkle.hookspecs import hookimpl
from twinkle.perf import ManualClock
from twinkle.run import RunSession


class Boom:
    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        raise RuntimeError("observer bug")

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        raise ValueError("another observer bug")


class Good:
    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        if event.TYPE != "spans":
            self.events.append(event.TYPE)


@pytest.mark.parametrize("boom_first", [True, False], ids=["raising-first", "raising-last"])
def test_raising_observer_is_isolated_logged_and_counted(
    boom_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    good = Good()
    pair = [("boom", Boom()), ("good", good)]
    plugins = pair if boom_first else pair[::-1]
    run = RunSession(out_dir=None, run_id="r", autoload=False, plugins=plugins)
    with run:
        for i in range(3):
            run.bus.iteration_started(i)
    assert good.events == [
        "run_started",
        *["iteration_started"] * 3,
        "run_finished",
        "backends_closed",
    ]
    # every event reaches twinkle_event (span batches of overhead included), and the
    # three iteration starts twinkle_iteration_started too
    assert run.dispatcher is not None
    expected = run.dispatcher.events + 3
    assert run.failures == {"boom": expected}
    assert run.summary is not None
    assert run.summary["observer_failures"] == {"boom": expected}
    assert "observer 'boom' failed in twinkle_event" in caplog.text


def test_slow_observer_time_is_deducted_as_overhead_and_others_still_run(tmp_path: Path) -> None:
    clock = ManualClock(0)
    ms = 1_000_000

    class Slow:
        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            clock.advance(30 * ms)  # this observer takes 30 ms of the trainer's time

    good = Good()
    run = RunSession(
        out_dir=tmp_path,
        run_id="slow",
        clock=clock,
        autoload=False,
        plugins=[("slow", Slow()), ("good", good)],
        background_writer=False,
        background_dispatch=False,  # (the observers on the trainer's thread)
    )
    with run:
        run.bus.iteration_started(0)
        clock.advance(100 * ms)
        run.bus.iteration_started(1)
        clock.advance(100 * ms)

    timing = [
        orjson.loads(line)["values"]
        for line in (tmp_path / "slow" / "metrics_raw.jsonl").read_bytes().splitlines()
        if b'"kind":"timing","scope":"iteration"' in line
    ]
    assert [t["window_wall_seconds"] for t in timing] == [0.13, 0.13]
    assert [t["window_overhead_seconds"] for t in timing] == [0.03, 0.03]
    assert [t["window_logical_seconds"] for t in timing] == [0.1, 0.1]
    assert good.events.count("iteration_started") == 2


def test_observer_publishing_from_inside_a_hook_is_dispatched_after_the_current_event() -> None:
    order: list[str] = []

    class Republisher:
        bus: Any = None

        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            order.append(f"start {event.iteration}")
            if event.iteration == 0:
                self.bus.snapshot({"from": "hook"})
                order.append("published")

        @hookimpl
        def twinkle_event(self, event: Event) -> None:
            if event.TYPE != "spans":
                order.append(f"event {event.TYPE}")

    rep = Republisher()
    with RunSession(out_dir=None, run_id="r", autoload=False, plugins=[("rep", rep)]) as run:
        rep.bus = run.bus
        run.bus.iteration_started(0)
    assert order[:5] == [
        "event run_started",
        "start 0",
        "published",
        "event iteration_started",
        "event snapshot",
    ]


def test_run_started_reaches_observers_with_the_config() -> None:
    seen: list[dict[str, Any]] = []

    class Cfg:
        @hookimpl
        def twinkle_run_started(self, event: RunStarted) -> None:
            seen.append(event.config)

    with RunSession(
        out_dir=None,
        run_id="r",
        config={"total_steps": 7},
        autoload=False,
        builtins=False,
        plugins=[("cfg", Cfg())],
    ):
        pass
    assert seen == [{"total_steps": 7}]


def test_a_boundary_is_queued_once_the_one_before_it_was_dispatched() -> None:
    """The observers' dispatch thread (the default) lags the loop by at most an
    iteration: a boundary waits for the one before it, and nothing else waits."""
    gate, entered = threading.Event(), threading.Event()

    class Holds:
        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            if event.iteration == 0:
                entered.set()
                assert gate.wait(10)

    run = RunSession(out_dir=None, run_id="lag", autoload=False, plugins=[("holds", Holds())])
    with run:
        run.bus.iteration_started(0)
        assert entered.wait(5)  # on the dispatch thread, held there
        run.bus.scalars(iteration=0, name="x", values={"a": 1.0})  # queued: no wait
        queued = threading.Event()

        def next_boundary() -> None:
            run.bus.iteration_started(1)
            queued.set()

        boundary = threading.Thread(target=next_boundary)
        boundary.start()
        assert not queued.wait(0.3)  # boundary 0 is still being dispatched
        gate.set()
        boundary.join(5)
        assert queued.is_set()
    assert run.summary is not None and run.summary["observer_failures"] == {}


def test_a_boundary_interrupted_while_it_waits_for_room_is_not_the_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C while a boundary waits for room in a full dispatch queue (here raised where
    the wait is): the boundary was checked but never queued, so the run's order is as
    before it, and the loop (or its restart) publishes that iteration again."""
    from twinkle.plugins import Dispatcher

    enqueue = Dispatcher.enqueue
    interrupted: list[int] = []

    def full_once(self: Dispatcher, event: Event) -> bool:
        if isinstance(event, IterationStarted) and event.iteration == 1 and not interrupted:
            interrupted.append(1)
            raise KeyboardInterrupt
        return enqueue(self, event)

    monkeypatch.setattr(Dispatcher, "enqueue", full_once)
    run = RunSession(out_dir=None, run_id="room", autoload=False)
    with run:
        run.bus.iteration_started(0)
        with pytest.raises(KeyboardInterrupt):
            run.bus.iteration_started(1)
        assert run.run.order.last_iteration == 0
        assert run.run.segments[-1].last_iteration == 0
        run.bus.iteration_started(1)  # not "repeats iteration 1"
    assert run.summary is not None and run.summary["status"] == "ok"
    assert run.run.order.last_iteration == 1


def test_a_ctrl_c_while_finish_waits_for_the_dispatch_thread_still_finishes_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish() waits for the dispatch thread before run_finished (its slow calls count
    every event): a Ctrl-C there finishes the run all the same, then is raised."""
    from twinkle.plugins import Dispatcher

    flush = Dispatcher.flush
    interrupted: list[int] = []

    def interrupted_once(self: Dispatcher) -> None:
        if not interrupted:
            interrupted.append(1)
            raise KeyboardInterrupt
        flush(self)

    run = RunSession(out_dir=tmp_path, run_id="fin", autoload=False)
    run.start()
    run.bus.iteration_started(0)
    monkeypatch.setattr(Dispatcher, "flush", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        run.finish()
    summary = orjson.loads((tmp_path / "fin" / "summary.json").read_bytes())
    assert summary["status"] == "ok" and run.state.value == "finished"
    log = (tmp_path / "fin" / "events.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["type"] for line in log[-2:]] == ["run_finished", "backends_closed"]


class _ThirdParty:
    @hookimpl
    def twinkle_run_finished(self) -> None:
        pass


def test_only_third_party_plugins_get_a_hook_thread_of_their_own() -> None:
    """With a time limit, a plugin's hooks run on its thread (a partial of its runner's
    call); twinkle's own code never does, built-in observer or not (a follower's record
    keeper: a thread switch per record would slow every report of a long run)."""
    from twinkle.plugins import HookCalls, make_plugin_manager
    from twinkle.testing import CtrlCWhileResuming

    pm = make_plugin_manager(
        autoload=False,
        builtins=True,
        plugins=[("mine", _ThirdParty()), ("twinkles", CtrlCWhileResuming())],
    )
    calls = HookCalls(pm, hook_timeout_s=5.0)
    planned = {name: fn for name, fn, _ in calls.plan("twinkle_run_finished")}
    assert isinstance(planned["mine"], functools.partial)
    assert not isinstance(planned["twinkles"], functools.partial)
    assert all(not isinstance(fn, functools.partial) for name, fn in planned.items()
               if pm.is_builtin(name))  # fmt: skip
    unbounded = HookCalls(pm)  # (no time limit: every call on the calling thread)
    assert not any(isinstance(fn, functools.partial)
                   for _, fn, _ in unbounded.plan("twinkle_run_finished"))  # fmt: skip
    calls.close()


def test_closing_inline_waits_for_a_dispatch_in_flight_and_refuses_what_comes_after() -> None:
    """Another thread dispatching inline when the run closes its outputs: its records
    must reach them first (the run closed its reporter under it: 'scalars' counted a
    failure for a record refused as 'reporter is closed'), and an event it queues once
    they closed is refused, not left queued unseen."""
    entered = threading.Event()
    seen: list[str] = []

    class Slow:
        @hookimpl
        def twinkle_scalars(self, event: ScalarsObserved) -> None:
            entered.set()
            time.sleep(0.3)  # (the run closes meanwhile)
            seen.append(event.name)

    run = RunSession(
        out_dir=None, run_id="r", autoload=False, plugins=[("slow", Slow())],
        background_dispatch=False,
    )  # fmt: skip
    run.start()
    assert run.dispatcher is not None and not run.dispatcher.background
    side = threading.Thread(
        target=functools.partial(run.bus.scalars, iteration=0, name="side", values={"x": 1.0})
    )
    side.start()
    assert entered.wait(10)
    run.dispatcher.close()
    assert seen == ["side"]  # (closing waited for it)
    side.join(10)
    with pytest.raises(TwinkleError, match="observers are closed"):
        run.bus.scalars(iteration=0, name="after", values={"x": 1.0})
    assert seen == ["side"]
    assert run.failures == {}
    with pytest.raises(TwinkleError, match="observers are closed"):
        run.finish()  # (the run, its observers closed, ends FAILED, no longer in progress)


def test_a_drain_after_close_of_events_another_thread_dispatched_is_no_refusal() -> None:
    """A publisher queued its event, then another thread's drain dispatched it and the
    run closed before the publisher drained: its drain found nothing left, yet was told
    its event reached no observer."""
    good = Good()
    run = RunSession(
        out_dir=None, run_id="r", autoload=False, plugins=[("good", good)],
        background_dispatch=False,
    )  # fmt: skip
    run.start()
    dispatcher = run.dispatcher
    assert dispatcher is not None
    event = ScalarsObserved("r", 0, 0, 0, "late", {"x": 1.0})
    assert dispatcher.enqueue(event)  # (queued; the publisher drains next...)
    dispatcher.drain()  # (...but another thread's drain takes it first)
    dispatcher.close()
    dispatcher.drain()  # (the publisher's own, once the run closed)
    assert good.events.count("scalars") == 1
    with pytest.raises(TwinkleError, match="observers are closed"):
        run.finish()
