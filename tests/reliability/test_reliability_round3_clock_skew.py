"""Round 3, issue #26 item 7: a worker host's clock skew is found, flagged and never bends
the windows.

A worker report carries its clocks read as it was made (``sent_anchor``); its batch's
``monotonic_ns`` is its arrival. A send the anchors place after the arrival (beyond
``clock_skew.ahead_s``) or far before it (``behind_s``) marks a skewed clock: the
batch's spans are placed by the arrival, and ``summary.json``'s ``clock_skew`` names the
worker, its host and the offset (docs/metrics.md, "Clock skew between hosts").

The in-process workers here are another host's as the anchors see them (their own pid
and hostname) on clocks derived from one manual "true" clock, so every figure is exact;
one test runs a real second interpreter whose wall clock is 3 s ahead. Also: the L item
``WorkerReport.from_bytes('a str')``.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

import twinkle.reporting.jsonl as jsonl_module
from _recompute import check_replay, check_run, placed_spans, read_events, windows
from twinkle.errors import ConfigError, InvalidArgumentError
from twinkle.observers import ObserverConfig
from twinkle.perf import ManualClock, WorkerRecorder, WorkerReport
from twinkle.report import format_report, load_report
from twinkle.run import RunSession

W = 1_700_000_000_000_000_000  # the true wall clock at the start, unix ns
S = 1_000_000_000  # one second, in ns
DAY = 86_400 * S
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.step"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
    "streaming": {"generation": "rollout", "training": "train"},
}
DERIVED = ("metrics_raw.jsonl", "metrics.jsonl", "trace.json")


def remote_worker(true: ManualClock, *, ahead_ns: int, name: str = "engine0") -> WorkerRecorder:
    """A worker on host ``node1`` whose monotonic clock reads 5 s at the true start and
    whose wall clock is ``ahead_ns`` off the truth (negative: behind)."""
    return WorkerRecorder(
        name,
        clock=lambda: true() + 5 * S,
        wall_clock=lambda: W + true() + ahead_ns,
        pid=4242,
        hostname="node1",
    )


@contextmanager
def session(
    out: Path, true: ManualClock, config: dict[str, Any] | None = None
) -> Iterator[RunSession]:
    """The run: its monotonic clock reads 1 s at the true start, its wall clock is true."""
    with RunSession(
        out_dir=out,
        run_id="r",
        config=config or CONFIG,
        autoload=False,
        clock=lambda: true() + S,
        wall_clock=lambda: W + true(),
        background_writer=False,
        resume=True,  # (a second segment continues the run)
    ) as run:
        yield run


def iterations(
    run: RunSession,
    true: ManualClock,
    worker: WorkerRecorder,
    *,
    first: int = 0,
    count: int = 3,
    delivery_ns: int = 0,
) -> None:
    """Per iteration: the worker generates for 0.2 s and reports; the report arrives
    ``delivery_ns`` later; the run trains for 0.05 s."""
    for it in range(first, first + count):
        run.bus.iteration_started(it)
        with worker.span("generate", iteration=it):
            true.advance(200_000_000)
        report = worker.report(memory=False)
        true.advance(delivery_ns)
        run.receive(report, iteration=it)
        run.bus.samples(iteration=it, phase="rollout", lengths=[100, 60])
        with run.recorder.span("train.step", iteration=it):
            true.advance(50_000_000)


def skewed_run(
    out: Path, ahead_ns: int, *, delivery_ns: int = 0, config: dict[str, Any] | None = None
) -> Path:
    true = ManualClock(0)
    with session(out, true, config) as run:
        worker = remote_worker(true, ahead_ns=ahead_ns)
        true.advance(100_000_000)
        iterations(run, true, worker, delivery_ns=delivery_ns)
    return out / "r"


def summary(run_dir: Path) -> dict[str, Any]:
    values: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return values


def figures(run_dir: Path) -> dict[str, Any]:
    """What the issue measured: window throughput (the run's), its wall, its late spans."""
    records = [json.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    (window,) = [r["values"] for r in records if r["kind"] == "run"]
    (timing,) = [r["values"] for r in records if r["kind"] == "timing" and r["scope"] == "run"]
    return {
        "tokens_per_s_per_device": window["tokens_per_s_per_device"],
        "wall_seconds": timing["wall_seconds"],
        "teardown_wall_seconds": timing["teardown_wall_seconds"],
        "late_spans": timing["late_spans"],
    }


# -- the hand-worked example of docs/metrics.md ----------------------------------------


def test_the_hand_worked_example_of_a_worker_3s_ahead(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    true = ManualClock(0)
    with caplog.at_level(logging.WARNING, logger="twinkle.observers"):
        with session(tmp_path, true) as run:
            # both anchors read at the true start: the worker's (5 s, W + 3 s), the run's (1 s, W)
            worker = remote_worker(true, ahead_ns=3 * S)
            assert (worker.recorder.anchor.monotonic_ns, worker.recorder.anchor.wall_ns) == (
                5 * S,
                W + 3 * S,
            )
            true.set(4 * S)
            run.bus.iteration_started(0)  # at 5.0 s of the run's clock
            with worker.span("generate", iteration=0):  # 9.0 s to 9.2 s of the worker's
                true.advance(200_000_000)
            report = worker.report(memory=False)  # sent at 9.2 s of the worker's clock
            assert report.sent_anchor is not None
            assert report.sent_anchor.monotonic_ns == 9_200_000_000
            true.advance(1_000_000)
            run.receive(report, iteration=0)  # arrives at 5.201 s of the run's clock
            run.bus.samples(iteration=0, phase="rollout", lengths=[100])
            true.set(4_300_000_000)
    run_dir = tmp_path / "r"
    (batch,) = [
        e for e in read_events(run_dir) if e["type"] == "spans" and e["source"] == "engine0"
    ]
    assert batch["monotonic_ns"] == 5_201_000_000
    # The anchors shift it by (W + 3 - 5) - (W - 1) = -1 s: the send at 8.2 s, 2.999 s after
    # its arrival. Placed by its arrival instead: by 5.201 - 9.2 = -3.999 s.
    ((_, span, start, end),) = placed_spans(read_events(run_dir), {"engine0"})
    assert (span["start_ns"], span["end_ns"]) == (9_000_000_000, 9_200_000_000)
    assert (start, end) == (5_001_000_000, 5_201_000_000)  # the truth, 5.0-5.2 s, 1 ms late
    assert summary(run_dir)["clock_skew"] == {
        "ahead_tolerance_seconds": 0.01,
        "behind_tolerance_seconds": 1.0,
        "checked_reports": 1,
        "workers": {
            "engine0": {
                "hostname": "node1",
                "corrected_reports": 1,
                "corrected_spans": 1,
                "offset_seconds": 2.999,
            }
        },
    }
    timing = [json.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    (it0,) = [r["values"] for r in timing if r["kind"] == "timing" and r["scope"] == "iteration"]
    assert it0["window_wall_seconds"] == pytest.approx(0.3)  # 5.0 s to the finish at 5.3 s
    assert it0["window_rollout_seconds"] == pytest.approx(0.2)  # in its window, not 3 s on
    trace = orjson.loads((run_dir / "trace.json").read_bytes())
    (generate,) = [e for e in trace if e.get("name") == "generate"]
    assert (generate["ts"], generate["dur"]) == (4_001_000.0, 200_000.0)  # µs from 1.0 s
    (warning,) = [r for r in caplog.records if "clock" in r.getMessage()]
    assert "worker 'engine0' (host 'node1')" in warning.getMessage()
    assert "2.999 s after the run received it" in warning.getMessage()
    assert "ahead of the run's by at least that much" in warning.getMessage()
    check_run(run_dir)
    check_replay(run_dir, tmp_path / "again")
    assert (
        "clock skew          engine0 (node1) 2.999 s ahead, 1 spans of 1 reports: placed "
        "where their reports arrived, not where the worker's clock put them"
    ) in format_report(load_report(run_dir))


# -- ahead, a day either way, behind: the figures of a run without skew ----------------


@pytest.mark.parametrize(
    "ahead_ns",
    [3 * S, DAY, -DAY, -3 * S],
    ids=["3s-ahead", "1day-ahead", "1day-behind", "3s-behind"],
)
def test_a_skewed_worker_gives_the_figures_of_a_run_without_skew(
    tmp_path: Path, ahead_ns: int
) -> None:
    clean = skewed_run(tmp_path / "clean", 0)
    skewed = skewed_run(tmp_path / "skewed", ahead_ns)
    # Delivered at once (a manual clock), the arrival is the truth: every figure the same.
    for name in DERIVED:
        assert (skewed / name).read_bytes() == (clean / name).read_bytes(), name
    a, b = summary(clean), summary(skewed)
    assert a["clock_skew"]["workers"] == {}
    assert a["clock_skew"]["checked_reports"] == b["clock_skew"]["checked_reports"] == 3
    assert b["clock_skew"]["workers"] == {
        "engine0": {
            "hostname": "node1",
            "corrected_reports": 3,
            "corrected_spans": 3,
            "offset_seconds": ahead_ns / S,
        }
    }
    assert {k: v for k, v in a.items() if k != "clock_skew"} == {
        k: v for k, v in b.items() if k != "clock_skew"
    }
    assert figures(skewed)["late_spans"] == 0
    check_run(skewed)
    check_replay(skewed, tmp_path / "again")


def test_without_the_check_a_3s_ahead_clock_bends_the_run_as_the_issue_says(
    tmp_path: Path,
) -> None:
    """The counterfactual: a tolerance too wide to see 3 s believes the anchors, and the
    run's wall grows by 3 s (issue #26's 0.26 s -> 3.26 s): the worker's spans land 3 s
    after the finish, in a tear-down window of 3 s. (Issue #26 also saw the throughput
    fall to a third; since the run window ends with the loop, the tear-down is not in
    it.)"""
    clean = figures(skewed_run(tmp_path / "clean", 0))
    believed = skewed_run(
        tmp_path / "believed", 3 * S, config={**CONFIG, "clock_skew": {"ahead_s": 10}}
    )
    bent = figures(believed)
    assert bent["wall_seconds"] == pytest.approx(clean["wall_seconds"] + 3, abs=0.3)
    assert bent["teardown_wall_seconds"] == pytest.approx(3, abs=0.3)
    assert clean["teardown_wall_seconds"] < 0.3
    assert summary(believed)["clock_skew"]["workers"] == {}
    check_run(believed)


def test_with_a_delivery_time_the_figures_are_within_it(tmp_path: Path) -> None:
    delivery = 2_000_000  # 2 ms
    clean = skewed_run(tmp_path / "clean", 0, delivery_ns=delivery)
    skewed = skewed_run(tmp_path / "skewed", 3 * S, delivery_ns=delivery)
    a, b = figures(clean), figures(skewed)
    assert abs(b["wall_seconds"] - a["wall_seconds"]) <= delivery / S
    assert b["tokens_per_s_per_device"] == pytest.approx(a["tokens_per_s_per_device"], rel=0.01)
    events = read_events(skewed)
    placed = placed_spans(events, {"engine0"})
    truth = placed_spans(read_events(clean), {"engine0"})
    for (_, _, start, end), (_, _, true_start, true_end) in zip(placed, truth, strict=True):
        assert (start - true_start, end - true_end) == (delivery, delivery)  # late, never early
    for (_, span, start, end), (lo, hi) in zip(placed, windows(events), strict=True):
        assert lo <= start <= end <= hi, span
    (worker,) = summary(skewed)["clock_skew"]["workers"].values()
    assert worker["offset_seconds"] == pytest.approx(3 - delivery / S)  # ahead by at least
    check_run(skewed)
    check_replay(skewed, tmp_path / "again")


def test_within_the_tolerance_the_anchors_are_believed(tmp_path: Path) -> None:
    """0.5 s behind is within behind_s (1 s): a delivery that slow is believed, so the
    spans stay where the anchors put them (0.5 s early) and nothing is flagged."""
    clean = skewed_run(tmp_path / "clean", 0)
    behind = skewed_run(tmp_path / "behind", -S // 2)
    assert summary(behind)["clock_skew"]["workers"] == {}
    truth = placed_spans(read_events(clean), {"engine0"})
    placed = placed_spans(read_events(behind), {"engine0"})
    assert [s - t for (_, _, s, _), (_, _, t, _) in zip(placed, truth, strict=True)] == [
        -S // 2
    ] * 3
    check_run(behind)


def test_a_report_delayed_beyond_behind_s_is_placed_by_its_arrival_and_flagged(
    tmp_path: Path,
) -> None:
    """A delayed report and a clock behind look alike: beyond behind_s both are placed by
    the arrival (late by the delay) and flagged; a longer behind_s believes the delay."""
    delayed = skewed_run(tmp_path / "delayed", 0, delivery_ns=2 * S)
    (worker,) = summary(delayed)["clock_skew"]["workers"].values()
    assert worker["offset_seconds"] == -2.0 and worker["corrected_reports"] == 3
    believed = skewed_run(
        tmp_path / "believed",
        0,
        delivery_ns=2 * S,
        config={**CONFIG, "clock_skew": {"behind_s": 5}},
    )
    assert summary(believed)["clock_skew"]["workers"] == {}
    assert summary(believed)["clock_skew"]["behind_tolerance_seconds"] == 5.0
    check_run(delayed)
    check_run(believed)


# -- what is never checked, what never carries over ------------------------------------


def test_the_runs_own_spans_and_reports_without_a_send_time_are_not_checked(
    tmp_path: Path,
) -> None:
    true = ManualClock(0)
    with session(tmp_path, true) as run:
        worker = remote_worker(true, ahead_ns=DAY)
        run.bus.iteration_started(0)
        with worker.span("generate", iteration=0):
            true.advance(1_000)
        report = worker.report(memory=False)
        # Built by hand or by an older twinkle: no send time, placed by its anchor.
        run.receive(msgspec.structs.replace(report, sent_anchor=None), iteration=0)
        with run.recorder.span("train.step", iteration=0):
            true.advance(1_000)
    run_dir = tmp_path / "r"
    skew = summary(run_dir)["clock_skew"]
    assert (skew["checked_reports"], skew["workers"]) == (0, {})
    mains = [e for e in read_events(run_dir) if e["type"] == "spans" and e["source"] != "engine0"]
    assert mains and all(e["sent_anchor"] is None for e in mains)
    check_run(run_dir)


def test_a_resumed_run_carries_no_skew_into_its_later_segments(tmp_path: Path) -> None:
    # Segment 0: a worker a day ahead. Segment 1 (a new process, 10 s later): a restarted
    # worker of the same name whose clock is right.
    true = ManualClock(0)
    with session(tmp_path, true) as run:
        iterations(run, true, remote_worker(true, ahead_ns=DAY), count=2)
    true.advance(10 * S)
    with session(tmp_path, true) as run:
        assert run.resumed is not None and run.resumed.next_iteration == 2
        iterations(run, true, remote_worker(true, ahead_ns=0), first=2, count=2)
    run_dir = tmp_path / "r"
    events = read_events(run_dir)
    finished, resumed = [e for e in events if e["type"] in ("run_finished", "run_resumed")][:2]
    # The new segment's clock continues from the log's last event as placed, not a day on.
    assert resumed["monotonic_ns"] - finished["monotonic_ns"] == pytest.approx(10 * S, abs=S)
    done = summary(run_dir)
    assert done["clock_skew"]["workers"] == {
        "engine0": {
            "hostname": "node1",
            "corrected_reports": 2,  # segment 0's only
            "corrected_spans": 2,
            "offset_seconds": DAY / S,
        }
    }
    assert done["clock_skew"]["checked_reports"] == 4
    seconds = done["seconds"]
    assert seconds["late_spans"] == 0
    assert seconds["wall_seconds"] < 2  # two segments of ~0.9 s, the gap in no window
    records = [json.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    rollout = {
        r["iteration"]: r["values"]["window_rollout_seconds"]
        for r in records
        if r["kind"] == "timing" and r["scope"] == "iteration"
    }
    assert rollout == pytest.approx({0: 0.2, 1: 0.2, 2: 0.2, 3: 0.2})
    check_replay(run_dir, tmp_path / "again")


def test_a_skewed_report_split_over_lines_counts_once_and_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "MAX_LINE_BYTES", 64 << 10)
    true = ManualClock(0)
    with session(tmp_path, true) as run:
        worker = remote_worker(true, ahead_ns=3 * S)
        run.bus.iteration_started(0)
        for k in range(400):
            with worker.span("generate", iteration=0, pad="x" * 500, k=k):
                true.advance(10)
        run.receive(worker.report(memory=False), iteration=0)
    run_dir = tmp_path / "r"
    pieces = [e for e in read_events(run_dir) if e["type"] == "spans" and e["source"] == "engine0"]
    assert len(pieces) > 2  # one report, several lines
    skew = summary(run_dir)["clock_skew"]
    assert skew["checked_reports"] == 1
    assert skew["workers"]["engine0"]["corrected_reports"] == 1
    assert skew["workers"]["engine0"]["corrected_spans"] == 400
    check_replay(run_dir, tmp_path / "again")


# -- a real second interpreter, its wall clock 3 s ahead -------------------------------

WORKER = """
import sys, time
from twinkle.perf import WorkerRecorder
ahead_ns = int(sys.argv[2])
worker = WorkerRecorder(sys.argv[1], wall_clock=lambda: time.time_ns() + ahead_ns)
for line in sys.stdin:
    with worker.span("generate", iteration=int(line)):
        time.sleep(0.02)
    data = worker.report(memory=False).to_bytes()
    sys.stdout.buffer.write(len(data).to_bytes(4, "big") + data)
    sys.stdout.buffer.flush()
"""


class Worker:
    """A worker process asked for one iteration's rollout at a time over a pipe."""

    def __init__(self, name: str, ahead_ns: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, name, str(ahead_ns)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def rollout(self, iteration: int) -> WorkerReport:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"%d\n" % iteration)
        self.process.stdin.flush()
        size = int.from_bytes(self.process.stdout.read(4), "big")
        return WorkerReport.from_bytes(self.process.stdout.read(size))

    def close(self) -> None:
        self.process.communicate(timeout=30)  # (closes stdin, waits, closes stdout)


def test_a_worker_process_3s_ahead_is_flagged_and_its_spans_stay_in_their_windows(
    tmp_path: Path,
) -> None:
    ahead, right = Worker("engine0", 3 * S), Worker("engine1", 0)
    try:
        with RunSession(
            out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False, resume=True
        ) as run:
            for it in range(3):
                run.bus.iteration_started(it)
                for worker in (ahead, right):
                    run.receive(worker.rollout(it), iteration=it)
                run.bus.samples(iteration=it, phase="rollout", lengths=[100, 60])
                with run.recorder.span("train.step", iteration=it):
                    time.sleep(0.01)
    finally:
        ahead.close()
        right.close()
    run_dir = tmp_path / "r"
    skew = summary(run_dir)["clock_skew"]
    assert skew["checked_reports"] == 6
    assert list(skew["workers"]) == ["engine0"]  # the one on time is checked, not flagged
    flagged = skew["workers"]["engine0"]
    assert flagged["hostname"] == socket.gethostname()
    assert (flagged["corrected_reports"], flagged["corrected_spans"]) == (3, 3)
    assert 2.5 < flagged["offset_seconds"] <= 3.0  # 3 s less the delivery time
    events = read_events(run_dir)
    spans = placed_spans(events, {"engine0", "engine1"})
    bounds = windows(events)
    for _, span, start, end in spans:
        lo, hi = bounds[span["attrs"]["iteration"]]
        assert lo <= start <= end <= hi, span
    assert figures(run_dir)["wall_seconds"] < 2.0  # not 3 s longer
    check_run(run_dir)
    check_replay(run_dir, tmp_path / "again")


# -- the configuration and the L item --------------------------------------------------


@pytest.mark.parametrize(
    ("clock_skew", "match"),
    [
        ([0.01], r"config\.clock_skew must be an object with keys 'ahead_s' and/or 'behind_s'"),
        ({"ahead": 1}, r"config\.clock_skew must be an object"),
        ({"ahead_s": -1}, r"config\.clock_skew\.ahead_s must be a number of seconds in \[0, "),
        ({"behind_s": True}, r"config\.clock_skew\.behind_s must be a number .*got True"),
        ({"behind_s": float("nan")}, r"config\.clock_skew\.behind_s .*got nan"),
    ],
)
def test_a_bad_clock_skew_configuration_is_refused_by_name(clock_skew: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ObserverConfig.parse({"clock_skew": clock_skew})


def test_the_clock_skew_configuration_defaults_and_parses() -> None:
    default = ObserverConfig.parse({}).clock_skew
    assert (default.ahead_ns, default.behind_ns) == (10_000_000, 1_000_000_000)
    given = ObserverConfig.parse({"clock_skew": {"ahead_s": 0.5, "behind_s": 0}}).clock_skew
    assert (given.ahead_ns, given.behind_ns) == (500_000_000, 0)


def test_from_bytes_of_a_str_names_the_type_and_the_fix() -> None:
    data = WorkerRecorder("w", clock=ManualClock()).report(memory=False).to_bytes()
    with pytest.raises(
        InvalidArgumentError,
        match=r"takes the bytes of WorkerReport\.to_bytes\(\), got str: 'a str'; .*binary mode",
    ):
        WorkerReport.from_bytes("a str")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"got list"):
        WorkerReport.from_bytes(list(data))  # type: ignore[arg-type]
    # A decodable map that is not a report names the real fix, not a missing to_dict().
    with pytest.raises(
        InvalidArgumentError,
        match=r"report is not a valid WorkerReport: report lacks field\(s\) \['worker'\]; "
        r"pass the bytes of WorkerReport\.to_bytes\(\)$",
    ):
        WorkerReport.from_bytes(msgspec.msgpack.encode({"spans": []}))
    assert WorkerReport.from_bytes(bytearray(data)) == WorkerReport.from_bytes(memoryview(data))
