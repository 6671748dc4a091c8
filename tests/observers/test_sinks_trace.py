"""TraceSink: the publishing thread only hands events over; the trace's own writer thread
formats and writes them, in order, and the file is complete when the run finishes."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

import twinkle.observers._trace_lines as trace_lines
from _recompute import span_list
from observers.test_scripted_run import manual_session
from twinkle.errors import WriteError
from twinkle.events import (
    EngineAck,
    Event,
    IterationStarted,
    MemoryReadings,
    RunFinished,
    RunStarted,
    SpanBatch,
    WeightsPublished,
)
from twinkle.hookspecs import RunContext
from twinkle.observers import TraceSink
from twinkle.perf import ClockAnchor, ManualClock, Span, WorkerReport
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import ReplacingFile
from twinkle.run import RunSession, replay

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
    sink.twinkle_run_finished(
        RunFinished(RUN, 10**12, 9)
    )  # a trace is put in place once the run finished


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "twinkle-trace"]


def test_a_live_trace_is_written_by_its_own_thread_complete_and_in_order(tmp_path: Path) -> None:
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
    body = [e for e in events[1:] if e["ph"] != "M"]
    names = [e["name"] for e in body]
    assert names == [x for i in range(50) for x in (f"step{i}", f"iteration {i}")]
    assert [e["ts"] for e in body] == [x for i in range(50) for x in (10.0 * i, 10.0 * i + 10)]
    assert body[2]["args"] == {"i": 1, "error": "ValueError"}
    # the tracks' names come last, once every span of the run is known
    assert [e["name"] for e in events[-2:]] == ["thread_name", "thread_name"]


def test_a_replayed_trace_is_written_inline_and_equals_the_live_one(tmp_path: Path) -> None:
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


@pytest.mark.parametrize("budget_mb", [None, 200])
def test_a_trace_is_the_same_however_its_writer_batched_the_events(
    tmp_path: Path, budget_mb: int | None
) -> None:
    """A writer hands the sink whatever came since its last turn: one event, or many.
    Each event's lines keep their place, and a process first seen mid-run is named
    (at the end, with the tracks: a process is named once a line of it is written)."""
    config = {"trace": {"budget_mb": budget_mb}}
    other = ClockAnchor(monotonic_ns=1_000_000, wall_ns=5, pid=8, hostname="node1")
    events: list[Event] = [RunStarted(RUN, 1_000_000, 5, ANCHOR, config)]
    for i in range(6):
        events.append(IterationStarted(RUN, 1_000_000 + 10_000 * i, 9, i))
        events.append(_batch(i))
        if i == 3:  # a process first seen mid-run, in the middle of a batch
            spans = (Span("gen", 1_031_000, 1_032_000, 3, 8, {}, None),)
            events.append(SpanBatch(RUN, 1, 2, "engine", other, spans))
    events.append(RunFinished(RUN, 1_070_000, 9))
    traces: list[bytes] = []
    for batched in (False, True):
        out = tmp_path / str(batched)
        sink = TraceSink()
        sink.twinkle_configure(RunContext(run_id=RUN, out_dir=out, config=config, replay=True))
        if batched:
            sink._write_events(list(events))
            sink._finished = True
        else:
            hooks: dict[type[Event], Callable[[Any], None]] = {
                RunStarted: sink.twinkle_run_started,
                IterationStarted: sink.twinkle_iteration_started,
                SpanBatch: sink.twinkle_spans,
                RunFinished: sink.twinkle_run_finished,
            }
            for event in events:
                hooks[type(event)](event)
        sink.twinkle_unconfigure()
        traces.append((out / "trace.json").read_bytes())
    assert traces[0] == traces[1]
    trace = orjson.loads(traces[0])
    named = [e["args"]["name"] for e in trace if e["name"] == "process_name" and e["pid"] == 8]
    assert named == ["engine (node1, pid 8)"]


def test_without_an_output_directory_nothing_is_started_or_written(tmp_path: Path) -> None:
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=None, config={}))
    assert _writer_threads() == []
    _feed(sink, 3)
    sink.twinkle_unconfigure()
    assert list(tmp_path.iterdir()) == []


def test_a_trace_whose_write_failed_is_never_put_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk fault in the middle of a batch leaves half of it in the file: that trace
    is dropped at close (the previous one stays) rather than committed as bad JSON."""
    (tmp_path / "trace.json").write_bytes(b"[]\n")
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}, replay=True))
    real_write = ReplacingFile.write
    calls: list[int] = []

    def half_then_enospc(self: ReplacingFile, data: bytes) -> None:
        calls.append(len(data))
        if len(calls) == 1:  # the first batch after the head: half of it, then a fault
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


