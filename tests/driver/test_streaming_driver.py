"""StreamingDriver: event order, staleness, back-pressure, failures and shutdown.

Every test uses deterministic fake producers and engines, a manual bus clock, and
threading.Event gates instead of sleeps.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import twinkle.events as ev
from twinkle.driver import (
    CloseReport,
    DriverState,
    DriverTimeoutError,
    Item,
    ProducersExhaustedError,
    ProducerState,
    ProducerStats,
    StreamingDriver,
)
from twinkle.errors import DriverError, InvalidArgumentError
from twinkle.events import EventBus
from twinkle.perf import ManualClock

SECOND = 1_000_000_000
WAIT = 5.0  # generous upper bound for gates; tests finish far sooner


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(10 * SECOND)


@pytest.fixture
def bus(clock: ManualClock) -> EventBus:
    return EventBus("driver-test", clock=clock, wall_clock=lambda: 1_700_000_000 * SECOND)


class EventLog:
    """Records the driver's three events, in the order the bus sent them."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[ev.Event] = []
        self._lock = threading.Lock()
        self._bus = bus
        self._signals = (ev.iteration_started, ev.weights_published, ev.snapshot)
        for signal in self._signals:
            signal.connect(self._receive, sender=bus, weak=False)
        self.hooks: list[Callable[[ev.Event], None]] = []

    def _receive(self, sender: object, *, event: ev.Event) -> None:
        for hook in self.hooks:
            hook(event)
        with self._lock:
            self.events.append(event)

    def kinds(self) -> list[str]:
        out = []
        for e in self.events:
            if isinstance(e, ev.IterationStarted):
                out.append(f"iteration {e.iteration}")
            elif isinstance(e, ev.WeightsPublished):
                out.append(f"weights v{e.version}")
            else:
                out.append("snapshot")
        return out

    def close(self) -> None:
        for signal in self._signals:
            signal.disconnect(self._receive, sender=self._bus)


@pytest.fixture
def log(bus: EventBus) -> Iterator[EventLog]:
    recorder = EventLog(bus)
    yield recorder
    recorder.close()


def counter() -> Callable[[int], int]:
    """A fast, endless producer of 0, 1, 2, ..."""
    numbers = itertools.count()

    def produce(version: int) -> int:
        return next(numbers)

    return produce


class Gate:
    """A producer that makes one item per release(); close() makes it stop."""

    def __init__(self) -> None:
        self._sem = threading.Semaphore(0)
        self._closed = threading.Event()
        self.entered = threading.Event()
        self.versions: list[int] = []
        self._n = itertools.count()

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._sem.release()

    def close(self) -> None:
        self._closed.set()
        self._sem.release()

    def __call__(self, version: int) -> int:
        self.versions.append(version)
        self.entered.set()
        self._sem.acquire()
        if self._closed.is_set():
            raise StopIteration
        return next(self._n)


class Engine:
    """A fake inference engine; optionally blocks until released or raises."""

    def __init__(self, name: str, *, gate: threading.Event | None = None, error: bool = False):
        self.name = name
        self.loaded: list[int] = []
        self.started = threading.Event()
        self._gate = gate
        self._error = error

    def load_weights(self, version: int, weights: Any) -> None:
        self.started.set()
        if self._gate is not None:
            self._gate.wait(WAIT)
        if self._error:
            raise RuntimeError(f"{self.name} cannot load version {version}")
        self.loaded.append(version)


def producer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("twinkle-")}


# -- events ------------------------------------------------------------------------------


def test_events_are_published_in_loop_order_and_weights_only_after_every_ack(
    bus: EventBus, log: EventLog
) -> None:
    engines = [Engine("e0"), Engine("e1")]
    seen_at_publish: list[tuple[list[list[int]], int]] = []
    with StreamingDriver({"p": counter()}, bus=bus, publisher=engines, buffer_size=4) as driver:

        def check(event: ev.Event) -> None:
            if isinstance(event, ev.WeightsPublished):
                seen_at_publish.append(([list(e.loaded) for e in engines], driver.version))

        log.hooks.append(check)
        for i in range(3):
            batch = driver.next_batch(2)
            assert [type(item) for item in batch] == [Item, Item]
            assert all(driver.version - item.version <= 1 for item in batch)
            assert driver.publish_weights({"w": i}) == i + 1
            driver.snapshot()
    assert log.kinds() == [
        "iteration 0", "weights v1", "snapshot",
        "iteration 1", "weights v2", "snapshot",
        "iteration 2", "weights v3", "snapshot",
    ]  # fmt: skip
    # When weights_published fired, every engine had loaded the version, and producers
    # were still on the previous one: the bump comes after the event.
    assert seen_at_publish == [
        ([[1], [1]], 0),
        ([[1, 2], [1, 2]], 1),
        ([[1, 2, 3], [1, 2, 3]], 2),
    ]
    published = [e for e in log.events if isinstance(e, ev.WeightsPublished)]
    assert [[a.engine for a in e.acks] for e in published] == [["e0", "e1"]] * 3
    assert [e.iteration for e in log.events if isinstance(e, ev.IterationStarted)] == [0, 1, 2]


