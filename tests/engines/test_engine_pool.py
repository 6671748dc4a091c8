"""twinkle.engines.pool: concurrent start-up, clean failure, shutdown of everything."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from twinkle.engines import (
    EnginePool,
    EngineStartCancelled,
    EngineStartTimeout,
    PortClaim,
    PortRegistry,
    StartContext,
    SubprocessEngine,
    launch_subprocess,
    wait_for_line,
)
from twinkle.engines._ping import ping, ping_engine_factory
from twinkle.engines.pool import DEFAULT_SHUTDOWN_TIMEOUT_S, EngineShutdownTimeout
from twinkle.errors import EngineStartError, InvalidArgumentError
from twinkle.perf import TimeRecorder


class FakeEngine:
    def __init__(self, name: str, log: list[str] | None = None) -> None:
        self.name = name
        self.running = True
        self.log = log

    def shutdown(self) -> None:
        self.running = False
        if self.log is not None:
            self.log.append(self.name)


def _host_registry() -> PortRegistry:
    """The host-wide registry, as in production: concurrent test runs coordinate too."""
    return PortRegistry()


def _own_claims(registry: PortRegistry) -> list[PortClaim]:
    return [c for c in registry.claims() if c.pid == os.getpid()]


def _live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


def _assert_gone(engines: list[SubprocessEngine]) -> None:
    live = _live_children()
    for engine in engines:
        assert engine.process.returncode is not None, engine  # reaped
        assert engine.pid not in live
        assert engine.reservation is not None and engine.reservation.released


def test_all_inits_are_in_flight_at_once_and_finish_in_under_two_t() -> None:
    n, t_s = 8, 0.2
    barrier = threading.Barrier(n, timeout=10)  # passes only when all n inits are running
    registry = _host_registry()

    def factory(ctx: StartContext) -> FakeEngine:
        with registry.reserve(2, label=ctx.name):  # the lock is not held during the init
            barrier.wait()
            time.sleep(t_s)
        return FakeEngine(ctx.name)

    recorder = TimeRecorder()
    with EnginePool[FakeEngine](recorder=recorder) as pool:
        t0 = time.monotonic()
        engines = pool.start({f"e{i}": factory for i in range(n)})
        elapsed = time.monotonic() - t0
        assert list(engines) == [f"e{i}" for i in range(n)]
        assert list(pool) == list(engines)
    assert elapsed < 2 * t_s, elapsed  # serialised would be n * t_s = 1.6 s
    assert all(not e.running for e in engines.values())
    spans = recorder.drain()
    starts = [s for s in spans if s.name == "engine.start"]
    assert sorted(s.attrs["engine"] for s in starts) == sorted(engines)
    assert all(s.error is None and s.duration_ns >= t_s * 1e9 for s in starts)
    # every start span overlaps every other one: they really ran concurrently
    assert max(s.start_ns for s in starts) < min(s.end_ns for s in starts)
    assert sorted(s.attrs["engine"] for s in spans if s.name == "engine.shutdown") == sorted(
        engines
    )


def test_max_concurrency_bounds_the_starts_in_flight() -> None:
    lock = threading.Lock()
    in_flight, peak = 0, 0

    def factory(ctx: StartContext) -> FakeEngine:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.02)
        with lock:
            in_flight -= 1
        return FakeEngine(ctx.name)

    with EnginePool[FakeEngine](recorder=TimeRecorder(), max_concurrency=3) as pool:
        assert len(pool.start({f"e{i}": factory for i in range(10)})) == 10
    assert peak == 3


def test_a_failing_factory_is_named_and_the_others_are_shut_down() -> None:
    shut: list[str] = []
    started = threading.Barrier(4, timeout=10)

    def good(ctx: StartContext) -> FakeEngine:
        started.wait()
        return FakeEngine(ctx.name, shut)

    def bad(ctx: StartContext) -> FakeEngine:
        started.wait()
        time.sleep(0.05)  # the others are up by now
        raise RuntimeError("CUDA out of memory")

    recorder = TimeRecorder()
    pool: EnginePool[FakeEngine] = EnginePool(recorder=recorder)
    with pytest.raises(EngineStartError, match="'bad'") as info:
        pool.start({"a": good, "b": good, "bad": bad, "c": good})
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "CUDA out of memory" in str(info.value)
    assert sorted(shut) == ["a", "b", "c"]
    assert len(pool) == 0
    failed = [s for s in recorder.drain() if s.name == "engine.start" and s.error]
    assert [s.attrs["engine"] for s in failed] == ["bad"]


def test_keep_started_on_failure_keeps_the_others_until_close() -> None:
    shut: list[str] = []

    def bad(ctx: StartContext) -> FakeEngine:
        raise ValueError("bad config")

    pool: EnginePool[FakeEngine] = EnginePool(
        recorder=TimeRecorder(), keep_started_on_failure=True, max_concurrency=1
    )
    with pytest.raises(EngineStartError, match="kept running"):
        pool.start({"a": lambda ctx: FakeEngine(ctx.name, shut), "bad": bad})
    assert list(pool.engines) == ["a"] and shut == []
    pool.close()
    assert shut == ["a"]


def test_failure_cancels_the_starts_in_flight_and_skips_the_queued() -> None:
    calls: list[str] = []

    def slow(ctx: StartContext) -> FakeEngine:
        calls.append(ctx.name)
        ctx.cancelled.wait(30)
        ctx.check_cancelled()
        return FakeEngine(ctx.name)

    def bad(ctx: StartContext) -> FakeEngine:
        time.sleep(0.05)
        raise OSError("no device")

    factories: dict[str, Callable[[StartContext], FakeEngine]] = {"slow": slow, "bad": bad}
    factories |= {f"queued{i}": slow for i in range(3)}
    pool: EnginePool[FakeEngine] = EnginePool(recorder=TimeRecorder(), max_concurrency=2)
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match="'bad'") as info:
        pool.start(factories)
    assert time.monotonic() - t0 < 5
    assert calls == ["slow"]  # the queued ones never started
    assert "queued0" in str(info.value)
    assert not isinstance(info.value, EngineStartCancelled)


def test_start_timeout_raises_and_a_late_engine_is_still_shut_down() -> None:
    late = FakeEngine("stuck")
    release = threading.Event()

    def stuck(ctx: StartContext) -> FakeEngine:
        release.wait(10)  # ignores cancellation
        return late

    pool: EnginePool[FakeEngine] = EnginePool(recorder=TimeRecorder(), start_timeout_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(EngineStartTimeout, match=r"'stuck'.*start_timeout_s") as info:
        pool.start({"stuck": stuck})
    assert time.monotonic() - t0 < 2
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value.__cause__, TimeoutError)
    release.set()
    pool.close()  # waits for the late factory and its engine's shutdown
    assert not late.running


def test_an_interrupted_start_shuts_down_started_and_late_engines() -> None:
    class Interrupted(Exception):
        pass

    def on_signal(signum: int, frame: object) -> None:
        raise Interrupted

    fast, late = FakeEngine("fast"), FakeEngine("late")
    release = threading.Event()

    def slow(ctx: StartContext) -> FakeEngine:
        release.wait(10)
        return late

    def interrupt() -> None:
        time.sleep(0.1)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    pool: EnginePool[FakeEngine] = EnginePool(recorder=TimeRecorder())
    try:
        threading.Thread(target=interrupt).start()
        with pytest.raises(Interrupted):
            pool.start({"fast": lambda c: fast, "slow": slow})  # like Ctrl-C while waiting
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not fast.running and late.running
    release.set()
    pool.close()
    assert not late.running


def test_close_shuts_everything_down_and_reraises_the_first_shutdown_error() -> None:
    shut: list[str] = []

    class Broken(FakeEngine):
        def shutdown(self) -> None:
            raise RuntimeError("stuck in teardown")

    pool: EnginePool[FakeEngine] = EnginePool(recorder=TimeRecorder())
    pool.start({"a": lambda c: FakeEngine("a", shut), "broken": lambda c: Broken("broken")})
    pool.start({"b": lambda c: FakeEngine("b", shut)})  # a second batch joins the pool
    with pytest.raises(RuntimeError, match="stuck in teardown") as info:
        pool.close()
    assert "while shutting down engine 'broken'" in info.value.__notes__
    assert sorted(shut) == ["a", "b"]
    pool.close()  # idempotent
    with pytest.raises(InvalidArgumentError, match="closed"):
        pool.start({"c": lambda c: FakeEngine("c")})


def test_bad_arguments_are_named() -> None:
    with pytest.raises(InvalidArgumentError, match="max_concurrency="):
        EnginePool(max_concurrency=0)
    with pytest.raises(InvalidArgumentError, match="start_timeout_s="):
        EnginePool(start_timeout_s=0)
    with EnginePool[FakeEngine](recorder=TimeRecorder()) as pool:
        with pytest.raises(InvalidArgumentError, match="empty"):
            pool.start({})
        with pytest.raises(InvalidArgumentError, match="not a callable"):
            pool.start({"x": 3})  # type: ignore[dict-item]
        pool.start({"x": lambda c: FakeEngine("x")})
        with pytest.raises(InvalidArgumentError, match="already running"):
            pool.start({"x": lambda c: FakeEngine("x")})


def test_subprocess_engines_start_concurrently_without_port_collisions() -> None:
    """16 real engines per round, 20 rounds: each binds its reserved ports and answers."""
    registry = _host_registry()
    factory = ping_engine_factory(registry, ports=2, inherited=1)
    for round_ in range(20):
        with EnginePool[SubprocessEngine](recorder=TimeRecorder(), start_timeout_s=30) as pool:
            engines = pool.start({f"r{round_}-e{i}": factory for i in range(16)})
            ports = [p for e in engines.values() for p in e.ports]
            assert len(set(ports)) == 32
            for name, engine in engines.items():
                for port in engine.ports:  # the inherited socket and the one bound by number
                    assert ping(port) == f"pong {name} {port}"
            assert _live_children() >= {e.pid for e in engines.values()}
        _assert_gone(list(engines.values()))
        assert _own_claims(registry) == []
    deadline = time.monotonic() + 5
    while any(t.name.startswith("twinkle-engine") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "pool threads left behind"
        time.sleep(0.01)


def test_a_failed_subprocess_start_leaves_nothing_running() -> None:
    registry = _host_registry()
    fast = ping_engine_factory(registry)
    slow = ping_engine_factory(registry, init_delay_s=30)  # still initialising at the failure
    started: list[SubprocessEngine] = []
    three_up = threading.Event()

    def tracked(ctx: StartContext) -> SubprocessEngine:
        engine = fast(ctx)
        started.append(engine)
        if len(started) == 3:
            three_up.set()
        return engine

    def crashing(ctx: StartContext) -> SubprocessEngine:
        three_up.wait(10)
        # a real child that dies during its init: the error says so
        return ping_engine_factory(registry, python="/bin/false")(ctx)

    before = _live_children()
    pool: EnginePool[SubprocessEngine] = EnginePool(recorder=TimeRecorder())
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match="'crash'") as info:
        pool.start({"a": tracked, "b": tracked, "slow": slow, "crash": crashing, "c": tracked})
    assert time.monotonic() - t0 < 10  # the slow one was cancelled, not waited for
    assert "exited before it was ready" in str(info.value.__cause__)
    assert len(started) == 3
    _assert_gone(started)
    assert _live_children() - before == set()
    assert _own_claims(registry) == []


# -- bounded shutdown ---------------------------------------------------------------------


class HangingEngine(FakeEngine):
    """Its shutdown blocks until ``released`` (or ``kill()``, if it has one, releases it)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.released = threading.Event()

    def shutdown(self) -> None:
        self.released.wait(60)
        self.running = False


