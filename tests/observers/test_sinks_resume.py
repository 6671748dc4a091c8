"""The sinks when a live run resumes its directory (``RunContext.resumed_events > 0``):
the observers are fed the logged events again first, then the new ones. The event log
writes only the new ones (``seq`` continuing), the record files and the trace are
rebuilt whole."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.errors import ReporterError
from twinkle.events import Event, IterationStarted, RunFinished, RunResumed, RunStarted, SpanBatch
from twinkle.hookspecs import RunContext
from twinkle.observers import EventLogSink, RawRecordsSink, TraceSink, WebUISink
from twinkle.perf import ClockAnchor, Span
from twinkle.reporting import make_record, with_seq

RUN = "resume"
ANCHOR = ClockAnchor(monotonic_ns=1_000_000, wall_ns=5, pid=7, hostname="node0")


def events(n: int) -> list[Event]:
    out: list[Event] = [RunStarted(RUN, 1_000_000, 5, ANCHOR)]
    for i in range(n):
        out.append(IterationStarted(RUN, 1_000_000 + 10_000 * i, 9, i))
        span = Span(f"step{i}", 1_000_000 + 10_000 * i, 1_005_000 + 10_000 * i, 1, 7, {}, None)
        out.append(SpanBatch(RUN, 1_000_000 + 10_000 * i + 6_000, 9, "main", ANCHOR, (span,)))
    return out


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def log_events(out_dir: Path, feed: list[Event], *, resumed: int, replay: bool) -> None:
    sink = EventLogSink()
    sink.twinkle_configure(
        RunContext(run_id=RUN, out_dir=out_dir, replay=replay, resumed_events=resumed)
    )
    for event in feed:
        sink.twinkle_event(event)
    sink.twinkle_unconfigure()


@pytest.mark.parametrize("replay", [False, True], ids=["writer-thread", "inline"])
def test_a_resumed_event_log_writes_only_the_new_events_and_continues_seq(
    tmp_path: Path, replay: bool
) -> None:
    everything = events(300)  # more than one batch of events is fed again
    first, later = everything[:401], everything[401:]
    log_events(tmp_path, first, resumed=0, replay=replay)
    log_events(tmp_path, everything, resumed=len(first), replay=replay)
    lines = lines_of(tmp_path / "events.jsonl")
    assert [o["seq"] for o in lines] == list(range(len(everything)))
    assert [o["type"] for o in lines[len(first) :]] == [e.TYPE for e in later]
    assert lines[len(first)]["monotonic_ns"] == later[0].monotonic_ns


def test_resuming_a_log_whose_last_seq_is_not_the_resumed_count_is_refused(
    tmp_path: Path,
) -> None:
    log_events(tmp_path, events(2), resumed=0, replay=True)
    before = (tmp_path / "events.jsonl").read_bytes()
    sink = EventLogSink()
    with pytest.raises(ReporterError, match=r"events\.jsonl' ends with the event of seq 4.*3"):
        sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path, resumed_events=3))
    assert sink.stats is None and sink.writer is None
    assert not [t for t in threading.enumerate() if t.name == "twinkle-eventlog"]
    assert (tmp_path / "events.jsonl").read_bytes() == before


def test_resuming_an_older_log_without_seq_numbers_new_lines_from_its_event_count(
    tmp_path: Path,
) -> None:
    from twinkle.events import dumps_event

    old = events(1)
    (tmp_path / "events.jsonl").write_bytes(b"".join(dumps_event(e) + b"\n" for e in old))
    log_events(tmp_path, events(2), resumed=len(old), replay=True)
    assert [o.get("seq") for o in lines_of(tmp_path / "events.jsonl")] == [None] * 3 + [3, 4]


def record(i: int) -> Any:
    made = make_record(
        kind="train",
        scope="iteration",
        run_id=RUN,
        step=i,
        iteration=i,
        wall_ns=1_700_000_000_000_000_000 + i,
        monotonic_ns=i,
        values={"x": i},
    )
    return with_seq(made, i)


@pytest.mark.parametrize(
    ("sink_type", "name"), [(RawRecordsSink, "metrics_raw.jsonl"), (WebUISink, "metrics.jsonl")]
)
def test_record_files_are_rebuilt_when_the_run_resumes_and_kept_otherwise(
    tmp_path: Path, sink_type: type[RawRecordsSink | WebUISink], name: str
) -> None:
    def write(resumed: int, records: list[Any], segment: int = 0) -> None:
        sink = sink_type()
        context = RunContext(run_id=RUN, out_dir=tmp_path, resumed_events=resumed, segment=segment)
        sink.twinkle_configure(context)
        (backend,) = sink.twinkle_make_backends(context) or []
        backend.write(records)
        kept = (tmp_path / name).read_bytes() if (tmp_path / name).exists() else None
        for fed_again in range(1, segment):  # an earlier segment's: not this one's
            sink.twinkle_run_resumed(RunResumed(RUN, 9, 9, ANCHOR, fed_again))
        if kept is not None:  # the rebuild is not in place before its own segment's
            assert (tmp_path / name).read_bytes() == kept
        if resumed:  # the logged events went by: the new segment begins
            sink.twinkle_run_resumed(RunResumed(RUN, 9, 9, ANCHOR, segment))
        backend.close()  # the reporter's part
        sink.twinkle_unconfigure()

    write(0, [record(0), record(1)])
    write(0, [record(2)])  # a new segment without resuming: appended
    assert [o["iteration"] for o in lines_of(tmp_path / name)] == [0, 1, 2]
    write(7, [record(0), record(1), record(2), record(3)], segment=2)  # rebuilt whole
    assert [o["iteration"] for o in lines_of(tmp_path / name)] == [0, 1, 2, 3]


def test_a_record_file_opened_by_a_run_that_failed_to_start_is_closed(tmp_path: Path) -> None:
    sink = RawRecordsSink()
    sink.twinkle_configure(RunContext(run_id=RUN, out_dir=tmp_path))
    backend = sink._backend
    assert backend is not None and not backend.writer.closed
    sink.twinkle_unconfigure()  # no reporter ever took it
    assert backend.writer.closed


def test_the_trace_is_rebuilt_whole_when_a_run_resumes(tmp_path: Path) -> None:
    def trace(out_dir: Path, feed: list[Event], resumed: int) -> bytes:
        sink = TraceSink()
        sink.twinkle_configure(RunContext(run_id=RUN, out_dir=out_dir, resumed_events=resumed))
        for event in feed:
            if isinstance(event, RunStarted):
                sink.twinkle_run_started(event)
            elif isinstance(event, IterationStarted):
                sink.twinkle_iteration_started(event)
            elif isinstance(event, SpanBatch):
                sink.twinkle_spans(event)
        sink.twinkle_run_finished(RunFinished(RUN, 10**12, 9))
        sink.twinkle_unconfigure()
        return (out_dir / "trace.json").read_bytes()

    everything = events(4)
    trace(tmp_path / "run", everything[:5], 0)  # the first segment's trace
    resumed = trace(tmp_path / "run", everything, 5)
    assert resumed == trace(tmp_path / "fresh", everything, 0)
    assert [e["name"] for e in orjson.loads(resumed)].count("step3") == 1
