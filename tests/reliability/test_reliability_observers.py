"""Observer faults: raising, slow, re-entrant and misbehaving observers, and callers that
raise. The run always completes, every failure is counted in ``summary.json``
(``observer_failures``) and the other observers' files stay complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import twinkle.reporting.jsonl as jsonl_mod
from twinkle.errors import PluginError, TwinkleError
from twinkle.events import (
    Event,
    IterationStarted,
    OptimizerStep,
    RunFinished,
    SamplesObserved,
    ScalarsObserved,
    WeightsPublished,
)
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.perf import ManualClock
from twinkle.plugins import Dispatcher, HookCalls, make_plugin_manager
from twinkle.reporting import MetricRecord, make_record
from twinkle.run import RunSession, replay
from twinkle.testing import signal_main

CONFIG = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 1},
    "total_steps": 6,
}
ITERATIONS = 6


def drive(run: RunSession, clock: ManualClock, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        run.bus.iteration_started(i)
        with run.recorder.span("generate", iteration=i):
            clock.advance(3_000_000)
        run.bus.samples(iteration=i, phase="rollout", lengths=[5, 7 + i], groups=1)
        with run.recorder.span("train.step"):
            clock.advance(5_000_000)
        run.bus.samples(iteration=i, phase="train", lengths=[5, 7 + i])
        run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)


def session(out: Path, run_id: str, plugins: list[tuple[str, object]]) -> tuple[RunSession, Any]:
    clock = ManualClock(10**9)
    run = RunSession(
        out_dir=out,
        run_id=run_id,
        config=CONFIG,
        autoload=False,
        plugins=plugins,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
    )
    return run, clock


def summary_of(run: RunSession) -> dict[str, Any]:
    assert run.out_dir is not None
    data: dict[str, Any] = json.loads((run.out_dir / "summary.json").read_text())
    return data


def same_records_as_replay_without(run: RunSession, tmp_path: Path) -> None:
    """The built-in observers' files are what the log gives without the odd plugin."""
    assert run.out_dir is not None
    again = tmp_path / f"again-{run.run_id}"
    replay(run.out_dir / "events.jsonl", again, autoload=False)
    for name in ("metrics_raw.jsonl", "metrics.jsonl", "trace.json"):
        assert (run.out_dir / name).read_bytes() == (again / name).read_bytes(), name


class RaisesEverywhere:
    """Raises in every hook twinkle calls."""

    def __init__(self) -> None:
        self.calls = 0

    def _boom(self, hook: str) -> None:
        self.calls += 1
        raise RuntimeError(f"bug in {hook}")

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self._boom("configure")

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> None:
        self._boom("make_backends")

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        self._boom("iteration_started")

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        self._boom("samples")

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        self._boom("run_finished")

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        self._boom("event")

    @hookimpl
    def twinkle_record(self, record: MetricRecord) -> None:
        self._boom("record")

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> None:
        self._boom("summary")


def test_observer_raising_in_every_hook_is_counted_and_the_run_completes(tmp_path: Path) -> None:
    bad = RaisesEverywhere()
    run, clock = session(tmp_path, "raising", [("bad", bad)])
    with run:
        drive(run, clock)
    summary = summary_of(run)
    assert summary["status"] == "ok"
    # every call up to the summary is counted (unconfigure runs after it is written)
    assert summary["observer_failures"] == {"bad": bad.calls}
    assert bad.calls > 4 * ITERATIONS
    same_records_as_replay_without(run, tmp_path)


def test_slow_observer_slows_the_run_but_loses_nothing(tmp_path: Path) -> None:
    class Slow:
        @hookimpl
        def twinkle_event(self, event: Event) -> None:
            time.sleep(0.002)  # a blocking network call, say

    run, clock = session(tmp_path, "slow", [("slow", Slow())])
    with run:
        drive(run, clock)
    assert summary_of(run)["observer_failures"] == {}
    same_records_as_replay_without(run, tmp_path)


class Republisher:
    """Publishes from inside its hooks: a scalar per optimizer step, a snapshot at every
    iteration start, a span flush from a samples hook, and one event while the run
    finishes."""

    def __init__(self) -> None:
        self.run: RunSession | None = None
        self.seen: list[str] = []

    @hookimpl
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        assert self.run is not None
        self.run.bus.scalars(iteration=event.iteration, name="derived", values={"s": event.step})

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        assert self.run is not None
        self.run.bus.snapshot({"seen_iteration": event.iteration})

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        assert self.run is not None
        self.run.bus.flush_spans()

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        assert self.run is not None
        self.run.bus.snapshot({"after": "run_finished"})

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        self.seen.append(event.TYPE)


