"""BatchWriter: the states and their transitions, the bound, batching, the error rule;
the same behaviour inline and on the writer thread."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from twinkle.errors import InvalidArgumentError, ReporterError
from twinkle.reporting import (
    BatchWriter,
    MetricRecord,
    MetricsReporter,
    WriterState,
    WriterStats,
)

MODES = pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])


class Sink:
    """A deliver function keeping every batch; ``gate`` (when set up) holds deliveries."""

    def __init__(self, *, gated: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, batch: list[int]) -> None:
        self.threads.add(threading.get_ident())
        self.entered.set()
        assert self.gate.wait(10)
        self.batches.append(batch)

    @property
    def items(self) -> list[int]:
        return [i for b in self.batches for i in b]


def writer(
    deliver: Callable[[list[int]], object], *, background: bool, **kw: Any
) -> BatchWriter[int]:
    kw.setdefault("capacity", 1000)
    return BatchWriter(deliver, name="test writer", background=background, **kw)


def state(w: BatchWriter[int]) -> WriterState:
    """``w.state``, read afresh: mypy would keep ``w.state`` narrowed by an earlier
    assert across the calls that change it."""
    return w.state


# -- states ---------------------------------------------------------------------------------


@MODES
def test_open_closing_closed_delivers_everything_in_put_order(background: bool) -> None:
    sink = Sink()
    w = writer(sink, background=background)
    assert state(w) is WriterState.OPEN
    for i in range(100):
        assert w.put(i) is True
    assert w.close() is True
    assert state(w) is WriterState.CLOSED
    assert sink.items == list(range(100))
    assert w.stats == WriterStats(
        state=WriterState.CLOSED,
        accepted=100,
        delivered=100,
        in_flight=0,
        dropped=0,
        waits=0,
        lost=0,
    )


@MODES
def test_inline_writes_on_the_callers_thread_background_on_its_own(background: bool) -> None:
    sink = Sink()
    w = writer(sink, background=background, thread_name="probe")
    w.put(1)
    w.flush()
    w.close()
    on_caller = sink.threads == {threading.get_ident()}
    assert on_caller is not background


@MODES
def test_closed_is_final_put_refuses_flush_and_close_are_no_ops(background: bool) -> None:
    w = writer(Sink(), background=background)
    w.close()
    assert w.close() is False  # idempotent: only the first call closes
    w.flush()  # a no-op once closed
    with pytest.raises(ReporterError, match=r"test writer is closed; create a new one"):
        w.put(1)
    assert w.stats.accepted == 0


def test_closing_delivers_what_is_queued_and_refuses_new_items() -> None:
    sink = Sink(gated=True)
    w = writer(sink, background=True, wake_at=1)
    w.put(0)
    assert sink.entered.wait(5)  # the thread holds item 0 in deliver
    w.put(1)
    closer = threading.Thread(target=w.close)
    closer.start()
    while state(w) is WriterState.OPEN:
        pass
    assert state(w) is WriterState.CLOSING
    with pytest.raises(ReporterError, match="is closed"):
        w.put(2)
    sink.gate.set()
    closer.join(5)
    assert state(w) is WriterState.CLOSED
    assert sink.items == [0, 1]


@MODES
def test_a_base_exception_in_deliver_fails_the_writer_and_counts_what_is_lost(
    background: bool, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[list[int]] = []

    def deliver(batch: list[int]) -> None:
        calls.append(list(batch))
        raise KeyboardInterrupt  # not an Exception: the writer cannot go on

    caplog.set_level(logging.ERROR, logger="twinkle.reporting")
    w = writer(deliver, background=background, wake_at=1)
    if background:
        w.put(0)
        with pytest.raises(ReporterError, match=r"test writer failed \(KeyboardInterrupt"):
            w.flush()
    else:
        with pytest.raises(KeyboardInterrupt):
            w.put(0)  # inline: the caller's own call meets it
    assert w.state is WriterState.FAILED
    assert w.failure == "KeyboardInterrupt()"
    with pytest.raises(ReporterError, match=r"failed .*nothing more is written"):
        w.put(1)
    assert w.close() is True
    stats = w.stats
    assert (stats.state, stats.accepted, stats.delivered, stats.lost) == (
        WriterState.CLOSED,
        1,
        0,
        1,
    )
    assert calls == [[0]]
    assert any("delivering stopped" in r.getMessage() for r in caplog.records)


# -- the error rule ---------------------------------------------------------------------------


@MODES
def test_an_exception_in_deliver_is_raised_once_at_the_next_call_after_accepting(
    background: bool,
) -> None:
    sink = Sink()
    failing = {1}

    def deliver(batch: list[int]) -> None:
        if failing.intersection(batch):
            raise OSError("disk said no")
        sink(batch)

    w = writer(deliver, background=background, wake_at=1)
    w.put(0)
    w.flush()
    if background:
        w.put(1)
        with pytest.raises(OSError, match="disk said no"):
            w.flush()  # the next call after the failed delivery raises it
    else:
        with pytest.raises(OSError, match="disk said no"):
            w.put(1)  # inline: the call that delivered
    w.put(2)  # raised once: later calls are clean, later batches delivered
    w.close()
    assert sink.items == [0, 2]
    assert w.stats.delivered == 3  # item 1 was handed to deliver (which failed it)


def test_settle_waits_like_flush_and_leaves_a_held_error_for_the_next_call() -> None:
    """A checkpoint asks whether everything went through without taking the error from
    the run that must report it."""
    sink = Sink()

    def deliver(batch: list[int]) -> None:
        if 1 in batch:
            raise OSError("disk said no")
        sink(batch)

    w = writer(deliver, background=True, wake_at=100)
    w.put(0)
    assert w.settle() is True and sink.items == [0]  # (waited: delivered)
    w.put(1)
    assert w.settle() is False  # the delivery failed: held
    assert w.settle() is False  # still held
    with pytest.raises(OSError, match="disk said no"):
        w.flush()  # the error reaches the next call that raises
    assert w.settle() is True
    w.close()
    assert w.settle() is False  # (closed: nothing settles any more)


def test_a_held_error_is_raised_by_put_after_the_item_was_accepted() -> None:
    fail = threading.Event()
    fail.set()
    seen: list[int] = []

    def deliver(batch: list[int]) -> None:
        seen.extend(batch)
        if fail.is_set():
            fail.clear()
            raise ValueError("first batch failed")

    w = writer(deliver, background=True, wake_at=1)
    w.put(0)
    while w.stats.delivered < 1:
        pass
    with pytest.raises(ValueError, match="first batch failed"):
        w.put(1)
    w.close()
    assert seen == [0, 1]  # item 1 was accepted before the held error was raised


# -- the bound ----------------------------------------------------------------------------------


def test_block_mode_waits_only_at_the_bound_and_counts_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink(gated=True)
    caplog.set_level(logging.WARNING, logger="twinkle.reporting")
    w = writer(sink, background=True, capacity=3, wake_at=1)
    w.put(0)
    assert sink.entered.wait(5)
    w.put(1)
    w.put(2)  # 0 being delivered + 1, 2 queued: the bound
    assert w.stats.waits == 0
    done = threading.Event()

    def late() -> None:
        w.put(3)
        done.set()

    t = threading.Thread(target=late)
    t.start()
    assert not done.wait(0.2)  # waits: the writer is stuck
    sink.gate.set()
    assert done.wait(5)
    t.join()
    w.close()
    assert sink.items == [0, 1, 2, 3]
    assert w.stats.waits == 1 and w.stats.dropped == 0
    assert any("the caller waits for the writer" in r.getMessage() for r in caplog.records)


def test_drop_mode_counts_the_items_it_refuses() -> None:
    sink = Sink(gated=True)
    w = writer(sink, background=True, capacity=2, on_full="drop", wake_at=1)
    w.put(0)
    assert sink.entered.wait(5)
    assert w.put(1) is True
    assert [w.put(i) for i in range(2, 6)] == [False] * 4
    sink.gate.set()
    w.close()
    assert sink.items == [0, 1]
    assert (w.stats.dropped, w.stats.accepted) == (4, 2)


def test_a_blocked_put_is_released_with_an_error_when_the_writer_closes() -> None:
    sink = Sink(gated=True)
    w = writer(sink, background=True, capacity=1, wake_at=1)
    w.put(0)
    assert sink.entered.wait(5)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            w.put(1)
        except ReporterError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    while w.stats.waits == 0:
        pass
    closer = threading.Thread(target=w.close)
    closer.start()
    t.join(5)
    sink.gate.set()
    closer.join(5)
    assert errors and "is closed" in str(errors[0])
    assert sink.items == [0]


# -- batching ---------------------------------------------------------------------------------


def test_the_thread_takes_the_whole_queue_as_one_batch() -> None:
    sink = Sink(gated=True)
    w = writer(sink, background=True, wake_at=1)
    w.put(0)
    assert sink.entered.wait(5)
    for i in range(1, 50):
        w.put(i)  # queued while item 0 is being delivered
    sink.gate.set()
    w.flush()
    w.close()
    assert sink.batches == [[0], list(range(1, 50))]


def test_a_queue_below_wake_at_is_written_by_flush() -> None:
    sink = Sink()
    w = writer(sink, background=True, wake_at=100, interval_s=60)
    for i in range(5):
        w.put(i)
    assert sink.items == []  # not worth waking the writer for yet
    w.flush()
    assert sink.batches == [[0, 1, 2, 3, 4]]
    w.close()


def test_wake_has_the_thread_take_the_queue_before_its_interval() -> None:
    """The observers' dispatch thread is woken at each iteration boundary: it starts on
    the iteration just ended, not a minute later."""
    sink = Sink()
    w = writer(sink, background=True, wake_at=100, interval_s=60)
    w.wake()  # nothing queued: nothing to do
    for i in range(3):
        w.put(i)
    w.wake()
    assert sink.entered.wait(5)  # (no flush: woken)
    w.close()
    assert sink.batches == [[0, 1, 2]]


def test_wait_delivered_waits_for_that_many_items_and_no_more() -> None:
    """A boundary waits until the one before it was dispatched, not for the events after
    it."""
    held, entered = threading.Event(), threading.Event()
    delivered: list[int] = []

    def deliver(batch: list[int]) -> None:
        if 1 in batch:
            entered.set()
            assert held.wait(10)
        delivered.extend(batch)

    w = writer(deliver, background=True, wake_at=1)
    w.put(0)
    w.wait_delivered(1)
    assert delivered == [0]
    w.put(1)
    assert entered.wait(5)
    w.put(2)  # (queued behind the held delivery)
    w.wait_delivered(1)  # at once: one item went through
    done = threading.Event()

    def wait_for_three() -> None:
        w.wait_delivered(3)
        done.set()

    waiter = threading.Thread(target=wait_for_three)
    waiter.start()
    assert not done.wait(0.2)  # items 1 and 2 are not delivered yet
    held.set()
    waiter.join(5)
    assert done.is_set() and delivered == [0, 1, 2]
    w.close()


def test_calling_the_writer_from_its_own_thread_is_refused() -> None:
    errors: list[BaseException] = []
    holder: list[BatchWriter[int]] = []

    def deliver(batch: list[int]) -> None:
        for call in (holder[0].flush, holder[0].close):
            try:
                call()
            except ReporterError as exc:
                errors.append(exc)

    w = writer(deliver, background=True, wake_at=1)
    holder.append(w)
    w.put(0)
    w.flush()
    w.close()
    assert [str(e).split(" called")[0] for e in errors] == ["flush()", "close()"]
    assert all("its own writer thread" in str(e) for e in errors)


@pytest.mark.parametrize(
    ("kw", "culprit"),
    [
        ({"capacity": 0}, r"capacity must be an int >= 1.*got 0"),
        ({"on_full": "wait"}, r"on_full must be .*got 'wait'"),
        ({"wake_at": 0}, r"wake_at must be an int in \[1, capacity=1000\].*got 0"),
        ({"wake_at": 1001}, r"wake_at .*got 1001"),
        ({"interval_s": 0}, r"interval_s=0 must be a finite number of seconds > 0 \(how long"),
        ({"interval_s": float("nan")}, r"interval_s=nan must be a finite number of seconds"),
        ({"interval_s": True}, r"interval_s=True must be a finite number of seconds"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kw: dict[str, Any], culprit: str) -> None:
    with pytest.raises(InvalidArgumentError, match=culprit):
        writer(Sink(), background=False, **kw)


# -- one writer for records and the event log -----------------------------------------------------


def _runs_batch_writer(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is BatchWriter._run.__code__:
            return True
        frame = frame.f_back
    return False


def test_the_reporter_writes_through_a_batch_writer_thread() -> None:
    class Null:
        def write(self, records: Sequence[MetricRecord]) -> None:
            pass

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    with MetricsReporter([Null()], run_id="one-writer", background=True):
        (thread,) = [t for t in threading.enumerate() if t.name == "twinkle-reporter-one-writer"]
        assert _runs_batch_writer(thread)
