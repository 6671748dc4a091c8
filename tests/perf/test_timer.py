"""twinkle.perf.timer: spans, @timed, drain, the current recorder."""

from __future__ import annotations

import asyncio
import enum
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.perf import (
    ClockAnchor,
    ManualClock,
    Span,
    TimeRecorder,
    current_recorder,
    span,
    timed,
    use_recorder,
)


class StepFailedError(RuntimeError):
    """An exception type outside builtins, to check qualified error names."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000)


@pytest.fixture
def rec(clock: ManualClock) -> TimeRecorder:
    return TimeRecorder(clock, wall_clock=lambda: 7_000, pid=4242, hostname="node-a")


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads very often, so races show up in a short test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


# -- spans ----------------------------------------------------------------------------------


def test_span_records_name_times_thread_pid_and_attrs(
    rec: TimeRecorder, clock: ManualClock
) -> None:
    with rec.span("generate", batch=3, engine="e0"):
        clock.advance(250)
    (recorded,) = rec.drain()
    assert recorded == Span(
        name="generate",
        start_ns=1_000,
        end_ns=1_250,
        thread_id=threading.get_ident(),
        pid=4242,
        attrs={"batch": 3, "engine": "e0"},
        error=None,
    )
    assert recorded.duration_ns == 250


def test_span_without_attrs_has_empty_attrs(rec: TimeRecorder) -> None:
    with rec.span("x"):
        pass
    assert rec.drain()[0].attrs == {}


def test_span_records_error_and_reraises(rec: TimeRecorder, clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="boom"), rec.span("step"):
        clock.advance(5)
        raise ValueError("boom")
    (recorded,) = rec.drain()
    assert recorded.error == "ValueError"
    assert recorded.duration_ns == 5


def test_span_error_names_non_builtin_exceptions_by_module_and_qualname(
    rec: TimeRecorder,
) -> None:
    with pytest.raises(StepFailedError), rec.span("step"):
        raise StepFailedError
    assert rec.drain()[0].error == f"{__name__}.StepFailedError"


def test_span_closes_on_base_exceptions_too(rec: TimeRecorder) -> None:
    with pytest.raises(KeyboardInterrupt), rec.span("step"):
        raise KeyboardInterrupt
    assert rec.drain()[0].error == "KeyboardInterrupt"


def test_nested_spans_close_inner_first_with_nested_intervals(
    rec: TimeRecorder, clock: ManualClock
) -> None:
    with rec.span("outer"):
        clock.advance(10)
        with rec.span("inner"):
            clock.advance(20)
        clock.advance(30)
    inner, outer = rec.drain()
    assert (inner.name, outer.name) == ("inner", "outer")
    assert outer.start_ns < inner.start_ns <= inner.end_ns < outer.end_ns
    assert (outer.duration_ns, inner.duration_ns) == (60, 20)
    assert inner.thread_id == outer.thread_id


def test_open_spans_are_not_drained_until_they_close(rec: TimeRecorder) -> None:
    with rec.span("outer"):
        with rec.span("inner"):
            pass
        assert [s.name for s in rec.drain()] == ["inner"]
        assert rec.pending() == 0
    assert [s.name for s in rec.drain()] == ["outer"]


def test_drain_removes_what_it_returns(rec: TimeRecorder) -> None:
    for _ in range(3):
        with rec.span("x"):
            pass
    assert rec.pending() == 3
    assert len(rec.drain()) == 3
    assert rec.pending() == 0
    assert rec.drain() == []


def test_span_context_can_be_reused_one_use_after_another(
    rec: TimeRecorder, clock: ManualClock
) -> None:
    step = rec.span("step")
    for advance in (1, 2, 3):
        with step:
            clock.advance(advance)
    assert [s.duration_ns for s in rec.drain()] == [1, 2, 3]


def test_span_attrs_are_copied_per_span(rec: TimeRecorder) -> None:
    with rec.span("a", k=1):
        pass
    first, *_ = rec.drain()
    with rec.span("a", k=1):
        pass
    second, *_ = rec.drain()
    assert first.attrs == second.attrs
    assert first.attrs is not second.attrs


def test_spans_on_eight_threads_are_all_recorded_with_their_thread(rec: TimeRecorder) -> None:
    per_thread = 500
    start = threading.Barrier(8)
    idents: dict[int, int] = {}

    def work(worker: int) -> None:
        idents[worker] = threading.get_ident()
        start.wait()
        for i in range(per_thread):
            with rec.span("outer", worker=worker, i=i), rec.span("inner", worker=worker, i=i):
                pass

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spans = rec.drain()
    assert len(spans) == 8 * per_thread * 2
    for recorded in spans:
        assert recorded.thread_id == idents[recorded.attrs["worker"]]
    keys = {(s.name, s.attrs["worker"], s.attrs["i"]) for s in spans}
    assert len(keys) == len(spans)


def test_drain_concurrent_with_closing_spans_loses_and_repeats_nothing(
    rec: TimeRecorder, fast_switching: None
) -> None:
    writers, per_writer = 6, 2_000
    done = threading.Event()
    drained: list[Span] = []

    def write(worker: int) -> None:
        for i in range(per_writer):
            with rec.span("s", worker=worker, i=i):
                pass

    def drain_repeatedly() -> None:
        while not done.is_set():
            drained.extend(rec.drain())
        drained.extend(rec.drain())

    drainer = threading.Thread(target=drain_repeatedly)
    drainer.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    drainer.join()
    drained.extend(rec.drain())
    keys = [(s.attrs["worker"], s.attrs["i"]) for s in drained]
    assert len(keys) == writers * per_writer
    assert set(keys) == {(w, i) for w in range(writers) for i in range(per_writer)}


def test_two_threads_draining_at_once_share_the_spans_without_repeats(
    rec: TimeRecorder, fast_switching: None
) -> None:
    for i in range(20_000):
        with rec.span("s", i=i):
            pass
    results: list[list[Span]] = [[], []]

    def drain(slot: int) -> None:
        results[slot] = rec.drain()

    threads = [threading.Thread(target=drain, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    indices = [s.attrs["i"] for s in results[0] + results[1]]
    assert sorted(indices) == list(range(20_000))


@given(
    plan=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.booleans()), max_size=30
    )
)
def test_spans_measure_exactly_the_clock_advance_inside_them(
    plan: list[tuple[int, int, bool]],
) -> None:
    clock = ManualClock()
    rec = TimeRecorder(clock)
    for before, inside, fails in plan:
        clock.advance(before)
        try:
            with rec.span("s"):
                clock.advance(inside)
                if fails:
                    raise RuntimeError
        except RuntimeError:
            pass
    spans = rec.drain()
    assert len(spans) == len(plan)
    for recorded, (_, inside, fails) in zip(spans, plan, strict=True):
        assert recorded.duration_ns == inside >= 0
        assert recorded.error == ("RuntimeError" if fails else None)
    starts = [s.start_ns for s in spans]
    assert starts == sorted(starts)


# -- barrier --------------------------------------------------------------------------------


def test_sync_barrier_runs_before_the_start_and_before_the_end_reading() -> None:
    events: list[str] = []
    manual = ManualClock()

    def clock() -> int:
        events.append("clock")
        return manual()

    rec = TimeRecorder(clock)
    events.clear()  # the anchor's reading
    with rec.span("step", sync=lambda: events.append("sync")):
        events.append("body")
    assert events == ["sync", "clock", "body", "sync", "clock"]
    assert rec.drain()[0].error is None


def test_span_without_sync_reads_the_clock_only() -> None:
    events: list[str] = []

    def clock() -> int:
        events.append("clock")
        return 0

    rec = TimeRecorder(clock)
    events.clear()
    with rec.span("step"):
        events.append("body")
    assert events == ["clock", "body", "clock"]


def test_failing_barrier_on_exit_still_closes_the_span(rec: TimeRecorder) -> None:
    calls = 0

    def flaky_sync() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StepFailedError("device lost")

    with pytest.raises(StepFailedError), rec.span("step", sync=flaky_sync):
        pass
    (recorded,) = rec.drain()
    assert recorded.error == f"{__name__}.StepFailedError"


def test_failing_barrier_keeps_the_body_error_on_the_span(rec: TimeRecorder) -> None:
    def sync() -> None:
        raise StepFailedError

    ctx = rec.span("step", sync=lambda: None)
    with pytest.raises(StepFailedError) as raised, ctx:
        ctx._sync = sync  # type: ignore[attr-defined]  # fail only on exit
        raise ValueError("body")
    assert isinstance(raised.value.__context__, ValueError)
    assert rec.drain()[0].error == "ValueError"


# -- @timed ---------------------------------------------------------------------------------


def test_timed_records_each_call_of_a_sync_function(rec: TimeRecorder, clock: ManualClock) -> None:
    @rec.timed("train_step", phase="train")
    def train_step(x: int) -> int:
        clock.advance(x)
        return x * 2

    assert train_step(3) == 6
    assert train_step(4) == 8
    spans = rec.drain()
    assert [(s.name, s.duration_ns, dict(s.attrs)) for s in spans] == [
        ("train_step", 3, {"phase": "train"}),
        ("train_step", 4, {"phase": "train"}),
    ]
    assert spans[0].attrs is not spans[1].attrs


def test_timed_without_arguments_names_the_span_after_the_function(rec: TimeRecorder) -> None:
    @rec.timed
    def bare() -> None:
        pass

    @rec.timed()
    def called() -> None:
        pass

    bare()
    called()
    names = [s.name for s in rec.drain()]
    assert names == [
        f"{__name__}.test_timed_without_arguments_names_the_span_after_the_function.<locals>.bare",
        f"{__name__}.test_timed_without_arguments_names_the_span_after_the_function.<locals>.called",
    ]


def test_timed_records_error_and_reraises(rec: TimeRecorder) -> None:
    @rec.timed("step")
    def step() -> None:
        raise StepFailedError

    with pytest.raises(StepFailedError):
        step()
    assert rec.drain()[0].error == f"{__name__}.StepFailedError"


def test_timed_async_function_spans_its_awaited_body(rec: TimeRecorder, clock: ManualClock) -> None:
    @rec.timed("fetch")
    async def fetch(n: int) -> int:
        await asyncio.sleep(0)
        clock.advance(n)
        await asyncio.sleep(0)
        return n

    @rec.timed("fail")
    async def fail() -> None:
        await asyncio.sleep(0)
        raise StepFailedError

    async def main() -> list[int]:
        results = await asyncio.gather(fetch(5), fetch(7))
        with pytest.raises(StepFailedError):
            await fail()
        return list(results)

    assert asyncio.run(main()) == [5, 7]
    spans = rec.drain()
    assert sorted((s.name, s.error) for s in spans) == [
        ("fail", f"{__name__}.StepFailedError"),
        ("fetch", None),
        ("fetch", None),
    ]
    assert sum(s.duration_ns for s in spans if s.name == "fetch") >= 12


def test_timed_keeps_the_function_identity(rec: TimeRecorder) -> None:
    @rec.timed
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @rec.timed
    async def coro() -> None:
        pass

    assert add.__name__ == "add"
    assert add.__doc__ == "Add."
    assert asyncio.iscoroutinefunction(coro)


def test_timed_with_sync_calls_the_barrier_around_each_call(rec: TimeRecorder) -> None:
    events: list[str] = []

    @rec.timed("step", sync=lambda: events.append("sync"))
    def step() -> None:
        events.append("body")

    @rec.timed("astep", sync=lambda: events.append("sync"))
    async def astep() -> None:
        events.append("abody")

    step()
    asyncio.run(astep())
    assert events == ["sync", "body", "sync", "sync", "abody", "sync"]
    assert [s.name for s in rec.drain()] == ["step", "astep"]


def test_timed_refuses_generator_functions(rec: TimeRecorder) -> None:
    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(InvalidArgumentError, match="generator function"):
        rec.timed(gen)


# -- the current recorder -------------------------------------------------------------------


def test_module_span_and_timed_record_into_the_recorder_in_use(rec: TimeRecorder) -> None:
    @timed("step")
    def step() -> None:
        pass

    with use_recorder(rec) as active:
        assert active is rec
        assert current_recorder() is rec
        with span("outer", k=1):
            step()
    assert current_recorder() is not rec
    assert [(s.name, dict(s.attrs)) for s in rec.drain()] == [
        ("step", {}),
        ("outer", {"k": 1}),
    ]


def test_module_timed_looks_the_recorder_up_at_each_call() -> None:
    first, second = TimeRecorder(ManualClock()), TimeRecorder(ManualClock())

    @timed
    def work() -> None:
        pass

    with use_recorder(first):
        work()
    with use_recorder(second):
        work()
        work()
    assert (len(first.drain()), len(second.drain())) == (1, 2)


def test_use_recorder_nests_and_restores() -> None:
    outer, inner = TimeRecorder(), TimeRecorder()
    with use_recorder(outer):
        with use_recorder(inner):
            assert current_recorder() is inner
        assert current_recorder() is outer


def test_asyncio_tasks_keep_their_own_current_recorder() -> None:
    recorders = [TimeRecorder(ManualClock()) for _ in range(3)]

    async def task(index: int) -> None:
        with use_recorder(recorders[index]):
            await asyncio.sleep(0)
            with span(f"task{index}"):
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(3)))

    asyncio.run(main())
    for index, recorder in enumerate(recorders):
        assert [s.name for s in recorder.drain()] == [f"task{index}"]


def test_process_recorder_is_created_on_first_use_not_at_import() -> None:
    code = (
        "import twinkle.perf as perf, twinkle.perf.timer as timer\n"
        "assert timer.process_state.recorder is None\n"
        "@perf.timed\n"
        "def f(): pass\n"
        "assert timer.process_state.recorder is None\n"
        "with perf.span('x'): pass\n"
        "rec = perf.current_recorder()\n"
        "assert timer.process_state.recorder is rec\n"
        "f()\n"
        "assert [s.name for s in rec.drain()] == ['x', '__main__.f']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- recorder identity ----------------------------------------------------------------------


def test_anchor_is_read_once_when_the_recorder_is_made(clock: ManualClock) -> None:
    rec = TimeRecorder(clock, wall_clock=lambda: 9_999, pid=7, hostname="h")
    clock.advance(100)
    assert rec.anchor == ClockAnchor(monotonic_ns=1_000, wall_ns=9_999, pid=7, hostname="h")
    assert rec.anchor is rec.anchor
    assert rec.clock is clock
    assert rec.now_ns() == 1_100


def test_recorder_defaults_to_this_process() -> None:
    rec = TimeRecorder()
    with rec.span("x"):
        pass
    assert rec.drain()[0].pid == os.getpid() == rec.anchor.pid


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_drops_the_parents_spans_and_stamps_its_own_pid() -> None:
    rec = TimeRecorder()
    with rec.span("before_fork"):
        pass
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running pytest's teardown
        try:
            leftover = rec.drain()
            with rec.span("in_child"):
                pass
            (child_span,) = rec.drain()
            ok = not leftover and child_span.pid == os.getpid() == rec.anchor.pid
            os.write(write_end, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 16)
    os.close(read_end)
    os.waitpid(pid, 0)
    assert answer == b"ok"
    assert [s.name for s in rec.drain()] == ["before_fork"]


# -- validation -----------------------------------------------------------------------------


class Phase(str, enum.Enum):  # noqa: UP042 - the mixin whose str() is not its value
    GENERATE = "generate"


def test_span_accepts_a_str_subclass_name_as_plain_str(rec: TimeRecorder) -> None:
    with rec.span(Phase.GENERATE):
        pass
    name = rec.drain()[0].name
    assert name == "generate"
    assert type(name) is str


@pytest.mark.parametrize("bad", ["", None, 3, b"x"])
def test_span_rejects_a_name_that_is_not_a_non_empty_str(rec: TimeRecorder, bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"name must be a non-empty str, got"):
        rec.span(bad)
    with pytest.raises(InvalidArgumentError, match=r"name must be a non-empty str"):
        span(bad)
    if bad is not None:  # timed(None) means "name it after the function"
        with pytest.raises(InvalidArgumentError, match=r"name must be a non-empty str"):
            rec.timed(bad)
    assert rec.pending() == 0


def test_span_rejects_a_sync_that_is_not_callable(rec: TimeRecorder) -> None:
    with pytest.raises(InvalidArgumentError, match="sync must be a zero-argument callable"):
        rec.span("x", sync=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="sync must be a zero-argument callable"):
        rec.timed("x", sync=0)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clock": 5}, "clock must be a zero-argument callable"),
        ({"clock": lambda: 1.5}, r"clock\(\) must be an int"),
        ({"wall_clock": None}, "wall_clock must be a zero-argument callable"),
        ({"pid": 0}, "pid must be a positive int"),
        ({"pid": True}, "pid must be a positive int"),
        ({"hostname": ""}, "hostname must be a non-empty str"),
    ],
)
def test_recorder_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        TimeRecorder(**kwargs)


def test_use_recorder_rejects_other_objects() -> None:
    with pytest.raises(InvalidArgumentError, match="recorder must be a TimeRecorder"):
        use_recorder(object())  # type: ignore[arg-type]


def test_timed_rejects_non_callables(rec: TimeRecorder) -> None:
    with pytest.raises(InvalidArgumentError, match="timed decorates a function"):
        rec.timed("x")(42)  # type: ignore[arg-type]


# -- Span values ----------------------------------------------------------------------------


def test_span_round_trips_through_a_dict() -> None:
    value = Span("s", 1, 5, 9, 10, {"k": [1, 2]}, "ValueError")
    assert value.to_dict() == {
        "name": "s",
        "start_ns": 1,
        "end_ns": 5,
        "thread_id": 9,
        "pid": 10,
        "attrs": {"k": [1, 2]},
        "error": "ValueError",
    }
    assert Span.from_dict(value.to_dict()) == value


@pytest.mark.parametrize(
    "change",
    [
        {"name": ""},
        {"start_ns": 1.0},
        {"pid": True},
        {"attrs": []},
        {"error": 3},
        {"extra": 1},
    ],
)
def test_span_from_dict_rejects_malformed_data(change: dict[str, Any]) -> None:
    data = {**Span("s", 1, 5, 9, 10, {}, None).to_dict(), **change}
    with pytest.raises(InvalidArgumentError, match="data"):
        Span.from_dict(data)


def test_attributes_learned_inside_a_span_are_kept_with_it() -> None:
    from twinkle.perf import ManualClock, TimeRecorder

    recorder = TimeRecorder(clock=ManualClock(0))
    with recorder.span("generate", iteration=3) as span:
        span.set(tokens=120, samples=4)
        span.set(tokens=128)  # a later value wins
    with recorder.span("plain") as plain:
        plain.set(n=1)
    [first, second] = recorder.drain()
    assert first.attrs == {"iteration": 3, "tokens": 128, "samples": 4}
    assert second.attrs == {"n": 1}