def test_observer_publishing_from_its_hooks_is_dispatched_in_order_and_logged(
    tmp_path: Path,
) -> None:
    rep = Republisher()
    run, clock = session(tmp_path, "reentrant", [("rep", rep)])
    rep.run = run
    with run:
        drive(run, clock)
    summary = summary_of(run)
    assert summary["observer_failures"] == {}
    assert summary["scalars"]["derived"]["s"]["last"] == ITERATIONS
    assert run.out_dir is not None
    log = [json.loads(line) for line in (run.out_dir / "events.jsonl").read_bytes().splitlines()]
    types = [o["type"] for o in log if o["type"] != "spans"]
    assert types == [t for t in rep.seen if t != "spans"]  # the log is what observers saw
    for i, t in enumerate(types):
        if t == "optimizer_step":
            assert types[i + 1] == "scalars"  # right after the event that caused it
        if t == "iteration_started":
            assert types[i + 1] == "snapshot"
    assert types[-3:] == ["run_finished", "snapshot", "backends_closed"]
    # Replaying the log (without the republisher) reproduces the run, including the
    # event published while it finished.
    result = replay(run.out_dir / "events.jsonl", tmp_path / "again", autoload=False)
    assert result.events == len(log)
    for name in ("metrics_raw.jsonl", "metrics.jsonl", "summary.json"):
        assert (run.out_dir / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


class Echo:
    """Answers every scalars event of a publisher thread with one of its own."""

    def __init__(self) -> None:
        self.run: RunSession | None = None

    @hookimpl
    def twinkle_scalars(self, event: ScalarsObserved) -> None:
        assert self.run is not None
        if event.name != "echo":
            self.run.bus.scalars(iteration=0, name="echo", values={"k": event.values["k"]})


def test_publishers_on_many_threads_and_a_republishing_observer_lose_no_event(
    tmp_path: Path,
) -> None:
    # Scalars, not optimizer steps: steps only go forward, so threads cannot share them.
    echo = Echo()
    run, _ = session(tmp_path, "threads", [("echo", echo)])
    echo.run = run
    per_thread, threads = 200, 4
    with run:
        run.bus.iteration_started(0)

        def publish(t: int) -> None:
            for k in range(per_thread):
                run.bus.scalars(iteration=0, name=f"thread{t}", values={"k": k})

        workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert run.out_dir is not None
    log = [json.loads(line) for line in (run.out_dir / "events.jsonl").read_bytes().splitlines()]
    scalars = [o for o in log if o["type"] == "scalars"]
    for t in range(threads):  # every event, each thread's in its order
        mine = [o["values"]["k"] for o in scalars if o["name"] == f"thread{t}"]
        assert mine == list(range(per_thread))
    echoed = sorted(o["values"]["k"] for o in scalars if o["name"] == "echo")
    assert echoed == sorted(list(range(per_thread)) * threads)
    assert summary_of(run)["observer_failures"] == {}


def test_observer_returning_garbage_is_counted_and_skipped(tmp_path: Path) -> None:
    class Garbage:
        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> Any:
            return 42  # not a list of records

        @hookimpl
        def twinkle_samples(self, event: SamplesObserved) -> Any:
            return ["not a record"]

        @hookimpl
        def twinkle_optimizer_step(self, event: OptimizerStep) -> Any:
            return [
                make_record(  # a record of another run
                    kind="x",
                    scope="iteration",
                    run_id="someone-else",
                    step=0,
                    iteration=0,
                    wall_ns=0,
                    monotonic_ns=0,
                    values={},
                )
            ]

    run, clock = session(tmp_path, "garbage", [("garbage", Garbage())])
    with run:
        drive(run, clock)
    assert summary_of(run)["observer_failures"] == {"garbage": 4 * ITERATIONS}
    same_records_as_replay_without(run, tmp_path)


class EndsTheProcess:
    """At every weights publish, a signal to the main thread whose handler (installed
    by the test) raises ``exc`` (``SystemExit``: a SIGTERM handler calling sys.exit(),
    or ``KeyboardInterrupt``: Ctrl-C); with ``own=True``, raises ``exc`` itself: the
    plugin's own exit, not a signal."""

    def __init__(self, exc: type[BaseException], *, own: bool = False) -> None:
        self.exc, self.own = exc, own
        self.version: int | None = None

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        self.version = event.version
        if self.own:
            raise self.exc(f"the plugin exits at version {event.version}")
        signal_main(signal.SIGTERM if self.exc is SystemExit else signal.SIGINT)


class SeesWeights:
    """Keeps every weight version and every event type it is given."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.types: list[str] = []

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        self.versions.append(event.version)

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        self.types.append(event.TYPE)


WEIGHT_VERSIONS = 5


def publish_weights_and_steps(run: RunSession) -> None:
    for v in range(WEIGHT_VERSIONS):
        run.bus.weights_published(v, start_ns=10 * v, end_ns=10 * v + 5, acks=[("e0", 10 * v + 5)])
        run.bus.optimizer_step(iteration=0, step=v + 1, samples=1)


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize(
    ("background", "publisher"),
    [(True, "main"), (False, "thread"), (True, "thread")],
    ids=["dispatch-thread", "publisher-thread", "both"],
)
def test_observer_raising_systemexit_or_ctrl_c_off_the_main_thread_is_counted_and_skipped(
    tmp_path: Path, exc: type[BaseException], background: bool, publisher: str
) -> None:
    sees = SeesWeights()
    # registered last, so called first: the observer after it in the same call still runs
    plugins: list[tuple[str, object]] = [("sees", sees), ("ender", EndsTheProcess(exc, own=True))]
    run = RunSession(
        out_dir=tmp_path,
        run_id="ender",
        autoload=False,
        plugins=plugins,
        background_dispatch=background,
    )
    escaped: list[BaseException] = []
    with run:
        run.bus.iteration_started(0)
        if publisher == "main":
            publish_weights_and_steps(run)
        else:

            def publish() -> None:
                try:
                    publish_weights_and_steps(run)
                except BaseException as e:  # threading would swallow a SystemExit silently
                    escaped.append(e)

            worker = threading.Thread(target=publish)
            worker.start()
            worker.join()
        run.bus.iteration_started(1)  # the run goes on after the last one
    assert escaped == []
    assert sees.versions == list(range(WEIGHT_VERSIONS))
    assert sees.types.count("optimizer_step") == WEIGHT_VERSIONS
    assert [t for t in sees.types if t != "spans"][-3:] == [
        "iteration_started",
        "run_finished",
        "backends_closed",
    ]
    summary = summary_of(run)
    assert summary["status"] == "ok"
    assert summary["observer_failures"] == {"ender": WEIGHT_VERSIONS}
    assert run.out_dir is not None
    log = [json.loads(line) for line in (run.out_dir / "events.jsonl").read_bytes().splitlines()]
    assert [o["version"] for o in log if o["type"] == "weights_published"] == list(
        range(WEIGHT_VERSIONS)
    )


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_ctrl_c_or_exit_inside_an_observer_on_the_main_thread_still_stops_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, exc: type[BaseException]
) -> None:
    """Signal handlers run on the main thread in whatever frame it is in — with inline
    dispatch often an observer's: the user's Ctrl-C, or a SIGTERM handler calling
    sys.exit() (a preempted job), must stop the caller, not be swallowed as an observer
    failure. (With background dispatch no observer runs on the main thread: the test
    above.)"""
    sees, ender = SeesWeights(), EndsTheProcess(exc)
    plugins: list[tuple[str, object]] = [("sees", sees), ("ender", ender)]
    run = RunSession(
        out_dir=tmp_path,
        run_id="ctrl-c",
        autoload=False,
        plugins=plugins,
        background_dispatch=False,
    )

    def handler(signum: int, frame: object) -> None:
        raise exc(f"signal {signum} at version {ender.version}")

    number = signal.SIGTERM if exc is SystemExit else signal.SIGINT
    saved = signal.signal(number, handler)
    try:
        with pytest.raises(exc, match="version 0"):
            with run:
                publish_weights_and_steps(run)
    finally:
        signal.signal(number, saved)
    summary = summary_of(run)
    assert summary["status"] == "error"
    assert summary["error"].startswith(exc.__name__)
    assert summary["observer_failures"] == {"ender": 1}  # counted before it went on
    assert f"observer 'ender' was interrupted in twinkle_weights_published ({exc.__name__})" in (
        caplog.text
    )
    assert sees.types[-2:] == ["run_finished", "backends_closed"]  # the run was still finished


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_plugin_raising_an_exit_in_its_hook_is_its_failure_not_the_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, exc: type[BaseException]
) -> None:
    """A plugin's own sys.exit() (or KeyboardInterrupt) in a hook, with the observers on
    the main thread: it is raised on the plugin's thread, not by a signal handler, so it
    is counted and skipped like any failure and the run finishes ok."""
    sees = SeesWeights()
    plugins: list[tuple[str, object]] = [("sees", sees), ("ender", EndsTheProcess(exc, own=True))]
    with RunSession(
        out_dir=tmp_path, run_id="own", autoload=False, plugins=plugins, background_dispatch=False
    ) as run:
        publish_weights_and_steps(run)
    summary = summary_of(run)
    assert summary["status"] == "ok"
    assert summary["observer_failures"] == {"ender": WEIGHT_VERSIONS}
    assert sees.versions == list(range(WEIGHT_VERSIONS))
    assert f"PluginExit: {exc.__name__}(the plugin exits at version 0) on its own thread" in (
        caplog.text
    )


class Hangs:
    """Never returns from its hook at the second weights publish (a lock the trainer
    holds, a server that never answers); counts the calls it got."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        self.calls += 1
        if event.version == 1:
            self.release.wait()


@pytest.mark.parametrize("background", [True, False])
def test_a_plugin_hook_that_never_returns_is_cut_off_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, background: bool
) -> None:
    """Its call is waited for backend_timeout_s, then the plugin is cut off: named with
    the fix, counted, none of its hooks called again; every other observer sees every
    event and the run's files are what a run without the plugin writes."""
    sees, hangs = SeesWeights(), Hangs()
    plugins: list[tuple[str, object]] = [("sees", sees), ("hangs", hangs)]
    options: dict[str, Any] = {"autoload": False, "background_dispatch": background}
    start = time.monotonic()
    try:
        with RunSession(
            out_dir=tmp_path, run_id="hung", plugins=plugins, backend_timeout_s=0.5, **options
        ) as run:
            publish_weights_and_steps(run)
    finally:
        hangs.release.set()
    assert time.monotonic() - start < 30
    summary = summary_of(run)
    assert summary["status"] == "ok" and summary["observer_failures"] == {"hangs": 1}
    assert hangs.calls == 2 and sees.versions == list(range(WEIGHT_VERSIONS))
    assert sees.types[-2:] == ["run_finished", "backends_closed"]
    assert (
        "observer 'hangs': its twinkle_weights_published did not return within 0.5 s "
        "(backend_timeout_s): cut off"
    ) in caplog.text and "RunSession(blocked=['hangs'])" in caplog.text
    replay(tmp_path / "hung" / "events.jsonl", tmp_path / "again", autoload=False)
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "hung" / name).read_bytes()


