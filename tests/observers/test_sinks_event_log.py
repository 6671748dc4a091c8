"""EventLogSink: boundaries never wait for the writer below the bound on batches in flight;
the writer is the reporter's BatchWriter; a replay writes inline; every line carries its
``seq``, consecutive in the file."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

import twinkle.reporting.jsonl as jsonl_mod
from twinkle.errors import RecordError
from twinkle.events import IterationStarted, Snapshot, dumps_event, event_from_dict
from twinkle.hookspecs import RunContext
from twinkle.observers import EventLogSink
from twinkle.reporting import BatchWriter, WriterState

RUN = "log"


def started(i: int) -> IterationStarted:
    return IterationStarted(run_id=RUN, monotonic_ns=1_000 + i, wall_ns=2_000 + i, iteration=i)


def iterations(path: Path) -> list[int]:
    return [orjson.loads(line)["iteration"] for line in path.read_bytes().splitlines()]


def _runs_batch_writer(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is BatchWriter._run.__code__:
            return True
        frame = frame.f_back
    return False


class StuckDisk:
    """An ``_os_write`` that holds every write until ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self._real = jsonl_mod._os_write

    def __call__(self, fd: int, data: bytes) -> int:
        self.entered.set()
        assert self.gate.wait(10)
        return self._real(fd, data)


def test_boundaries_never_wait_for_the_writer_until_the_bound_of_batches_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = StuckDisk()
    monkeypatch.setattr(jsonl_mod, "_os_write", disk)
    caplog.set_level(logging.WARNING, logger="twinkle.reporting")
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path))
    bound = EventLogSink.MAX_BATCHES_IN_FLIGHT
    try:
        for i in range(bound):
            sink.twinkle_event(started(i))  # a boundary: one batch handed over each
        assert disk.entered.wait(5)  # the writer is stuck in its first write
        stats = sink.stats
        assert stats is not None
        assert (stats.in_flight, stats.waits) == (bound, 0)  # no boundary waited

        done = threading.Event()

        def one_more() -> None:
            sink.twinkle_event(started(bound))
            done.set()

        t = threading.Thread(target=one_more)
        t.start()
        assert not done.wait(0.3)  # this hand-over found the bound: it waits, counted
        assert sink.stats is not None and sink.stats.waits == 1
        disk.gate.set()
        assert done.wait(5)
        t.join()
    finally:
        disk.gate.set()
        sink.twinkle_unconfigure()
    assert iterations(tmp_path / "events.jsonl") == list(range(bound + 1))
    assert any("the caller waits for the writer" in r.getMessage() for r in caplog.records)


def test_the_event_log_writes_through_the_reporters_writer_class(tmp_path: Path) -> None:
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path))
    try:
        sink.twinkle_event(started(0))
        (thread,) = [t for t in threading.enumerate() if t.name == "twinkle-eventlog"]
        assert _runs_batch_writer(thread)
    finally:
        sink.twinkle_unconfigure()
    assert not any(t.name == "twinkle-eventlog" for t in threading.enumerate())
    assert iterations(tmp_path / "events.jsonl") == [0]


def test_a_replay_writes_each_batch_inline_before_the_event_returns(tmp_path: Path) -> None:
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, replay=True))
    try:
        assert not any(t.name == "twinkle-eventlog" for t in threading.enumerate())
        for i in range(3):
            sink.twinkle_event(started(i))
            assert iterations(tmp_path / "events.jsonl") == list(range(i + 1))
    finally:
        sink.twinkle_unconfigure()
    assert sink.stats is None  # closed


def test_a_write_error_surfaces_at_the_next_hand_over_and_the_events_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = jsonl_mod._os_write
    full = threading.Event()
    full.set()

    def disk(fd: int, data: bytes) -> int:
        if full.is_set():
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(jsonl_mod, "_os_write", disk)
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path))
    sink.twinkle_event(started(0))
    stats = sink.stats
    while stats is not None and stats.delivered < 1:
        stats = sink.stats
    full.clear()
    with pytest.raises(OSError, match="No space left"):
        sink.twinkle_event(started(1))  # handed over first, then the earlier error
    stats = sink.stats
    assert stats is not None and stats.state is WriterState.OPEN
    sink.twinkle_unconfigure()
    assert iterations(tmp_path / "events.jsonl") == [0, 1]  # the kept lines went out first


# -- seq: each line numbered in its file -------------------------------------------------


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def feed(sink: EventLogSink, start: int, n: int) -> list[IterationStarted]:
    events = [started(i) for i in range(start, start + n)]
    for event in events:
        sink.twinkle_event(event)
    return events


def test_every_line_begins_with_its_seq_then_the_events_own_json(tmp_path: Path) -> None:
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path))
    events = feed(sink, 0, 5)
    sink.twinkle_unconfigure()
    raw = (tmp_path / "events.jsonl").read_bytes().splitlines()
    for i, (line, event) in enumerate(zip(raw, events, strict=True)):
        assert line == b'{"seq":%d,' % i + dumps_event(event)[1:]  # seq first, 0-based
        assert event_from_dict({k: v for k, v in orjson.loads(line).items() if k != "seq"}) == (
            event
        )


def test_seq_continues_after_the_last_line_of_the_file(tmp_path: Path) -> None:
    for start in (0, 3):
        sink = EventLogSink()
        sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, replay=True))
        feed(sink, start, 3)
        sink.twinkle_unconfigure()
    assert [o["seq"] for o in lines_of(tmp_path / "events.jsonl")] == list(range(6))


def test_a_log_of_an_older_twinkle_without_seq_is_continued_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(dumps_event(started(i)) + b"\n" for i in range(2)))
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, replay=True))
    feed(sink, 2, 2)
    sink.twinkle_unconfigure()
    assert [o.get("seq") for o in lines_of(path)] == [None, None, 0, 1]
    assert [o["iteration"] for o in lines_of(path)] == [0, 1, 2, 3]


def test_an_event_that_cannot_be_written_takes_no_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_mod, "MAX_LINE_BYTES", 1024)
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, replay=True))
    feed(sink, 0, 1)
    sink.twinkle_event(Snapshot(RUN, 1, 2, {"blob": "b" * 2000}))
    with pytest.raises(RecordError, match=r"'snapshot' is \d+ bytes as a line.*1024"):
        feed(sink, 1, 1)
    feed(sink, 2, 1)
    sink.twinkle_unconfigure()
    assert sink.unwritable == 1
    assert [(o["seq"], o["iteration"]) for o in lines_of(tmp_path / "events.jsonl")] == [
        (0, 0),
        (1, 1),
        (2, 2),
    ]
