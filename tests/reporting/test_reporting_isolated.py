"""IsolatedBackend: a plugin's backend on a thread of its own, bounded per call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson
import pytest

import twinkle.reporting._history as history_module
from twinkle.errors import InvalidArgumentError, ReporterError
from twinkle.reporting import (
    BackendHealth,
    IsolatedBackend,
    MetricRecord,
    make_record,
    record_to_dict,
    with_seq,
)


def _records(n: int, start: int = 0) -> list[MetricRecord]:
    return [
        with_seq(
            make_record(
                kind="train",
                scope="iteration",
                run_id="r",
                iteration=i,
                step=i,
                wall_ns=i,
                monotonic_ns=i,
                values={"x": i},
            ),
            i,
        )
        for i in range(start, start + n)
    ]


class Recording:
    def __init__(self) -> None:
        self.name = "recording"
        self.got: list[int] = []
        self.calls: list[str] = []

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.got.extend(r.iteration for r in records)
        self.calls.append("write")

    def flush(self) -> None:
        self.calls.append("flush")

    def close(self) -> None:
        self.calls.append("close")


class Hanging(Recording):
    """Hangs in the named call until released."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.release = threading.Event()
        self.entered = threading.Event()

    def _maybe_hang(self, call: str) -> None:
        if call == self.where:
            self.entered.set()
            self.release.wait()

    def open(self) -> None:
        self._maybe_hang("open")

    def write(self, records: Sequence[MetricRecord]) -> None:
        self._maybe_hang("write")
        super().write(records)

    def close(self) -> None:
        self._maybe_hang("close")
        super().close()


@pytest.fixture
def hanging() -> Iterator[list[Hanging]]:
    made: list[Hanging] = []
    yield made
    for h in made:
        h.release.set()  # let the abandoned threads end


def test_records_reach_the_backend_in_order_and_close_closes_it() -> None:
    inner = Recording()
    backend = IsolatedBackend(inner, name="rec")
    backend.write(_records(3))
    backend.flush()
    backend.write(_records(2, start=3))
    backend.close()
    assert inner.got == [0, 1, 2, 3, 4]
    assert inner.calls == ["write", "flush", "write", "close"]
    health = backend.health()
    assert health == BackendHealth(
        backend="recording",
        isolated=True,
        records=5,
        records_written=5,
        slowest_call_seconds=health.slowest_call_seconds,
    )
    assert health.healthy


def test_a_write_that_never_returns_is_cut_off_and_never_blocks_the_caller(
    hanging: list[Hanging],
) -> None:
    now = [0.0]
    inner = Hanging("write")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="hang", timeout_s=5.0, clock=lambda: now[0])
    backend.write(_records(2))
    assert inner.entered.wait(5)
    started = time.monotonic()
    for i in range(100):  # the caller never waits, however far behind the backend is
        backend.write(_records(10, start=2 + 10 * i))
    assert time.monotonic() - started < 1.0
    now[0] = 5.5  # past the bound: the next hand-over cuts it off
    backend.write(_records(1, start=1002))
    health = backend.health()
    assert health.cut_off == "write() did not return within 5 s"
    assert (health.records, health.records_written, health.records_lost) == (1003, 0, 1003)
    started = time.monotonic()
    backend.close()  # cut off: nothing to wait for
    assert time.monotonic() - started < 1.0


def test_close_waits_at_most_the_bound_for_a_close_that_hangs(hanging: list[Hanging]) -> None:
    inner = Hanging("close")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="hang", timeout_s=0.3)
    backend.write(_records(4))
    started = time.monotonic()
    backend.close()
    took = time.monotonic() - started
    assert 0.25 < took < 2.0
    health = backend.health()
    assert health.records_written == 4 and health.records_lost == 0
    assert health.cut_off is not None and "close()" in health.cut_off


def test_close_cuts_a_call_already_stuck_at_its_own_bound(hanging: list[Hanging]) -> None:
    inner = Hanging("write")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="hang", timeout_s=1.0)
    backend.write(_records(3))
    assert inner.entered.wait(5)
    time.sleep(0.7)  # stuck for 0.7 s of its 1 s when the run closes it
    started = time.monotonic()
    backend.close()
    assert time.monotonic() - started < 0.7  # not a whole bound more
    health = backend.health()
    assert health.cut_off == "write() did not return within 1 s"
    assert health.slowest_call_seconds >= 1.0  # the stuck call, though it never returned


def test_a_close_that_keeps_the_run_waiting_says_for_what(
    hanging: list[Hanging], caplog: pytest.LogCaptureFixture
) -> None:
    inner = Hanging("close")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="hang", timeout_s=3.0)
    backend.close()
    assert "waiting at most 2 s more for backend 'hang' to finish its close()" in caplog.text