# -- slow observers -----------------------------------------------------------------------


class TakesTime:
    """Advances ``clock`` by ``ns`` in every ``twinkle_event`` call (then raises, if told)."""

    def __init__(self, clock: ManualClock, ns: int, *, fail: bool = False) -> None:
        self.clock = clock
        self.ns = ns
        self.fail = fail

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        self.clock.advance(self.ns)
        if self.fail:
            raise RuntimeError("slow, then broken")


def hook_calls(*plugins: tuple[str, object], **options: Any) -> HookCalls:
    return HookCalls(
        make_plugin_manager(autoload=False, builtins=False, plugins=plugins), **options
    )


def an_event(i: int = 0) -> IterationStarted:
    return IterationStarted("r", i, i, i)


def test_observer_call_over_slow_call_s_is_counted_per_plugin_and_logged_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(0)
    calls = hook_calls(
        ("fast", TakesTime(clock, 900_000_000)),  # 0.9 s: under the budget
        ("slow", TakesTime(clock, 2_500_000_000)),
        ("at-budget", TakesTime(clock, 1_000_000_000)),  # exactly the budget is not over it
        slow_call_s=1.0,
        clock=clock,
    )
    assert calls.slow_call_s == 1.0
    with caplog.at_level("WARNING", logger="twinkle.plugins"):
        for i in range(5):
            calls.call("twinkle_event", event=an_event(i))
    # each call is timed on its own: 0.9 + 1.0 after a 2.5 s neighbour are not slow
    assert calls.slow == {"slow": 5}
    assert calls.failures == {}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"observer 'slow' took 2.500 s in twinkle_event, over slow_call_s=1.0 (slow call {n})"
        for n in (1, 2, 4)
    ]


