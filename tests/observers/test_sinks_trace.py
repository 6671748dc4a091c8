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


def _check_trace_rules(trace: list[dict[str, Any]]) -> None:
    """The trace-event format's rules a viewer relies on: every event has its required
    fields, an ``X`` event a ``dur``, and on each thread the ``X`` events nest."""
    for e in trace:
        assert {"name", "ph", "pid"} <= set(e), e
        if e["ph"] != "M":
            assert {"tid", "ts"} <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in trace:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    eps = 1e-3  # (microseconds as floats)
    for thread, slices in by_thread.items():
        stack: list[float] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + eps:
                stack.pop()
            assert not stack or end <= stack[-1] + eps, (thread, start, end, stack[-1])
            stack.append(end)


def test_spans_half_over_each_other_on_one_thread_go_to_a_lane_of_their_own(tmp_path):
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}))
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR))
    spans = (
        Span("outer", 1_000_000, 1_100_000, 11, 7, {}, None),
        Span("inner", 1_010_000, 1_020_000, 11, 7, {}, None),  # nests: same track
        Span("half", 1_050_000, 1_150_000, 11, 7, {}, None),  # half over "outer"
    )
    sink.twinkle_spans(SpanBatch(RUN, 1, 2, "main", ANCHOR, spans))
    sink.twinkle_run_finished()
    sink.twinkle_unconfigure()
    trace = _trace(tmp_path / "trace.json")
    tids = {e["name"]: e["tid"] for e in trace if e["ph"] == "X"}
    assert tids["outer"] == tids["inner"] == 11 and tids["half"] != 11
    lane = [e for e in trace if e["name"] == "thread_name" and e["tid"] == tids["half"]]
    assert lane and "lane 1" in lane[0]["args"]["name"]
    _check_trace_rules(trace)


def test_a_demo_trace_follows_the_format_and_holds_every_span(tmp_path):
    """Required fields, X events with dur, per-thread nesting; one X per span of the log;
    a named track for every process; an arrow from each publish to each engine's load;
    a counter per memory reading; a marker per iteration."""
    from twinkle.demo.config import DemoConfig
    from twinkle.demo.runner import run_demo

    cfg = DemoConfig(iterations=3, prompts_per_iteration=4, completions_per_prompt=4)
    run_demo(cfg, out_dir=tmp_path, run_id="demo", autoload=False)
    run_dir = tmp_path / "demo"
    trace = _trace(run_dir / "trace.json")
    _check_trace_rules(trace)
    log = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    spans = [s for e in log if e["type"] == "spans" for s in e["spans"]]
    slices = [e for e in trace if e["ph"] == "X" and e["cat"] != "weights"]
    assert len(slices) == len(spans)
    named = {e["pid"] for e in trace if e["name"] == "process_name"}
    assert {e["pid"] for e in slices} <= named
    threads = {(e["pid"], e["tid"]) for e in trace if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= threads
    engines = {e["args"]["name"].split()[0] for e in trace if e["name"] == "thread_name"}
    assert {"engine0", "engine1"} <= engines  # each engine's producer thread, by name
    starts = {e["id"] for e in trace if e["ph"] == "s"}
    ends = {e["id"] for e in trace if e["ph"] == "f"}
    published = [e for e in log if e["type"] == "weights_published"]
    assert starts == {f"v{p['version']}/{a['engine']}" for p in published for a in p["acks"]}
    assert starts and starts <= ends  # every publish's arrow lands on a load
    readings = [r for e in log if e["type"] == "memory" for r in e["readings"]]
    assert len([e for e in trace if e["ph"] == "C"]) == len(readings)
    markers = [e for e in trace if e["ph"] == "i" and e["name"].startswith("iteration")]
    assert len(markers) == 3
