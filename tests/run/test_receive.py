"""RunSession.receive: what another process measured lands in the run, on its timeline.

Each worker is a real second interpreter: it records spans on its own clock and prints
its :class:`~twinkle.perf.WorkerReport` as bytes; the run receives them. The spans keep
the worker's durations, move onto the run's timeline through the anchors (inside the
iteration window they ran in, to within a millisecond), name their source, and the
figures recompute from the log and replay byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from _recompute import check_replay, check_run, span_list
from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.perf import ClockAnchor, ManualClock, Span, WorkerReport
from twinkle.perf.stats import MemoryReading
from twinkle.run import RunSession

CONFIG = {
    "phases": {"rollout": ["generate"], "train": ["train.step"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
    "streaming": {"generation": "rollout", "training": "train"},
}
WORKER = """
import sys, time
from twinkle.perf import WorkerRecorder
worker = WorkerRecorder(sys.argv[1], max_spans=int(sys.argv[3]))
for i in range(int(sys.argv[4])):
    with worker.span("generate", iteration=int(sys.argv[2]), part=i):
        time.sleep(0.02)
sys.stdout.buffer.write(worker.report().to_bytes())
"""
TOLERANCE_NS = 1_000_000  # the anchors of two processes on one host: microseconds apart


def _work(name: str, iteration: int, *, spans: int = 1, max_spans: int = 100) -> WorkerReport:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, name, str(iteration), str(max_spans), str(spans)],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return WorkerReport.from_bytes(out)


def test_a_workers_spans_and_memory_land_in_the_run_on_its_timeline(tmp_path: Path) -> None:
    with RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False) as run:
        for it in range(2):
            run.bus.iteration_started(it)
            report = _work(f"engine{it}", it, spans=2)
            run.receive(report, iteration=it)
            run.bus.samples(iteration=it, phase="rollout", lengths=[5, 7])
            with run.recorder.span("train.step", iteration=it):
                pass
        run.receive(_work("engine9", 1, spans=3, max_spans=1), iteration=1)
    run_dir = tmp_path / "r"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = events[0]
    boundaries = [e["monotonic_ns"] for e in events if e["type"] == "iteration_started"]
    finish = events[-1]["monotonic_ns"]
    ends = [boundaries[1], finish]
    worker_batches = [
        e
        for e in events
        if e["type"] == "spans" and e["source"] not in ("main", "twinkle.observers")
    ]
    assert [b["source"] for b in worker_batches] == ["engine0", "engine1", "engine9"]
    for batch in worker_batches:
        anchor, origin = batch["anchor"], started["anchor"]
        assert anchor["pid"] != origin["pid"]
        shift = (anchor["wall_ns"] - anchor["monotonic_ns"]) - (
            origin["wall_ns"] - origin["monotonic_ns"]
        )
        for span in span_list(batch):
            it = span["attrs"]["iteration"]
            assert span["end_ns"] - span["start_ns"] >= 20_000_000  # the worker's own duration
            lo, hi = boundaries[it] - TOLERANCE_NS, ends[it] + TOLERANCE_NS
            assert lo <= span["start_ns"] + shift <= span["end_ns"] + shift <= hi, span
    readings = [r for e in events if e["type"] == "memory" for r in e["readings"]]
    assert [r["worker_id"] for r in readings] == ["engine0", "engine1", "engine9"]
    assert {r["pid"] for r in readings} == {b["anchor"]["pid"] for b in worker_batches}
    summary = json.loads((run_dir / "summary.json").read_text())
    sources = summary["spans"]["sources"]
    assert sources["engine0"] == {"spans": 2, "dropped": 0}
    assert sources["engine9"] == {"spans": 1, "dropped": 2}
    assert summary["spans"]["dropped"] == 2
    assert summary["memory_readings"] == 3
    check_run(run_dir)
    check_replay(run_dir, tmp_path / "again")


def test_receive_refuses_what_is_not_a_report(tmp_path: Path) -> None:
    with RunSession(out_dir=None, config=CONFIG, autoload=False) as run:
        with pytest.raises(InvalidArgumentError, match=r"receive\(\) takes a twinkle\.perf"):
            run.receive({"worker": "w"}, iteration=0)  # type: ignore[arg-type]


def _report(spans: tuple[Span, ...], worker: object = "engine0") -> WorkerReport:
    anchor = ClockAnchor(monotonic_ns=0, wall_ns=10**18, pid=7, hostname="node1")
    reading = MemoryReading("engine0", 0, 7, "node1", "cpu", 2**20, 2**20, 0, 0, 0, 0)
    return WorkerReport(worker, anchor, spans, (reading,))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["iteration", "backwards", "worker", "surrogate"])
def test_a_report_refused_is_refused_whole(tmp_path: Path, bad: str) -> None:
    """A report whose memory iteration is -1, one of whose spans ends before it starts,
    whose worker is no str, or whose worker name cannot be written (a lone surrogate):
    its spans reached the log and the figures, its readings did not (or a raw
    AttributeError, or finish() failing on the name). It is refused with an error naming
    the culprit, and the run is as if it never came."""
    good = Span("generate", 100, 900, 1, 7, {"iteration": 0}, None)
    spans = (good, Span("generate", 900, 100, 1, 7, {}, None)) if bad == "backwards" else (good,)
    worker = {"worker": 5, "surrogate": "engine\udc80"}.get(bad, "engine0")
    why = {
        "iteration": r"memory\.iteration",
        "backwards": r"report of worker 'engine0' was refused, nothing of it published",
        "worker": r"report\.worker must be a str, got int",
        "surrogate": r"report\.worker 'engine\\udc80' is not valid UTF-8",
    }[bad]
    outs = []
    for refused in (True, False):
        out = tmp_path / str(refused)
        clock = ManualClock(0)
        with RunSession(out_dir=out, run_id="r", config=CONFIG, clock=clock, autoload=False,
                        wall_clock=lambda: 10**18 + clock()) as run:  # fmt: skip
            run.bus.iteration_started(0)
            clock.advance(10**9)
            if refused:
                with pytest.raises((RecordError, InvalidArgumentError), match=why):
                    run.receive(_report(spans, worker), iteration=-1 if bad == "iteration" else 0)
            clock.advance(10**9)
        outs.append(out / "r")
    logged = [orjson.loads(x) for x in (outs[0] / "events.jsonl").read_bytes().splitlines()]
    assert not [
        e for e in logged if e["type"] == "memory" or e.get("source", "").startswith("engine")
    ]
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()
    check_replay(outs[0], tmp_path / "replayed")


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_a_report_received_as_the_run_finishes_is_taken_whole(
    tmp_path: Path, background: bool
) -> None:
    """finish() began between a report's spans and its memory readings (a receiver
    thread, here slowed in a listener of the spans): the spans were in the log and the
    readings refused, receive() raising. A report is now queued in one step."""
    import threading
    import time

    from twinkle.events import SIGNALS, SpanBatch
    from twinkle.perf import WorkerRecorder

    run = RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, background_dispatch=background
    ).start()
    worker = WorkerRecorder(worker="rank1")
    with worker.span("generate"):
        pass
    report = worker.report(memory=True)
    sent, raised = threading.Event(), []

    def slow(sender: object, event: SpanBatch) -> None:
        if event.source == "rank1":
            sent.set()
            time.sleep(0.3)

    SIGNALS[SpanBatch].connect(slow)
    try:

        def receives() -> None:
            try:
                run.receive(report)
            except Exception as exc:
                raised.append(exc)

        thread = threading.Thread(target=receives)
        thread.start()
        assert sent.wait(10)
        run.finish()
        thread.join(10)
    finally:
        SIGNALS[SpanBatch].disconnect(slow)
    logged = [orjson.loads(x) for x in (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()]
    from_rank1 = [e["type"] for e in logged if e.get("source") == "rank1" or (
        e["type"] == "memory" and any(r["worker_id"] == "rank1" for r in e["readings"])
    )]  # fmt: skip
    assert (raised, from_rank1) == ([], ["spans", "memory"])