def test_slow_observer_that_raises_counts_as_slow_and_as_failed() -> None:
    clock = ManualClock(0)
    calls = hook_calls(
        ("after", TakesTime(clock, 0)),
        ("broken", TakesTime(clock, 3_000_000_000, fail=True)),
        slow_call_s=0.5,
        clock=clock,
    )
    calls.call("twinkle_event", event=an_event())
    assert (calls.slow, calls.failures) == ({"broken": 1}, {"broken": 1})


def test_slow_call_s_none_reads_no_clock_and_counts_nothing() -> None:
    def no_clock() -> int:
        raise AssertionError("the clock was read with slow_call_s=None")

    sleeper = TakesTime(ManualClock(0), 10**12)
    calls = hook_calls(("sleeper", sleeper), slow_call_s=None, clock=no_clock)
    calls.call("twinkle_event", event=an_event())
    assert (calls.slow, calls.failures) == ({}, {})


def test_slow_observer_on_the_dispatch_thread_is_measured_with_the_real_clock(
    tmp_path: Path,
) -> None:
    class Sleeps:
        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            time.sleep(0.03)

    calls = hook_calls(("sleeps", Sleeps()), slow_call_s=0.01)
    assert HookCalls(make_plugin_manager(autoload=False, builtins=False)).slow_call_s == 1.0
    dispatcher = Dispatcher(calls, lambda record: record, background=True)
    try:
        for i in range(3):
            dispatcher.submit(an_event(i))
        dispatcher.flush()
    finally:
        dispatcher.close()
    assert calls.slow == {"sleeps": 3}