def test_weights_published_end_is_the_last_engine_ack(
    bus: EventBus, clock: ManualClock, log: EventLog
) -> None:
    release_slow = threading.Event()
    fast, slow = Engine("fast"), Engine("slow", gate=release_slow)
    with StreamingDriver([counter()], bus=bus, publisher=[fast, slow]) as driver:
        start = clock()
        assert driver.publish_weights(b"weights", wait=False) == 1
        assert slow.started.wait(WAIT)
        assert driver.state()["publishing"] == 1
        assert log.events == []  # not before the slow engine acknowledged
        clock.advance(5 * SECOND)
        release_slow.set()
        assert driver.wait_published(timeout=WAIT) == 1
    (event,) = log.events
    assert isinstance(event, ev.WeightsPublished)
    assert event.start_ns == start
    acks = {a.engine: a.acked_ns for a in event.acks}
    assert acks["slow"] == start + 5 * SECOND
    assert acks["fast"] in (start, start + 5 * SECOND)
    assert event.end_ns == start + 5 * SECOND


def test_publisher_function_acks_are_stamped_or_taken_as_given(
    bus: EventBus, clock: ManualClock, log: EventLog
) -> None:
    def publisher(version: int, weights: Any) -> Iterator[Any]:
        yield "a"  # stamped with the bus clock when received
        clock.advance(SECOND)
        yield ("b", clock() + 7)

    with StreamingDriver([counter()], bus=bus, publisher=publisher) as driver:
        start = clock()
        assert driver.publish_weights(None, version=4) == 4
        assert driver.version == 4
    (event,) = log.events
    assert isinstance(event, ev.WeightsPublished)
    assert [(a.engine, a.acked_ns) for a in event.acks] == [
        ("a", start),
        ("b", start + SECOND + 7),
    ]
    assert (event.start_ns, event.end_ns) == (start, start + SECOND + 7)


def test_manual_iterations_begin_only_when_asked(bus: EventBus, log: EventLog) -> None:
    with StreamingDriver([counter()], bus=bus, auto_iterations=False) as driver:
        assert driver.iteration is None
        assert driver.begin_iteration() == 0
        driver.next_batch(1)
        driver.next_batch(1)
        assert driver.begin_iteration() == 1
        assert driver.iteration == 1
    assert log.kinds() == ["iteration 0", "iteration 1"]


def test_snapshot_is_a_plain_dict_of_counts(bus: EventBus, log: EventLog) -> None:
    with StreamingDriver({"a": counter(), "b": counter()}, bus=bus, buffer_size=4) as driver:
        driver.wait_until(lambda s: s["buffered"] == 4, WAIT)
        driver.next_batch(3)
        state = driver.snapshot()
    (event,) = [e for e in log.events if isinstance(e, ev.Snapshot)]
    assert event.state == state
    assert set(state["producers"]) == {"a", "b"}
    assert state["consumed"] == 3
    assert state["version"] == 0
    assert state["high_water_mark"] == 4
    assert state["iterations_started"] == 1
    assert state["failure"] is None and state["hung"] == []
    for p in state["producers"].values():
        assert p["produced"] == p["consumed"] + p["buffered"] + p["dropped"]
    # the event holds plain strings, as a replay reads them back from the log
    assert {type(p["state"]) for p in event.state["producers"].values()} == {str}
    # JSON round trip through the event codec
    assert ev.loads_event(ev.dumps_event(event)) == event