def test_spans_half_over_each_other_on_one_thread_go_to_a_lane_of_their_own(tmp_path: Path) -> None:
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}))
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR))
    spans = (
        Span("outer", 1_000_000, 1_100_000, 11, 7, {}, None),
        Span("inner", 1_010_000, 1_020_000, 11, 7, {}, None),  # nests: same track
        Span("half", 1_050_000, 1_150_000, 11, 7, {}, None),  # half over "outer"
    )
    sink.twinkle_spans(SpanBatch(RUN, 1, 2, "main", ANCHOR, spans))
    sink.twinkle_run_finished(RunFinished(RUN, 10**12, 9))
    sink.twinkle_unconfigure()
    trace = _trace(tmp_path / "trace.json")
    tids = {e["name"]: e["tid"] for e in trace if e["ph"] == "X"}
    assert tids["outer"] == tids["inner"] != tids["half"]
    lane = [e for e in trace if e["name"] == "thread_name" and e["tid"] == tids["half"]]
    assert [e["args"]["name"] for e in lane] == ["main (thread 11, lane 1)"]
    _check_trace_rules(trace)


def test_a_demo_trace_follows_the_format_and_holds_every_span(tmp_path: Path) -> None:
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
    spans = [s for e in log if e["type"] == "spans" for s in span_list(e)]
    slices = [e for e in trace if e["ph"] == "X" and e["cat"] not in ("weights", "critical path")]
    assert len(slices) == len(spans)
    named = {e["pid"] for e in trace if e["name"] == "process_name"}
    assert {e["pid"] for e in slices} <= named
    threads = {(e["pid"], e["tid"]) for e in trace if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= threads
    labels = [e["args"]["name"].split()[0] for e in trace if e["name"] == "thread_name"]
    assert {"engine0", "engine1"} <= set(labels)  # each engine's producer thread, by name
    assert labels.count("trainer") == 1  # the trainer thread, though it loads engines too
    assert "main" not in labels  # no thread is named after the mere recorder
    _check_arrows(trace)
    published = [e for e in log if e["type"] == "weights_published"]
    acks = sum(len(p["acks"]) for p in published)
    assert acks and len([e for e in trace if e["ph"] == "s"]) == acks  # one per engine
    readings = [r for e in log if e["type"] == "memory" for r in e["readings"]]
    assert len([e for e in trace if e["ph"] == "C"]) == len(readings)
    markers = [e for e in trace if e["ph"] == "i" and e["name"].startswith("iteration")]
    assert len(markers) == 3
    assert {_track_name(trace, e) for e in markers} == {"iterations"}
    publishes = [e for e in trace if e["ph"] == "X" and e["cat"] == "weights"]
    assert publishes and {_track_name(trace, e) for e in publishes} == {"weights"}


# -- tracks named by what runs on them ----------------------------------------------------


def test_processes_of_two_hosts_with_one_pid_are_two_processes(tmp_path: Path) -> None:
    """Workers in containers have the same small pids: worker1 on node-b (pid 7) was
    drawn in worker0's process (node-a, pid 7), its spans half over worker0's on one
    track; a worker with the run's own pid on another host in the run's process. Each
    (host, pid) is a process of its own in the trace, named by its source, host and real
    pid; a process seen only in memory readings is named too."""
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}))
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR))

    def work(source: str, host: str, pid: int, start: int) -> None:
        anchor = msgspec.structs.replace(ANCHOR, hostname=host, pid=pid)
        span = Span(f"{source} work", start, start + 30_000_000, 1, pid, {}, None)
        sink.twinkle_spans(SpanBatch(RUN, 1, 2, source, anchor, (span,)))

    work("worker0", "node-a", 8, 10_000_000)
    work("worker1", "node-b", 8, 30_000_000)  # (half over worker0's, were they one)
    work("remote", "node-c", ANCHOR.pid, 50_000_000)
    reading = MemoryReading("rank3", 3, 4321, "node-d", "cpu", 2**20, 2**20, 0, 0, 0, 0)
    sink.twinkle_memory(MemoryReadings(RUN, 60_000_000, 6, 0, (reading,)))
    sink.twinkle_run_finished(RunFinished(RUN, 10**12, 9))
    sink.twinkle_unconfigure()
    trace = _trace(tmp_path / "trace.json")
    pids = {e["name"]: e["pid"] for e in trace if e["ph"] in "XC"}
    assert pids["worker0 work"] == 8 and pids["memory rank3"] == 4321
    others = {pids["worker1 work"], pids["remote work"]}
    assert len(others) == 2 and not others & {8, 4321, ANCHOR.pid}
    named = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert named[8] == "worker0 (node-a, pid 8)"
    assert named[pids["worker1 work"]] == "worker1 (node-b, pid 8)"
    assert named[pids["remote work"]] == f"remote (node-c, pid {ANCHOR.pid})"
    assert named[4321] == "rank3 (node-d, pid 4321)"
    assert named[ANCHOR.pid] == f"{RUN} ({ANCHOR.hostname})"
    _check_trace_rules(trace)