# -- callers that fail --------------------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError("trainer blew up"), KeyboardInterrupt()])
def test_caller_raising_mid_run_still_gets_an_error_summary_and_complete_files(
    tmp_path: Path, exc: BaseException
) -> None:
    run, clock = session(tmp_path, "caller-error", [])
    with pytest.raises(type(exc)):
        with run:
            drive(run, clock, iterations=3)
            raise exc
    summary = summary_of(run)
    assert summary["status"] == "error"
    assert summary["error"].startswith(type(exc).__qualname__)
    assert run.reporter is not None and run.reporter.closed
    same_records_as_replay_without(run, tmp_path)
    assert (tmp_path / "again-caller-error" / "summary.json").read_bytes() == (
        tmp_path / "caller-error" / "summary.json"
    ).read_bytes()


def test_failure_while_finishing_does_not_hide_the_callers_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run, clock = session(tmp_path, "double-fault", [])

    def disk_gone(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    with pytest.raises(ValueError, match="the caller's bug"):
        with run:
            drive(run, clock, iterations=2)
            monkeypatch.setattr(jsonl_mod, "_os_write", disk_gone)
            raise ValueError("the caller's bug")
    assert "finishing after ValueError failed" in caplog.text
    assert summary_of(run)["status"] == "error"


UNFINISHED = textwrap.dedent(
    """
    import sys
    from twinkle.run import RunSession

    run = RunSession(out_dir=sys.argv[1], run_id="unfinished", autoload=False).start()
    run.bus.iteration_started(0)
    run.bus.optimizer_step(iteration=0, step=1, samples=1)
    if sys.argv[2] == "raise":
        raise RuntimeError("uncaught, outside any with block")
    sys.exit(3)
    """
)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_run_never_finished_by_its_caller_is_closed_at_exit_as_an_error(
    tmp_path: Path, how: str
) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", UNFINISHED, str(tmp_path), how],
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == (1 if how == "raise" else 3)
    summary = json.loads((tmp_path / "unfinished" / "summary.json").read_text())
    assert summary["status"] == "error"
    assert "exited without finishing" in summary["error"]
    log = (tmp_path / "unfinished" / "events.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["type"] for line in log[-2:]] == ["run_finished", "backends_closed"]


class Sleepy:
    """Sleeps in every samples hook: a slow observer on the real clock."""

    @hookimpl
    def twinkle_samples(self, event: Any) -> None:
        time.sleep(0.02)


def test_slow_calls_are_in_the_summary_and_its_replay_says_the_same(tmp_path: Path) -> None:
    run = RunSession(
        out_dir=tmp_path,
        run_id="slow",
        autoload=False,
        plugins=[("sleepy", Sleepy())],
        slow_call_s=0.005,
    )
    with run:
        for i in range(3):
            run.bus.iteration_started(i)
            run.bus.samples(iteration=i, phase="rollout", lengths=[4])
    summary = summary_of(run)
    # sleepy's three calls; a built-in may add one on a loaded machine (real clock)
    assert summary["observer_slow_calls"]["sleepy"] == 3
    again = replay(
        tmp_path / "slow" / "events.jsonl", tmp_path / "re", plugins=[("sleepy", Sleepy())]
    )
    assert again.summary["observer_slow_calls"] == summary["observer_slow_calls"]  # the live run's
    live = (tmp_path / "slow" / "summary.json").read_bytes()
    assert (tmp_path / "re" / "summary.json").read_bytes() == live


# -- a plugin misusing the run from its hooks ----------------------------------------------


class FinishesTheRun:
    """Calls the run's finish() from its hook at the first weights publish."""

    def __init__(self) -> None:
        self.run: RunSession | None = None
        self.refused: list[str] = []

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        assert self.run is not None
        if event.version == 0:
            try:
                self.run.finish()
            except Exception as exc:
                self.refused.append(str(exc))
                raise


@pytest.mark.parametrize("background", [True, False])
def test_finishing_the_run_from_a_hook_is_refused_and_the_run_goes_on(
    tmp_path: Path, background: bool
) -> None:
    sees, finisher = SeesWeights(), FinishesTheRun()
    plugins: list[tuple[str, object]] = [("sees", sees), ("finisher", finisher)]
    run = RunSession(
        out_dir=tmp_path,
        run_id="r",
        autoload=False,
        plugins=plugins,
        background_dispatch=background,
    )
    finisher.run = run
    with run:
        publish_weights_and_steps(run)
    assert finisher.refused == [
        "cannot finish run 'r' from inside an observer's hook: the run waits for its hooks; "
        "finish it where the training runs"
    ]
    summary = summary_of(run)
    assert summary["status"] == "ok" and summary["observer_failures"] == {"finisher": 1}
    assert sees.versions == list(range(WEIGHT_VERSIONS))
    assert sees.types[-2:] == ["run_finished", "backends_closed"]
    same_records_as_replay_without(run, tmp_path)


class Opaque:
    """Not JSON (as a numpy number is not, to orjson)."""


class BadSummary:
    """Its summary part: ``part``."""

    def __init__(self, part: object) -> None:
        self.part = part

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> object:
        return self.part


class GoodSummary:
    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> dict[str, Any]:
        return {"mine": {"tokens_seen": 30}}


@pytest.mark.parametrize(
    ("part", "why"),
    [
        ({"tokens_seen": Opaque()}, "is not JSON (Type is not JSON serializable: Opaque"),
        ({"by_rank": {0: 1.5}}, "is not JSON (Dict key must be str"),
        (["tokens_seen", 30], "is a list, not a dict"),
    ],
    ids=["object", "int-key", "list"],
)
def test_a_summary_part_that_is_not_json_is_left_out_and_the_summary_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, part: object, why: str
) -> None:
    """Before, orjson's TypeError left the run without summary.json (and checkpoint)."""
    plugins: list[tuple[str, object]] = [("bad", BadSummary(part)), ("good", GoodSummary())]
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False, plugins=plugins) as run:
        publish_weights_and_steps(run)
    summary = summary_of(run)
    assert summary["status"] == "ok" and summary["observer_failures"] == {"bad": 1}
    assert summary["mine"] == {"tokens_seen": 30}
    assert f"observer 'bad' returned a summary part that {why}" in caplog.text
    again = replay(tmp_path / "r" / "events.jsonl", tmp_path / "again", autoload=False)
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["status"] == "ok"
    assert again.events > 0