def test_state_keys_are_the_declared_keys_in_order(bus: EventBus, log: EventLog) -> None:
    # Order matters too: the snapshot line in events.jsonl must stay byte-identical.
    declared = list(DriverState.__annotations__)
    assert set(declared) == DriverState.__required_keys__
    with StreamingDriver({"a": counter(), "b": counter()}, bus=bus, buffer_size=2) as driver:
        driver.next_batch(1)
        state = driver.snapshot()
    (event,) = [e for e in log.events if isinstance(e, ev.Snapshot)]
    for shown in (state, event.state):
        assert list(shown) == declared
        for p in shown["producers"].values():
            assert list(p) == list(ProducerStats.__annotations__)
            assert set(p) == ProducerStats.__required_keys__


def test_producer_states_are_enum_members_with_the_documented_values(bus: EventBus) -> None:
    documented = ["new", "producing", "blocked", "exhausted", "failed", "stopped", "hung"]
    assert [member.value for member in ProducerState] == documented
    finished = {s for s in ProducerState if s.finished}
    assert finished == {
        ProducerState.EXHAUSTED,
        ProducerState.FAILED,
        ProducerState.STOPPED,
        ProducerState.HUNG,
    }
    driver = StreamingDriver({"p": ["x"]}, bus=bus)
    assert driver.state()["producers"]["p"]["state"] is ProducerState.NEW
    driver.start()
    state = driver.wait_until(
        lambda s: s["producers"]["p"]["state"] is ProducerState.EXHAUSTED, WAIT
    )
    assert isinstance(state["producers"]["p"]["state"], ProducerState)
    driver.close()
    assert driver.state()["producers"]["p"]["state"] is ProducerState.EXHAUSTED


# -- staleness -----------------------------------------------------------------------------


def test_buffered_items_too_stale_are_dropped_and_counted(bus: EventBus) -> None:
    gate = Gate()
    driver = StreamingDriver({"g": gate}, bus=bus, publisher=[Engine("e")], max_staleness=1)
    with driver:
        gate.release(3)
        # three items made with version 0, and the 4th begun with version 0 too
        driver.wait_until(
            lambda s: s["producers"]["g"]["produced"] == 3 and len(gate.versions) == 4, WAIT
        )
        driver.publish_weights("w1")  # 1 behind: still fresh enough
        assert driver.state()["buffered"] == 3
        driver.publish_weights("w2")  # 2 behind: dropped
        state = driver.state()
        assert (state["buffered"], state["dropped"]) == (0, 3)
        assert state["producers"]["g"]["dropped"] == 3
        gate.release(3)  # the 4th item (version 0) is dropped when it arrives
        batch = driver.next_batch(2, timeout=WAIT)
        assert [(item.payload, item.version) for item in batch] == [(4, 2), (5, 2)]
        state = driver.state()
        assert state["producers"]["g"]["dropped"] == 4
        assert state["producers"]["g"]["produced"] == 6
        gate.close()


def test_item_that_became_stale_while_produced_is_dropped(bus: EventBus) -> None:
    gate = Gate()
    with StreamingDriver({"g": gate}, bus=bus, publisher=[Engine("e")], max_staleness=0) as driver:
        assert gate.entered.wait(WAIT)  # producing with version 0
        driver.publish_weights("w1")
        gate.release(1)  # finishes the version-0 item after v1 is live
        state = driver.wait_until(lambda s: s["producers"]["g"]["dropped"] == 1, WAIT)
        assert state["buffered"] == 0 and state["producers"]["g"]["produced"] == 1
        gate.release(1)
        (item,) = driver.next_batch(1, timeout=WAIT)
        assert (item.payload, item.version, item.producer) == (1, 1, "g")
        gate.close()


# -- back-pressure and waiting ----------------------------------------------------------------


def test_full_buffer_blocks_the_producer_and_counts_idle_time(
    bus: EventBus, clock: ManualClock
) -> None:
    calls = itertools.count()

    def produce(version: int) -> int:
        return next(calls)

    with StreamingDriver({"p": produce}, bus=bus, buffer_size=2) as driver:
        state = driver.wait_until(
            lambda s: s["producers"]["p"]["state"] is ProducerState.BLOCKED, WAIT
        )
        assert (state["buffered"], state["producers"]["p"]["produced"]) == (2, 2)
        clock.advance(3 * SECOND)
        assert driver.state()["producers"]["p"]["idle_seconds"] == 3.0
        assert [i.payload for i in driver.next_batch(1)] == [0]
        # the held item goes in, the producer makes one more and blocks again
        state = driver.wait_until(
            lambda s: (
                s["producers"]["p"]["produced"] == 3
                and s["producers"]["p"]["state"] is ProducerState.BLOCKED
            ),
            WAIT,
        )
        assert state["producers"]["p"]["idle_seconds"] == 3.0
        assert state["high_water_mark"] == 2
        assert state["producers"]["p"]["consumed"] == 1
        assert next(calls) == 4  # produced 0..3: exactly one item held while blocked


