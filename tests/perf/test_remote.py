"""WorkerRecorder and WorkerReport: a worker's spans and memory, bounded, as bytes."""

from __future__ import annotations

import os
import pickle

import msgspec
import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.perf import ManualClock, WorkerRecorder, WorkerReport


def test_a_report_carries_the_spans_since_the_last_one_and_a_memory_reading() -> None:
    clock = ManualClock(1_000)
    worker = WorkerRecorder("engine0", rank=1, clock=clock, wall_clock=lambda: 7 * 10**18)
    with worker.span("generate", iteration=0):
        clock.advance(50)
    report = worker.report()
    assert report.worker == "engine0"
    assert report.anchor == worker.recorder.anchor and report.anchor.pid == os.getpid()
    assert [(s.name, s.start_ns, s.end_ns, s.attrs) for s in report.spans] == [
        ("generate", 1_000, 1_050, {"iteration": 0})
    ]
    (reading,) = report.readings
    assert (reading.worker_id, reading.rank, reading.pid) == ("engine0", 1, os.getpid())
    assert report.spans_dropped == 0
    again = worker.report(memory=False)
    assert again.spans == () and again.readings == ()


def test_a_worker_named_another_process_reads_its_memory_under_that_name() -> None:
    """A recorder given a pid and host (a pod's name, say) stamps its memory readings as
    it stamps its spans: one process in the run and in the trace, not two."""
    worker = WorkerRecorder("engine0", pid=4242, hostname="pod-a")
    report = worker.report()
    [reading] = report.readings
    assert (reading.pid, reading.hostname) == (4242, "pod-a")
    assert (report.anchor.pid, report.anchor.hostname) == (4242, "pod-a")
    assert reading.worker_id == "engine0" and reading.host_rss_bytes > 0


def test_spans_beyond_the_bound_are_dropped_and_counted() -> None:
    worker = WorkerRecorder("w", max_spans=3, clock=ManualClock())
    for i in range(5):
        with worker.span(f"s{i}"):
            pass
    report = worker.report(memory=False)
    assert [s.name for s in report.spans] == ["s0", "s1", "s2"]
    assert report.spans_dropped == 2
    assert worker.report(memory=False).spans_dropped == 0  # counted once


def test_a_report_round_trips_through_bytes_and_pickle() -> None:
    worker = WorkerRecorder("rank1", clock=ManualClock(5))
    with worker.span("train.step", iteration=3, micro=1):
        pass
    report = worker.report()
    assert WorkerReport.from_bytes(report.to_bytes()) == report
    assert pickle.loads(pickle.dumps(report)) == report


def test_bad_bytes_and_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError, match="not a worker report's bytes"):
        WorkerReport.from_bytes(b"\xc1")
    whole = WorkerReport("w", WorkerRecorder("w").recorder.anchor).to_bytes()
    with pytest.raises(InvalidArgumentError, match="not a worker report's bytes"):
        WorkerReport.from_bytes(whole[:-3])  # cut short
    with pytest.raises(InvalidArgumentError, match="worker"):
        WorkerReport.from_bytes(msgspec.msgpack.encode({"spans": []}))  # no worker
    with pytest.raises(InvalidArgumentError, match="worker must name the worker"):
        WorkerRecorder("")
    with pytest.raises(InvalidArgumentError, match="max_spans must be an int >= 1"):
        WorkerRecorder("w", max_spans=0)


def test_gather_reports_without_a_process_group_is_the_report_itself() -> None:
    from twinkle.perf import gather_reports

    report = WorkerRecorder("rank0", clock=ManualClock()).report(memory=False)
    assert gather_reports(report) == [report]
    with pytest.raises(InvalidArgumentError, match="report must be a WorkerReport"):
        gather_reports({"worker": "rank0"})  # type: ignore[arg-type]