class Forks:
    """Forks in its hook: the child exits at iteration 0 (sys.exit), returns from the
    hook at iteration 1; the parent waits for it and keeps its exit status."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        pid = os.fork()
        if pid == 0:
            if event.iteration == 0:
                sys.exit(3)
            return
        self.statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def test_a_child_a_plugin_forks_in_its_hook_ends_and_the_run_goes_on(tmp_path: Path) -> None:
    """On the plugin's thread, the child's only thread: it ends with its exit, or when
    its hook returns (it never waits for more calls), and the parent's run is whole."""
    forks = Forks()
    with RunSession(
        out_dir=tmp_path, run_id="f", autoload=False, plugins=[("forks", forks)]
    ) as run:
        run.bus.iteration_started(0)
        run.bus.iteration_started(1)
    assert forks.statuses == [3, 0]
    summary = summary_of(run)
    assert summary["status"] == "ok" and summary["observer_failures"] == {}
    same_records_as_replay_without(run, tmp_path)


class HangsInSetUp:
    """Its set-up never returns (a tracking server that never answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.release.wait()


def test_a_required_plugin_whose_set_up_never_returns_fails_the_start(tmp_path: Path) -> None:
    """It was cut off like any other, and the run went on without it, status ok."""
    hangs = HangsInSetUp()
    run = RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("needed", hangs)],
        required_plugins=["needed"], backend_timeout_s=0.3,
    )  # fmt: skip
    try:
        with pytest.raises(PluginError, match=r"plugin 'needed', which the run requires: its "
                           r"twinkle_configure did not return within 0\.3 s"):  # fmt: skip
            run.start()
    finally:
        hangs.release.set()


class HangsThenFinishes(Hangs):
    """Hangs, and has a hook of the run's end too."""

    @hookimpl
    def twinkle_run_finished(self) -> None:
        self.calls += 1