def test_an_open_that_fails_leaves_the_backend_out_and_counts_what_it_missed() -> None:
    class Broken(Recording):
        def open(self) -> None:
            raise OSError("read-only file system")

    inner = Broken()
    backend = IsolatedBackend(inner, name="broken")
    assert backend.wait_open() == "OSError: read-only file system"
    backend.write(_records(3))
    backend.close()
    health = backend.health()
    assert health.setup_error == "OSError: read-only file system"
    assert (health.records, health.records_written, health.records_lost) == (3, 0, 3)
    assert inner.calls == []  # neither written, flushed nor closed


@pytest.mark.parametrize("twinkles", [True, False])
def test_an_open_that_fails_is_logged_with_a_traceback_unless_it_says_the_fix(
    caplog: pytest.LogCaptureFixture, twinkles: bool
) -> None:
    """A port in use printed two chained tracebacks around a message that already said
    what was wrong and the fix (twinkle's own error); any other error keeps its
    traceback, to find the fault by."""

    class Broken(Recording):
        def open(self) -> None:
            if twinkles:
                raise ReporterError("port 9464 in use: set TWINKLE_PROMETHEUS_PORT")
            raise ValueError("a bug")

    backend = IsolatedBackend(Broken(), name="broken")
    assert backend.wait_open() is not None
    backend.close()
    [logged] = [r for r in caplog.records if "failed in open()" in r.getMessage()]
    assert (logged.exc_info is None) == twinkles


def test_a_slow_open_does_not_hold_the_caller_and_wait_open_is_bounded(
    hanging: list[Hanging],
) -> None:
    inner = Hanging("open")
    hanging.append(inner)
    started = time.monotonic()
    backend = IsolatedBackend(inner, name="slow", timeout_s=0.2)
    backend.write(_records(2))
    assert time.monotonic() - started < 0.5
    assert backend.wait_open() == "open() did not return within 0.2 s"
    assert backend.health().setup_error == "open() did not return within 0.2 s"  # left out
    assert backend.health().records_lost == 2


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_backend_cut_off_is_closed_once_its_call_returns_after_all(
    hanging: list[Hanging], where: str
) -> None:
    inner = Hanging(where)
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="late", timeout_s=0.2)
    backend.write(_records(2))
    assert inner.entered.wait(5)
    backend.close()  # cut off: the run no longer waits for it
    assert backend.health().cut_off is not None
    inner.release.set()  # the tracking server answers at last
    deadline = time.monotonic() + 5
    while "close" not in inner.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert inner.calls.count("close") == 1  # what its open() set up is not left open
    assert backend.health().records_written == 0  # (still counted as cut off)


def test_a_close_cut_off_is_not_called_a_second_time(hanging: list[Hanging]) -> None:
    inner = Hanging("close")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="late", timeout_s=0.2)
    backend.close()
    inner.release.set()
    time.sleep(0.3)
    assert inner.calls.count("close") == 1


def test_a_raising_write_is_counted_and_the_next_batch_still_goes_out() -> None:
    class Flaky(Recording):
        def write(self, records: Sequence[MetricRecord]) -> None:
            if records[0].iteration == 0:
                raise ConnectionError("server gone")
            super().write(records)

    inner = Flaky()
    backend = IsolatedBackend(inner, name="flaky")
    backend.write(_records(2))
    backend.write(_records(3, start=2))
    backend.close()
    health = backend.health()
    assert (health.records_failed, health.records_written, health.calls_failed) == (2, 3, 1)
    assert inner.got == [2, 3, 4]  # each hand-over is one call: only the first failed


def test_records_beyond_the_queue_bound_are_counted_lost(hanging: list[Hanging]) -> None:
    inner = Hanging("write")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="full", max_records=10, timeout_s=60)
    backend.write(_records(1))
    assert inner.entered.wait(5)  # the thread is busy with the first record
    backend.write(_records(10, start=1))  # fills the queue
    backend.write(_records(5, start=11))  # over the bound
    inner.release.set()
    backend.close()
    health = backend.health()
    assert (health.records, health.records_written, health.records_lost) == (16, 11, 5)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "30"])
def test_a_bad_timeout_is_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="backend_timeout_s"):
        IsolatedBackend(Recording(), name="x", timeout_s=bad)  # type: ignore[arg-type]


def _record_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "metrics_raw.jsonl"
    path.write_bytes(b"".join(orjson.dumps(record_to_dict(r)) + b"\n" for r in _records(n)))
    return path


def test_a_resumed_runs_history_goes_first_in_batches_then_what_was_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "BATCH", 2)
    path = _record_file(tmp_path, 5)
    size = sum(len(line) for line in path.read_bytes().splitlines(keepends=True)[:4])
    inner = Recording()
    backend = IsolatedBackend(inner, name="rec")
    backend.write_history(path, size, 4)  # the checkpoint's: the first 4 records
    backend.write(_records(2, start=10))
    path.rename(tmp_path / "renamed")  # (read from the file as it was opened)
    backend.close()
    assert inner.got == [0, 1, 2, 3, 10, 11]
    assert inner.calls == ["write", "write", "write", "close"]
    health = backend.health()
    assert (health.records, health.records_written, health.records_lost) == (6, 6, 0)