def test_a_skewed_workers_spans_are_laned_as_they_are_drawn(tmp_path: Path) -> None:
    """A worker whose wall clock is 100 s ahead (past the tolerance): each report is
    placed by its own arrival. Spans back to back on one thread, [100, 200) and
    [200, 300) ms, in two reports delivered after 50 and 10 ms, are drawn at [150, 250)
    and [210, 310): they were put on one track by their own times, half over each
    other. Lanes are told on the times drawn."""
    ms = 1_000_000
    run, clock = manual_session(tmp_path, "skew", {})
    here = run.bus.anchor
    ahead = ClockAnchor(here.monotonic_ns, here.wall_ns + 100 * 10**9, 4242, "node-b")

    def sent(at: int) -> ClockAnchor:
        return msgspec.structs.replace(ahead, monotonic_ns=at, wall_ns=ahead.wall_ns + at)

    run.bus.iteration_started(0)
    for name, start, arrives in (("a", 100, 250), ("b", 200, 310)):
        clock.set(arrives * ms)
        span = Span(name, start * ms, (start + 100) * ms, 1, 4242, {}, None)
        run.receive(WorkerReport("w", ahead, (span,), sent_anchor=sent((start + 100) * ms)))
    clock.set(400 * ms)
    run.finish()
    assert run.out_dir is not None
    trace = _trace(run.out_dir / "trace.json")
    drawn = {e["name"]: e for e in trace if e.get("cat") == "w"}
    assert (drawn["a"]["ts"], drawn["b"]["ts"]) == (150_000.0, 210_000.0)
    assert drawn["a"]["tid"] != drawn["b"]["tid"]
    _check_trace_rules(trace)


@pytest.mark.parametrize("start_ms", [5, 0])
def test_a_span_reaching_back_past_the_spans_a_lane_keeps_still_nests(
    tmp_path: Path, start_ms: int
) -> None:
    """One thread: ``first`` [0, 10) ms, 600 spans back to back after it (more than a
    lane keeps, LANE_MEMORY), then one opened by hand at 5 ms and closed after them
    all: half over ``first``, it was put on the thread's track past the spans a lane
    keeps. It goes to a lane of its own; opened at 0 ms it encloses them all, and
    shares the thread's track."""
    ms = 1_000_000
    run, clock = manual_session(tmp_path, "lanes", {})
    run.bus.iteration_started(0)
    pid = run.bus.anchor.pid
    spans = [Span("first", 0, 10 * ms, 77, pid, {}, None)]
    spans += [Span("step", (10 + k) * ms, (11 + k) * ms, 77, pid, {}, None) for k in range(600)]
    spans.append(Span("by_hand", start_ms * ms, 620 * ms, 77, pid, {}, None))
    clock.set(630 * ms)
    run.bus.publish_spans("main", run.bus.anchor, spans)
    run.finish()
    assert run.out_dir is not None
    trace = _trace(run.out_dir / "trace.json")
    tids = {e["name"]: e["tid"] for e in trace if e["ph"] == "X"}
    assert (tids["by_hand"] == tids["first"]) == (start_ms == 0)
    _check_trace_rules(trace)