def test_trainer_wait_is_measured_on_the_bus_clock(bus: EventBus, clock: ManualClock) -> None:
    gate = Gate()
    with StreamingDriver({"g": gate}, bus=bus) as driver:

        def slow_rollout() -> None:
            driver.wait_until(lambda s: s["trainer_waiting"], WAIT)
            clock.advance(2 * SECOND)
            gate.release(1)

        helper = threading.Thread(target=slow_rollout)
        helper.start()
        (item,) = driver.next_batch(1, timeout=WAIT)
        helper.join()
        state = driver.state()
        assert state["trainer_wait_seconds"] == 2.0
        assert not state["trainer_waiting"]
        assert item.produced_ns == 12 * SECOND
        gate.close()


def test_next_batch_times_out_and_keeps_what_was_buffered(bus: EventBus) -> None:
    gate = Gate()
    with StreamingDriver({"g": gate}, bus=bus) as driver:
        gate.release(1)
        driver.wait_until(lambda s: s["buffered"] == 1, WAIT)
        with pytest.raises(DriverTimeoutError, match=r"n=2.*1 item") as info:
            driver.next_batch(2, timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert [i.payload for i in driver.next_batch(1)] == [0]
        gate.close()


def test_exhausted_iterable_producers_end_with_a_clear_error(bus: EventBus) -> None:
    with StreamingDriver({"it": ["a", "b", "c"]}, bus=bus) as driver:
        assert [i.payload for i in driver.next_batch(2)] == ["a", "b"]
        with pytest.raises(ProducersExhaustedError, match="1 item"):
            driver.next_batch(2)
        (last,) = driver.next_batch(1)
        assert (last.payload, last.version, last.producer) == ("c", 0, "it")
        assert driver.state()["producers"]["it"]["state"] is ProducerState.EXHAUSTED


def test_producer_with_produce_method_and_name_attribute(bus: EventBus) -> None:
    class Rollouts:
        name = "vllm-0"

        def produce(self, version: int) -> str:
            return f"sample@{version}"

    with StreamingDriver([Rollouts()], bus=bus) as driver:
        (item,) = driver.next_batch(1)
    assert (item.payload, item.producer) == ("sample@0", "vllm-0")


# -- failures --------------------------------------------------------------------------------


def failing_producer(boom: threading.Event) -> Callable[[int], int]:
    calls = itertools.count()

    def flaky_rollout(version: int) -> int:
        n = next(calls)
        if n == 2:
            boom.wait(WAIT)
            raise ValueError("reward model unreachable")
        return n

    return flaky_rollout


@pytest.mark.parametrize("call", ["next_batch", "publish_weights", "snapshot"])
def test_producer_failure_surfaces_at_the_next_call_within_a_second(
    bus: EventBus, call: str
) -> None:
    boom = threading.Event()
    gate = Gate()
    driver = StreamingDriver[int](
        {"ok": gate, "flaky": failing_producer(boom)},
        bus=bus,
        publisher=[Engine("e")],
        buffer_size=4,
    )
    with driver:
        driver.wait_until(lambda s: s["producers"]["flaky"]["produced"] == 2, WAIT)
        started = time.monotonic()
        boom.set()
        with pytest.raises(DriverError, match=r"producer 'flaky' raised ValueError") as info:
            if call == "next_batch":
                driver.next_batch(4, timeout=WAIT)  # blocks: only 2 items will come
            else:
                driver.wait_until(lambda s: s["failure"] is not None, WAIT)
                getattr(driver, call)(*(["w"] if call == "publish_weights" else []))
        assert time.monotonic() - started < 1.0
        cause = info.value.__cause__
        assert isinstance(cause, ValueError)
        assert "flaky_rollout" in {f.name for f in _frames(cause)}
        assert driver.state()["producers"]["flaky"]["state"] is ProducerState.FAILED
        with pytest.raises(DriverError):
            driver.next_batch(1)
        gate.close()


def _frames(exc: BaseException) -> list[Any]:
    import traceback

    return list(traceback.extract_tb(exc.__traceback__))


def test_engine_failure_raises_naming_the_engine_and_keeps_the_version(bus: EventBus) -> None:
    engines = [Engine("good"), Engine("bad", error=True)]
    with pytest.raises(DriverError, match=r"engine 'bad' \(publishing weights version 1\)"):
        with StreamingDriver([counter()], bus=bus, publisher=engines) as driver:
            try:
                driver.publish_weights("w")
            except DriverError as exc:
                assert isinstance(exc.__cause__, RuntimeError)
                assert driver.version == 0
                raise


def test_background_publish_failure_surfaces_at_next_batch(bus: EventBus, log: EventLog) -> None:
    def publisher(version: int, weights: Any) -> Iterator[str]:
        yield "e0"
        raise ConnectionError("engine e1 went away")

    with StreamingDriver([counter()], bus=bus, publisher=publisher) as driver:
        driver.publish_weights("w", wait=False)
        driver.wait_until(lambda s: s["publishing"] is None, WAIT)
        with pytest.raises(DriverError, match="the publisher") as info:
            driver.next_batch(1)
        assert isinstance(info.value.__cause__, ConnectionError)
        assert driver.version == 0
    assert "weights v1" not in log.kinds()


def test_publish_timeout_names_the_engines_not_acknowledged(bus: EventBus) -> None:
    release = threading.Event()
    with StreamingDriver(
        [counter()], bus=bus, publisher=[Engine("quick"), Engine("stuck", gate=release)]
    ) as driver:
        with pytest.raises(DriverTimeoutError, match=r"\['stuck'\]"):
            driver.publish_weights("w", timeout=0.1)
        release.set()
        assert driver.wait_published(timeout=WAIT) == 1


def test_unreported_failure_is_raised_when_the_with_block_ends(bus: EventBus) -> None:
    boom = threading.Event()
    boom.set()
    with pytest.raises(DriverError, match="flaky") as info:
        with StreamingDriver({"flaky": failing_producer(boom)}, bus=bus) as driver:
            driver.wait_until(lambda s: s["failure"] is not None, WAIT)
    assert isinstance(info.value.__cause__, ValueError)


# -- shutdown --------------------------------------------------------------------------------


def test_close_stops_every_thread(bus: EventBus) -> None:
    before = set(threading.enumerate())
    gate = Gate()
    engines = [Engine("e0"), Engine("e1")]
    with StreamingDriver[int](
        {"fast": counter(), "gated": gate, "list": list(range(3))},
        bus=bus,
        publisher=engines,
        buffer_size=2,
    ) as driver:
        driver.next_batch(2)
        driver.publish_weights("w")
        driver.publish_weights("w", wait=False)
        assert producer_threads()
        gate.close()
    assert driver.close() == CloseReport()  # idempotent, and clean
    assert set(threading.enumerate()) == before
    with pytest.raises(DriverError, match="closed"):
        driver.next_batch(1)


def test_hung_producer_is_reported_not_waited_for(bus: EventBus) -> None:
    release = threading.Event()

    def hangs(version: int) -> int:
        release.wait(30)
        return 0

    driver = StreamingDriver({"hangs": hangs, "fine": counter()}, bus=bus, buffer_size=2)
    driver.start()
    try:
        started = time.monotonic()
        report = driver.close(timeout=0.5)
        assert time.monotonic() - started < 1.5
        assert report.hung_producers == ("hangs",)
        assert not report.clean
        state = driver.snapshot()
        assert state["hung"] == ["hangs"]
        assert state["producers"]["hangs"]["state"] is ProducerState.HUNG
        assert state["producers"]["fine"]["state"] is ProducerState.STOPPED
        thread = next(t for t in threading.enumerate() if t.name == "twinkle-producer-hangs")
        assert thread.daemon
    finally:
        release.set()
    thread.join(WAIT)
    assert not thread.is_alive()


@pytest.mark.parametrize("kind", ["engine", "publisher"])
def test_hung_weight_loading_is_reported_at_close(bus: EventBus, log: EventLog, kind: str) -> None:
    release = threading.Event()
    stuck = Engine("stuck", gate=release)

    def publisher(version: int, weights: Any) -> Iterator[str]:
        release.wait(30)
        yield "stuck"

    target: Any = [stuck] if kind == "engine" else publisher
    driver = StreamingDriver([counter()], bus=bus, publisher=target).start()
    try:
        driver.publish_weights("w", wait=False)
        report = driver.close(timeout=0.2)
        expected = (
            "engine 'stuck' loading weights" if kind == "engine" else "publishing weights version 1"
        )
        assert report.hung_publishing == (expected,)
        assert report.hung_producers == ()
        assert driver.state()["hung"] == [expected]
        assert driver.state()["failure"] is None  # cancelled by close, not failed
    finally:
        release.set()
    for t in threading.enumerate():
        if t.name.startswith(("twinkle-load-", "twinkle-publish-")):
            t.join(WAIT)
    assert not producer_threads()
    assert driver.version == 0  # a load finishing after close publishes nothing
    assert log.events == []


def test_close_wakes_a_blocked_trainer(bus: EventBus) -> None:
    gate = Gate()
    driver = StreamingDriver({"g": gate}, bus=bus).start()
    errors: list[BaseException] = []

    def trainer() -> None:
        try:
            driver.next_batch(1)
        except DriverError as exc:
            errors.append(exc)

    t = threading.Thread(target=trainer)
    t.start()
    driver.wait_until(lambda s: s["trainer_waiting"], WAIT)
    gate.close()
    driver.close()
    t.join(WAIT)
    assert len(errors) == 1 and "closed" in str(errors[0])


# -- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 0}, "buffer_size"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"initial_version": -1}, "initial_version"),
        ({"buffer_size": True}, "buffer_size"),
        ({"producers": {}}, "at least one producer"),
        ({"producers": [counter(), 5]}, r"producer 'producer1' is a int"),
        ({"producers": "abc"}, "mapping"),
        ({"producers": {"": counter()}}, "non-empty"),
        ({"publisher": 5}, "publisher is a int"),
        ({"publisher": []}, "no engines"),
        ({"publisher": [Engine("x"), Engine("x")]}, "two engines are named 'x'"),
        ({"bus": object()}, "EventBus"),
    ],
)
def test_bad_arguments_are_named(bus: EventBus, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"producers": [counter()], "bus": bus, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        StreamingDriver(args.pop("producers"), **args)


def test_bad_call_arguments_are_named(bus: EventBus) -> None:
    with StreamingDriver([counter()], bus=bus, buffer_size=4) as driver:
        for n in (0, -1, 1.5):
            with pytest.raises(InvalidArgumentError, match="n must be"):
                driver.next_batch(n)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="buffer_size >= 5"):
            driver.next_batch(5)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            driver.next_batch(1, timeout=-1)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            driver.next_batch(1, timeout=float("nan"))
        with pytest.raises(DriverError, match="no publisher"):
            driver.publish_weights("w")
        with pytest.raises(DriverError, match="auto_iterations=False"):
            driver.begin_iteration()
    with StreamingDriver([counter()], bus=bus, publisher=[Engine("e")]) as driver:
        driver.publish_weights("w", version=3)
        with pytest.raises(InvalidArgumentError, match="not newer"):
            driver.publish_weights("w", version=3)