class KillableHangingEngine(HangingEngine):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.killed = 0

    def kill(self) -> None:
        self.killed += 1
        self.released.set()


@pytest.mark.parametrize("max_concurrency", [None, 1])
def test_close_gives_up_on_a_hanging_shutdown_and_still_closes_the_others(
    max_concurrency: int | None,
) -> None:
    shut: list[str] = []
    hung = HangingEngine("hung")
    pool: EnginePool[FakeEngine] = EnginePool(
        recorder=TimeRecorder(), shutdown_timeout_s=0.2, max_concurrency=max_concurrency
    )
    assert pool.shutdown_timeout_s == 0.2
    pool.start({"hung": lambda c: hung, "a": lambda c: FakeEngine("a", shut)})
    pool.start({"b": lambda c: FakeEngine("b", shut)})
    t0 = time.monotonic()
    try:
        with pytest.raises(
            EngineShutdownTimeout, match=r"'hung'.*shutdown_timeout_s=0\.2 s"
        ) as info:
            pool.close()
        assert time.monotonic() - t0 < 3  # one 0.2 s timeout (no kill to wait for), not 60 s
        assert "has no kill()" in str(info.value)
        assert isinstance(info.value, TimeoutError)
        assert "while shutting down engine 'hung'" in info.value.__notes__
        assert sorted(shut) == ["a", "b"]
        assert hung.running
    finally:
        hung.released.set()  # let its shutdown thread end