def test_ctrl_c_while_a_plugins_hook_hangs_comes_back_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait a signal's exception leaves gives up on the call: the run finishes at
    once (it waited backend_timeout_s more for the plugin's run_finished, then blamed
    that hook); the plugin is cut off naming the hook that hung."""
    hangs = HangsThenFinishes()
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    start = time.monotonic()
    run = RunSession(out_dir=tmp_path, run_id="r", autoload=False, plugins=[("hangs", hangs)],
                     background_dispatch=False)  # fmt: skip
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt), run:
            publish_weights_and_steps(run)
    finally:
        hangs.release.set()
        timer.cancel()
    assert time.monotonic() - start < 10  # (backend_timeout_s: 30)
    assert summary_of(run)["status"] == "error"
    assert "observer 'hangs' was interrupted in twinkle_weights_published" in caplog.text
    assert "observer 'hangs': its twinkle_weights_published never returned" in caplog.text
    assert "twinkle_run_finished did not return" not in caplog.text
    assert hangs.calls == 2  # (versions 0 and 1; its run_finished was never called)


class FlushesInItsHook:
    """Waits for the dispatch in its hook: it would wait for itself."""

    def __init__(self) -> None:
        self.run: RunSession | None = None

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        assert self.run is not None and self.run.dispatcher is not None
        self.run.dispatcher.flush()


def test_a_hook_waiting_for_the_dispatch_fails_at_once(tmp_path: Path) -> None:
    """On the plugin's thread, acting for the dispatch thread: refused at once, as on
    the dispatch thread itself (it stalled backend_timeout_s, then was cut off)."""
    flushes = FlushesInItsHook()
    run = RunSession(out_dir=tmp_path, run_id="r", autoload=False, plugins=[("f", flushes)])
    flushes.run = run
    start = time.monotonic()
    with run:
        publish_weights_and_steps(run)
    assert time.monotonic() - start < 10
    assert summary_of(run)["observer_failures"] == {"f": WEIGHT_VERSIONS}


class KeepsAConnection:
    """Opens a sqlite connection in its set-up and reads it for its checkpoint state:
    sqlite refuses a connection used on another thread than the one that opened it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connection: Any = None
        self.restored: object = None

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        import sqlite3

        self.connection = sqlite3.connect(self.path)
        self.connection.execute("create table if not exists seen (n integer)")

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        self.connection.execute("insert into seen values (?)", (event.version,))

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return self.connection.execute("select count(*) from seen").fetchone()[0]

    @hookimpl
    def twinkle_restore_state(self, state: object) -> None:
        self.restored = state

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        self.connection.close()


def test_a_plugins_checkpoint_state_is_taken_on_its_own_thread(tmp_path: Path) -> None:
    """As its other hooks: a connection its set-up opened serves it (taken on the
    dispatching thread, sqlite refused it and no checkpoint was written); a resume
    gives the state back."""
    keeps = KeepsAConnection(tmp_path / "seen.db")
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False, plugins=[("k", keeps)]) as run:
        publish_weights_and_steps(run)
    assert summary_of(run)["observer_failures"] == {}
    assert (tmp_path / "r" / "checkpoint.bin").is_file()
    again = KeepsAConnection(tmp_path / "seen.db")
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False, plugins=[("k", again)],
                    resume=True) as run:  # fmt: skip
        assert run.resumed is not None and run.resumed.restored_events > 0
    assert again.restored == WEIGHT_VERSIONS


