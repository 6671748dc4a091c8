"""TraceSink: the publishing thread only hands events over; the trace's own writer thread
formats and writes them, in order, and the file is complete when the run finishes."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.errors import WriteError
from twinkle.events import IterationStarted, RunStarted, SpanBatch
from twinkle.hookspecs import RunContext
from twinkle.observers import TraceSink
from twinkle.perf import ClockAnchor, Span
from twinkle.reporting import ReplacingFile

RUN = "trace"
ANCHOR = ClockAnchor(monotonic_ns=1_000_000, wall_ns=5, pid=7, hostname="node0")


def _trace(path: Path) -> list[dict[str, Any]]:
    events = orjson.loads(path.read_bytes())
    assert events[-1]["name"] == "end"
    return list(events[:-1])


def _batch(i: int, error: str | None = None) -> SpanBatch:
    spans = (
        Span(f"step{i}", 1_000_000 + 10_000 * i, 1_005_000 + 10_000 * i, 11, 7, {"i": i}, error),
    )
    return SpanBatch(RUN, 1, 2, "main", ANCHOR, spans)


def _feed(sink: TraceSink, n: int) -> None:
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR))
    for i in range(n):
        sink.twinkle_spans(_batch(i, error="ValueError" if i == 1 else None))
        sink.twinkle_iteration_started(IterationStarted(RUN, 1_010_000 + 10_000 * i, 9, i))
    sink.twinkle_run_finished()  # a trace is put in place once the run finished


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "twinkle-trace"]


def test_a_live_trace_is_written_by_its_own_thread_complete_and_in_order(tmp_path):
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}))
    assert len(_writer_threads()) == 1
    _feed(sink, 50)
    sink.twinkle_unconfigure()  # delivers what is in flight, joins the thread
    assert _writer_threads() == []
    events = _trace(tmp_path / "trace.json")
    assert events[0] == {
        "name": "process_name",
        "ph": "M",
        "pid": 7,
        "args": {"name": "trace (node0)"},
    }
    assert events[1]["name"] == "thread_name"
    names = [e["name"] for e in events[2:]]
    assert names == [x for i in range(50) for x in (f"step{i}", f"iteration {i}")]
    assert [e["ts"] for e in events[2:]] == [
        x for i in range(50) for x in (10.0 * i, 10.0 * i + 10)
    ]
    assert events[4]["args"] == {"i": 1, "error": "ValueError"}


def test_a_replayed_trace_is_written_inline_and_equals_the_live_one(tmp_path):
    live, inline = TraceSink(), TraceSink()
    live.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path / "live", config={}))
    inline.twinkle_configure(
        RunContext(run_id=RUN, out_dir=tmp_path / "replay", config={}, replay=True)
    )
    assert len(_writer_threads()) == 1  # the live sink's only
    for sink in (live, inline):
        _feed(sink, 5)
        sink.twinkle_unconfigure()
    assert (tmp_path / "live/trace.json").read_bytes() == (
        tmp_path / "replay/trace.json"
    ).read_bytes()


def test_without_an_output_directory_nothing_is_started_or_written(tmp_path):
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=None, config={}))
    assert _writer_threads() == []
    _feed(sink, 3)
    sink.twinkle_unconfigure()
    assert list(tmp_path.iterdir()) == []


def test_a_trace_whose_write_failed_is_never_put_in_place(tmp_path, monkeypatch):
    """A disk fault in the middle of a batch leaves half of it in the file: that trace
    is dropped at close (the previous one stays) rather than committed as bad JSON."""
    (tmp_path / "trace.json").write_bytes(b"[]\n")
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}, replay=True))
    real_write = ReplacingFile.write
    calls = []

    def half_then_enospc(self, data):
        calls.append(len(data))
        if len(calls) == 2:  # the first batch after the head: half of it, then a fault
            real_write(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, data)

    monkeypatch.setattr(ReplacingFile, "write", half_then_enospc)
    with pytest.raises(OSError):
        _feed(sink, 3)
    with pytest.raises(WriteError, match=r"trace\.json' was not written: a write failed"):
        sink.twinkle_unconfigure()
    assert (tmp_path / "trace.json").read_bytes() == b"[]\n"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temporary left