@pytest.mark.parametrize("lines", [3, 5])
def test_a_history_that_is_not_what_the_checkpoint_counted_is_counted_lost(
    tmp_path: Path, lines: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "BATCH", 2)  # (batches that could go out first)
    path = _record_file(tmp_path, 4)
    inner = Recording()
    backend = IsolatedBackend(inner, name="rec")
    backend.write_history(path, path.stat().st_size, lines)
    backend.close()
    health = backend.health()
    assert (health.records, health.records_lost) == (lines, lines)
    assert (health.records_failed, health.calls_failed) == (0, 0)  # (no call of its failed)
    assert inner.calls == ["close"]  # (nothing of it written: the count is checked first)
    assert f"backend 'rec' lacks {lines} record(s) of the resumed run's history" in caplog.text
    assert f"hold 4 record(s), not the {lines} the checkpoint counted" in caplog.text


def test_a_history_that_cannot_be_opened_is_counted_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = IsolatedBackend(Recording(), name="rec")
    backend.write_history(tmp_path / "gone.jsonl", 100, 2)
    backend.close()
    health = backend.health()
    assert (health.records, health.records_lost, health.records_failed) == (2, 2, 0)
    assert "backend 'rec' lacks 2 record(s)" in caplog.text and "gone.jsonl" in caplog.text


def test_a_history_still_queued_when_its_backend_is_cut_off_is_closed(
    tmp_path: Path, hanging: list[Hanging]
) -> None:
    now = [0.0]
    inner = Hanging("open")
    hanging.append(inner)
    backend = IsolatedBackend(inner, name="hang", timeout_s=5.0, clock=lambda: now[0])
    assert inner.entered.wait(5)  # (open() is the backend's first call)
    path = _record_file(tmp_path, 3)
    backend.write_history(path, path.stat().st_size, 3)  # queued behind the hung open()
    (history,) = backend._histories
    now[0] = 5.5
    backend.write(_records(1, start=3))  # past the bound: cut off
    assert backend.health().cut_off is not None
    assert backend._histories == [] and history._file.closed  # (no file left open)
    backend.close()
    health = backend.health()
    assert (health.records, health.records_written, health.records_lost) == (4, 0, 4)


class Gated(Recording):
    """Each write() waits for its turn: ``turns`` is released once per call."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = threading.Semaphore(0)
        self.writing = threading.Event()

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.writing.set()
        assert self.turns.acquire(timeout=10)
        super().write(records)


def test_two_histories_count_in_flight_until_each_batch_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is in flight while its write() runs; one history's end does not take
    the other's records out of flight."""
    monkeypatch.setattr(history_module, "BATCH", 2)
    path = _record_file(tmp_path, 4)
    inner = Gated()
    backend = IsolatedBackend(inner, name="gated")
    backend.write_history(path, path.stat().st_size, 4)
    backend.write_history(path, path.stat().st_size, 4)
    seen = []
    for _ in range(4):  # each batch: in flight while written, then written
        assert inner.writing.wait(10)
        inner.writing.clear()
        health = backend.health()
        seen.append((health.records_written, health.records_lost))
        inner.turns.release()
    backend.close()
    assert seen == [(0, 0), (2, 0), (4, 0), (6, 0)]
    health = backend.health()
    assert (health.records, health.records_written, health.records_lost) == (8, 8, 0)
    assert inner.got == [0, 1, 2, 3, 0, 1, 2, 3]


def test_a_history_too_long_for_the_closing_bound_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write() returns in time; the records left when the bound ran out are named,
    not a call that hung."""
    monkeypatch.setattr(history_module, "BATCH", 1)
    now = [0.0]
    gate = threading.Event()

    class Slow(Recording):
        def write(self, records: Sequence[MetricRecord]) -> None:
            assert gate.wait(10)  # (the first waits for the closing to begin)
            time.sleep(0.01)
            now[0] += 0.2  # (each call well within the 1 s bound)
            super().write(records)

    path = _record_file(tmp_path, 50)
    backend = IsolatedBackend(Slow(), name="slow", timeout_s=1.0, clock=lambda: now[0])
    backend.write_history(path, path.stat().st_size, 50)
    backend.begin_close()
    gate.set()
    backend.close()
    health = backend.health()
    assert health.cut_off is not None and "writing what was queued (" in health.cut_off
    assert "record(s) left) did not finish within 1 s of closing" in health.cut_off
    assert health.records_written + health.records_lost == 50 and health.records_lost > 0