def _names(trace: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["name"] == "thread_name"}


def _track_name(trace: list[dict[str, Any]], event: dict[str, Any]) -> str:
    return _names(trace)[(event["pid"], event["tid"])]


def _check_arrows(trace: list[dict[str, Any]]) -> None:
    """Every flow arrow has both ends: one start and one end per id, a numeric id
    (Perfetto reads a string id as hex), the start inside a slice of its track and the
    end at the start of one (``bp: e``, the enclosing slice)."""
    assert not [e for e in trace if e["ph"] == "t"]
    starts = [e for e in trace if e["ph"] == "s"]
    ends = [e for e in trace if e["ph"] == "f"]
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in ends)
    assert len({e["id"] for e in starts}) == len(starts)
    assert all(type(e["id"]) is int for e in starts)
    slices = [e for e in trace if e["ph"] == "X"]
    for s in starts:
        assert any(
            (x["pid"], x["tid"]) == (s["pid"], s["tid"])
            and x["ts"] <= s["ts"] <= x["ts"] + x["dur"]
            for x in slices
        ), s
    for f in ends:
        assert f["bp"] == "e"
        assert any(
            (x["pid"], x["tid"], x["ts"]) == (f["pid"], f["tid"], f["ts"]) for x in slices
        ), f


#: a streaming run's phases: the trainer's spans, the engines' and the weight loads
STREAMING = {
    "phases": {"rollout": ["generate"], "train": ["train.*"], "publish": ["weights.load"]},
    "streaming": {"generation": "rollout", "training": "train"},
}


def _streaming_run(out_dir: Path) -> Path:
    """A hand-made streaming run on a manual clock: the training loop on this thread, whose
    first span is an engine's (it loads engine e0's initial weights, version 0, which no
    publish announced), engine e0's producer on a thread of its own, and a publish of
    version 1 that e0 loads on another thread (its load reaches the trace before the
    publish). Returns the run directory."""
    clock = ManualClock(10**9)

    def on_a_thread(work: Any) -> None:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()

    def generate(i: int) -> None:
        with rec.span("generate", iteration=i, engine="e0"):
            clock.advance(1_000_000)

    def load(version: int) -> None:
        with rec.span("weights.load", engine="e0", version=version):
            clock.advance(300_000)

    with RunSession(
        out_dir=out_dir,
        run_id="named",
        config=STREAMING,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
        autoload=False,
    ) as run:
        rec = run.recorder
        load(0)  # the trainer thread's first span: an engine's
        for i in range(2):
            run.bus.iteration_started(i)
            on_a_thread(lambda i=i: generate(i))
            with rec.span("train.step", iteration=i):
                with rec.span("train.forward", iteration=i):
                    clock.advance(2_000_000)
        start = clock()
        on_a_thread(lambda: load(1))
        run.bus.weights_published(1, start_ns=start, end_ns=clock(), acks=[("e0", clock())])
    return out_dir / "named"