def test_close_kills_an_engine_whose_shutdown_hangs() -> None:
    hung = KillableHangingEngine("hung")
    pool: EnginePool[FakeEngine] = EnginePool(recorder=TimeRecorder(), shutdown_timeout_s=0.2)
    pool.start({"hung": lambda c: hung})
    with pytest.raises(EngineShutdownTimeout, match=r"'hung'.*killed it"):
        pool.close()
    assert hung.killed == 1
    assert not hung.running  # its shutdown returned once killed


def test_shutdown_within_the_timeout_is_not_killed() -> None:
    slowish = KillableHangingEngine("slowish")
    threading.Timer(0.1, slowish.released.set).start()
    with EnginePool[KillableHangingEngine](recorder=TimeRecorder(), shutdown_timeout_s=5) as pool:
        pool.start({"slowish": lambda c: slowish})
    assert slowish.killed == 0 and not slowish.running


IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


def test_close_sigkills_a_subprocess_engine_that_ignores_sigterm(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=(15000, 19999))

    def stubborn(ctx: StartContext) -> SubprocessEngine:
        return launch_subprocess(
            ctx,
            [sys.executable, "-c", IGNORES_SIGTERM],
            ready=wait_for_line("ready"),
            capture_stdout=True,
            reservation=registry.reserve(label=ctx.name),
            stop_timeout_s=60,  # its own SIGTERM-to-SIGKILL wait: far beyond the pool's
        )

    shut: list[str] = []
    pool: EnginePool[FakeEngine | SubprocessEngine] = EnginePool(
        recorder=TimeRecorder(), shutdown_timeout_s=0.5, start_timeout_s=30
    )
    engines = pool.start({"stubborn": stubborn, "other": lambda c: FakeEngine("other", shut)})
    engine = engines["stubborn"]
    assert isinstance(engine, SubprocessEngine)
    t0 = time.monotonic()
    with pytest.raises(EngineShutdownTimeout, match=r"'stubborn'.*SIGKILL") as info:
        pool.close()
    assert time.monotonic() - t0 < 10, info.value
    assert engine.process.returncode == -signal.SIGKILL
    _assert_gone([engine])
    assert registry.claims() == []
    assert shut == ["other"]


def test_shutdown_timeout_s_defaults_to_30_s_and_none_means_no_limit() -> None:
    # the refusals of bad values: tests/reliability/test_reliability_bad_input_engines.py
    assert EnginePool().shutdown_timeout_s == DEFAULT_SHUTDOWN_TIMEOUT_S == 30.0
    assert EnginePool(shutdown_timeout_s=None).shutdown_timeout_s is None