@pytest.mark.parametrize("bad", [-1, -0.5, True, float("nan"), float("inf"), "1"])
def test_every_timeout_refuses_what_is_no_duration(bus: EventBus, bad: object) -> None:
    with StreamingDriver([counter()], bus=bus, publisher=[Engine("e")]) as driver:
        calls: list[Callable[[], object]] = [
            lambda: driver.next_batch(1, timeout=bad),  # type: ignore[arg-type]
            lambda: driver.publish_weights("w", timeout=bad),  # type: ignore[arg-type]
            lambda: driver.wait_published(bad),  # type: ignore[arg-type]
            lambda: driver.wait_until(lambda s: True, bad),  # type: ignore[arg-type]
            lambda: driver.close(bad),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(InvalidArgumentError, match=r"^timeout=.* or None to wait forever$"):
                call()
        assert driver.version == 0  # nothing was published
        assert driver.wait_until(lambda s: True, -0.0)["version"] == 0


def test_close_after_a_ctrl_c_inside_start_joins_only_the_threads_that_ran(
    bus: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT landed in start() after one producer's thread started: close() raised
    "cannot join thread before it is started" for the next one, and the demo ended with
    that RuntimeError instead of the interrupt."""
    start = threading.Thread.start
    calls = itertools.count()

    def interrupted(thread: threading.Thread) -> None:
        if next(calls) == 1:
            raise KeyboardInterrupt  # (the signal, between two starts)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    driver = StreamingDriver[int]({"a": counter(), "b": counter()}, bus=bus, buffer_size=2)
    with pytest.raises(KeyboardInterrupt):
        driver.start()
    monkeypatch.undo()
    assert driver.close() == CloseReport()