def test_a_training_thread_whose_first_span_is_an_engines_is_named_the_trainer(
    tmp_path: Path,
) -> None:
    trace = _trace(_streaming_run(tmp_path) / "trace.json")
    _check_trace_rules(trace)
    me = threading.get_ident()
    first = next(e for e in trace if e["ph"] == "X" and e["cat"] == "main")
    assert (first["name"], first["args"]["engine"]) == ("weights.load", "e0")
    assert _track_name(trace, first) == f"trainer (thread {me})"
    labels = [n.split(" (")[0] for n in _names(trace).values()]
    assert labels.count("trainer") == 1
    # e0's threads by the engine they serve; twinkle's work overlapping the trainer's
    # spans (on a lane of the trainer's thread) by twinkle's source
    assert {"trainer", "e0", "iterations", "weights"} <= set(labels)
    assert set(labels) <= {
        "trainer",
        "e0",
        "iterations",
        "weights",
        "twinkle.observers",
        "critical path",
    }
    for event in trace:
        if event["ph"] == "X" and event["cat"] == "main" and event["name"] != "weights.load":
            expected = "e0" if event["name"] == "generate" else "trainer"
            assert _track_name(trace, event).startswith(f"{expected} (thread "), event


def test_iteration_markers_and_publishes_sit_on_named_tracks(tmp_path: Path) -> None:
    trace = _trace(_streaming_run(tmp_path) / "trace.json")
    markers = [e for e in trace if e["ph"] == "i"]
    assert [e["name"] for e in markers] == ["iteration 0", "iteration 1"]
    assert {_track_name(trace, e) for e in markers} == {"iterations"}
    assert all(e["s"] == "t" and e["tid"] != 0 for e in markers)  # a track, not tid 0
    publishes = [e for e in trace if e["ph"] == "X" and e["cat"] == "weights"]
    assert [e["name"] for e in publishes] == ["weights v1"]
    assert _track_name(trace, publishes[0]) == "weights"


def test_every_arrow_of_a_run_has_both_ends(tmp_path: Path) -> None:
    """The initial load (version 0) was never published: it gets no arrow end of its own;
    version 1's load, which reached the trace first, is joined to its publish."""
    trace = _trace(_streaming_run(tmp_path) / "trace.json")
    _check_arrows(trace)
    (start,) = [e for e in trace if e["ph"] == "s"]
    (end,) = [e for e in trace if e["ph"] == "f"]
    assert _track_name(trace, start) == "weights"
    load = next(
        e for e in trace if e["ph"] == "X" and e["name"] == "weights.load" and e["ts"] == end["ts"]
    )
    assert load["args"]["version"] == 1


def test_a_replayed_log_gives_the_same_trace_byte_for_byte(tmp_path: Path) -> None:
    run_dir = _streaming_run(tmp_path / "live")
    replay(run_dir / "events.jsonl", tmp_path / "replayed", autoload=False)
    assert (tmp_path / "replayed/trace.json").read_bytes() == (run_dir / "trace.json").read_bytes()


def test_a_single_thread_loop_like_trls_is_named_the_trainer_not_twinkle(tmp_path: Path) -> None:
    """TRL's callback and a user's own loop train on the thread that publishes the run's
    events, so twinkle's own spans come first there: the thread is still the trainer's
    (TRL's phases: ``train`` and ``step``, no streaming), or the loop's recorder's
    (``main``) without phases; never twinkle's."""
    me = threading.get_ident()
    for config, label in (
        ({"phases": {"train": ["train.step", "train.optimizer"], "step": ["step"]}}, "trainer"),
        ({}, "main"),
    ):
        clock = ManualClock(10**9)
        out_dir = tmp_path / label
        with RunSession(
            out_dir=out_dir, run_id="loop", config=config, clock=clock, autoload=False
        ) as run:
            for i in range(3):
                run.bus.iteration_started(i)
                with run.recorder.span("step"):
                    with run.recorder.span("train.step"):
                        clock.advance(1_000_000)
                    with run.recorder.span("train.optimizer"):
                        clock.advance(100_000)
                run.bus.optimizer_step(iteration=i, step=i + 1)
        trace = _trace(out_dir / "loop" / "trace.json")
        _check_trace_rules(trace)
        mine = [e for e in trace if e["ph"] == "X" and _track_name(trace, e).endswith(f" {me})")]
        assert mine[0]["cat"] == "twinkle.observers"  # twinkle's spans came first here
        assert {_track_name(trace, e) for e in mine if e["cat"] == "main"} == {
            f"{label} (thread {me})"
        }