class ChangesItsPart:
    """Changes the summary part it returned after the run took it."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {"seen": 1}

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> dict[str, Any]:
        return {"late": self.stats}

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        self.stats["closed_at"] = Opaque()


def test_a_summary_part_changed_after_it_was_taken_is_written_as_taken(tmp_path: Path) -> None:
    """summary.json, written after the plugins closed, holds the part as it was
    returned (it was lost to a value that stopped being JSON on the way)."""
    with RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("c", ChangesItsPart())]
    ) as run:
        publish_weights_and_steps(run)
    assert summary_of(run)["late"] == {"seen": 1}


class PublishesLate:
    """Its hook runs past its time, then publishes (the run's own bus) for a while."""

    def __init__(self) -> None:
        self.run: RunSession | None = None
        self.publishing = threading.Event()
        self.done = threading.Event()

    @hookimpl
    def twinkle_weights_published(self, event: WeightsPublished) -> None:
        assert self.run is not None
        if event.version != 1:
            return
        time.sleep(0.5)  # (cut off at 0.2 s)
        self.publishing.set()
        try:
            for _ in range(20_000):
                self.run.bus.scalars(iteration=0, name="late", values={"x": 1.0})
        except Exception:  # (once the run is over: refused)
            pass
        self.done.set()


@pytest.mark.parametrize("background", [False, True])
def test_a_cut_off_hook_acts_for_nobody_once_the_run_stopped_waiting(
    tmp_path: Path, background: bool
) -> None:
    """Its thread acted for the dispatching one after the wait was over: the main
    thread, taken for a hook's, had finish() refused ("from inside an observer's
    hook") and the run never finished. Now what it publishes is another thread's."""
    late = PublishesLate()
    run = RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("late", late)],
        background_dispatch=background, backend_timeout_s=0.2,
    )  # fmt: skip
    late.run = run
    with run:
        publish_weights_and_steps(run)
        assert late.publishing.wait(10)
        assert run.dispatcher is not None
        taken = 0
        until = time.monotonic() + 0.2
        while time.monotonic() < until:  # (while it publishes)
            taken += run.dispatcher.dispatching_here
        assert taken == 0
    assert late.done.wait(30)
    summary = summary_of(run)
    assert summary["status"] == "ok" and summary["observer_failures"] == {"late": 1}


def test_a_publish_while_the_run_closes_its_outputs_is_told_the_run_is_over(
    tmp_path: Path,
) -> None:
    """Between the run unbinding its bus (closing its outputs) and finish()'s end, a
    publish from another thread was refused as 'not started: call start()'."""
    closing = threading.Event()
    told: list[str] = []

    class SlowClose:
        @hookimpl
        def twinkle_unconfigure(self) -> None:
            closing.set()
            time.sleep(0.3)

    run = RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("slow", SlowClose())]
    ).start()

    def late() -> None:
        closing.wait(10)
        try:
            run.bus.scalars(iteration=0, name="loss", values={"x": 2.0})
        except TwinkleError as exc:
            told.append(str(exc))

    thread = threading.Thread(target=late)
    thread.start()
    run.finish()
    thread.join(10)
    assert len(told) == 1 and "is over" in told[0] and "not started" not in told[0], told


class _Counts:
    """A plugin's backend counting the records it is handed."""

    def __init__(self) -> None:
        self.records = 0

    def write(self, records: list[Any]) -> None:
        self.records += len(records)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_another_threads_events_stop_at_run_finished_so_summary_and_backends_agree(
    tmp_path: Path, background: bool
) -> None:
    """A thread publishing across finish(): its events kept reaching the observers after
    run_finished, while the summary was made and the plugins' backends closed. A
    backend missed hundreds of records that summary.json said it wrote, and the
    summary's last loss was not the last record's. Now the run takes no event from
    another thread once its run_finished is queued (the thread is told so)."""
    backend = _Counts()

    class Plugin:
        @hookimpl
        def twinkle_make_backends(self, context: RunContext) -> list[_Counts]:
            return [backend]

    run = RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("p", Plugin())],
        background_dispatch=background,
    ).start()  # fmt: skip
    going, told = threading.Event(), []

    def publishes() -> None:
        k = 0
        try:
            while True:
                k += 1
                run.bus.scalars(iteration=0, name="loss", values={"x": float(k)})
                going.set()
        except TwinkleError as exc:
            told.append(str(exc))

    thread = threading.Thread(target=publishes)
    thread.start()
    assert going.wait(10)
    time.sleep(0.01)
    summary = run.finish()
    thread.join(10)
    assert told and ("is finishing" in told[0] or "is over" in told[0]), told
    raw = [
        orjson.loads(x) for x in (tmp_path / "r" / "metrics_raw.jsonl").read_bytes().splitlines()
    ]
    health = summary["backends"]["p"]
    assert backend.records == len(raw) == health["records"] == health["records_written"]
    losses = [r["values"]["x"] for r in raw if r["kind"] == "loss"]
    assert summary["scalars"]["loss"]["x"]["last"] == losses[-1]
    assert summary["observer_failures"] == {}