def test_a_thread_with_twinkles_spans_only_is_named_twinkles_and_arrows_wait_for_both_ends(
    tmp_path: Path,
) -> None:
    """Ends in any order: a publish before its load, a load no publish announced (no
    arrow), a publish whose load never came (no arrow)."""
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}))
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR, config=STREAMING))
    acks = (EngineAck("e0", 1_010_000), EngineAck("e1", 1_010_000))
    sink.twinkle_weights_published(
        WeightsPublished(RUN, 1_010_000, 6, 1, 1_000_000, 1_010_000, acks)
    )

    def load(engine: str, version: int, start: int, thread: int) -> Span:
        return Span(
            "weights.load",
            start,
            start + 1_000,
            thread,
            7,
            {"engine": engine, "version": version},
            None,
        )

    spans = (
        load("e0", 0, 1_001_000, 21),
        load("e0", 1, 1_002_000, 21),
        load("e1", 2, 1_003_000, 22),
    )
    sink.twinkle_spans(SpanBatch(RUN, 1_020_000, 7, "main", ANCHOR, spans))
    own = (Span("twinkle.observe", 1_020_000, 1_021_000, 23, 7, {}, None),)
    sink.twinkle_spans(SpanBatch(RUN, 1_030_000, 8, "twinkle.observers", ANCHOR, own))
    sink.twinkle_run_finished(RunFinished(RUN, 10**12, 9))
    sink.twinkle_unconfigure()
    trace = _trace(tmp_path / "trace.json")
    _check_arrows(trace)
    (end,) = [e for e in trace if e["ph"] == "f"]
    assert end["ts"] == 2.0  # e0's load of version 1
    assert sorted(_names(trace).values()) == [
        "e0 (thread 21)",
        "e1 (thread 22)",
        "twinkle.observers (thread 23)",
        "weights",
    ]


def test_arrow_ends_waiting_for_their_other_end_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher whose engines time no load leaves every publish's end waiting: the
    sink remembers the last ARROW_MEMORY of them, and draws no arrow for one it forgot."""
    monkeypatch.setattr(trace_lines, "ARROW_MEMORY", 2)
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, config={}, replay=True))
    sink.twinkle_run_started(RunStarted(RUN, 1_000_000, 5, ANCHOR))
    for v in range(1, 5):
        at = 1_000_000 + 10_000 * v
        ack = (EngineAck("e0", at + 1_000),)
        sink.twinkle_weights_published(WeightsPublished(RUN, at, 6, v, at, at + 1_000, ack))
    assert len(sink._lines._sends) == 2
    loads = tuple(
        Span(
            "weights.load",
            1_100_000 + v,
            1_100_001 + v,
            21,
            7,
            {"engine": "e0", "version": v},
            None,
        )
        for v in (1, 4)
    )
    sink.twinkle_spans(SpanBatch(RUN, 1_200_000, 7, "main", ANCHOR, loads))
    sink.twinkle_run_finished(RunFinished(RUN, 10**12, 9))
    sink.twinkle_unconfigure()
    trace = _trace(tmp_path / "trace.json")
    _check_arrows(trace)
    (end,) = [e for e in trace if e["ph"] == "f"]
    assert end["ts"] == 100.004  # version 4's load; version 1's end was forgotten


def test_a_span_that_is_not_json_leaves_its_batchs_other_lines_with_the_batch() -> None:
    lines_of = trace_lines.TraceLines()
    config = {"trace": {"budget_mb": None}}
    head: list[bytes] = []
    lines_of.add(RunStarted(RUN, 1_000_000, 5, ANCHOR, config), head)
    good = Span("good", 1_100_000, 1_200_000, 1, 7, {}, None)
    bad = Span("bad", 1_100_000, 1_200_000, 1, 7, {"x": object()}, None)
    lines: list[bytes] = []
    with pytest.raises(TypeError):
        lines_of.add(SpanBatch(RUN, 1, 2, "main", ANCHOR, (good, bad)), lines)
    assert [orjson.loads(line)["name"] for line in lines if b'"ph":"X"' in line] == ["good"]
