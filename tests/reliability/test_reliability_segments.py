"""A resumed run's segments (issue 27, item 6): terminal totals are kept per segment and
calibrate that segment's counts, summed; process wall time is per segment and totalled;
``total_steps`` plans the whole run; the report marks the segments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.cli import main
from twinkle.demo.cli import format_summary
from twinkle.report import format_report, load_report
from twinkle.report._segments_text import segments_line
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG, crashed_run


def _summary(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def _segment(out: Path, lengths: list[int], terminal: dict[str, int] | None) -> None:
    with RunSession(
        out_dir=out, run_id="r", config=SCRIPTED_CONFIG, autoload=False, resume=True
    ) as run:
        first = 0 if run.resumed is None else run.resumed.next_iteration
        run.bus.iteration_started(first)
        run.bus.samples(iteration=first, phase="rollout", lengths=lengths)
        run.finish(terminal_totals=terminal)


def test_each_segment_is_calibrated_against_its_own_terminal_totals(tmp_path: Path) -> None:
    _segment(tmp_path, [10, 20], {"tokens_rollout": 31})  # its producer counted one more
    _segment(tmp_path, [5], {"tokens_rollout": 5})
    _segment(tmp_path, [7], None)  # a producer that gave no total this time
    summary = _summary(tmp_path / "r")
    # 30 + 5 + 7 counted; 31 + 5 given for the first two; final 31 + 5 + 7 (the third
    # segment's own count); the discrepancy is the first segment's, not 5 - 42
    assert summary["counts"]["tokens_rollout"] == {
        "accumulated": 42,
        "terminal": 36,
        "final": 43,
        "discrepancy": 1,
    }
    totals = [s["terminal_totals"] for s in summary["segments"]]
    assert totals == [{"tokens_rollout": 31}, {"tokens_rollout": 5}, {}]


def test_a_crashed_segment_keeps_its_counts_and_its_process_wall_is_unknown(
    tmp_path: Path,
) -> None:
    crashed_run(tmp_path, "r", 2)  # killed in iteration 1: no run_finished, no totals
    _segment(tmp_path, [5], {"tokens_rollout": 5})
    summary = _summary(tmp_path / "r")
    counts = summary["counts"]["tokens_rollout"]
    crashed = counts["accumulated"] - 5
    assert crashed > 0  # what the killed segment's events counted stays in
    assert counts == {
        "accumulated": crashed + 5,
        "terminal": 5,
        "final": crashed + 5,
        "discrepancy": 0,
    }
    first, second = summary["segments"]
    assert (first["status"], first["process_wall_seconds"], first["terminal_totals"]) == (
        "error",
        None,
        {},
    )
    assert second["process_wall_seconds"] > 0
    assert summary["process_wall_seconds"] == second["process_wall_seconds"]


@pytest.fixture(scope="module")
def demo_twice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twice")
    argv = ["demo", "--out", str(out), "--run-id", "x", "--iterations", "3", "--prompts", "2"]
    argv += ["--completions", "2", "--micro-batch", "4", "--no-progress", "--no-autoload"]
    assert main(argv) == 0
    assert main([*argv, "--iterations", "4", "--resume"]) == 0
    return out / "x"


def test_process_wall_and_planned_steps_are_per_segment_and_totalled(demo_twice: Path) -> None:
    summary = _summary(demo_twice)
    first, second = summary["segments"]
    # one optimizer step per iteration (4 samples, micro-batch 4, no accumulation)
    assert (first["total_steps"], second["total_steps"]) == (3, 3 + 4)
    assert summary["counts"]["optimizer_updates"]["final"] == 7
    lines = [orjson.loads(x) for x in (demo_twice / "metrics.jsonl").read_bytes().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 8))
    assert {line["total_steps"] for line in lines} == {7}  # the plan the run reached
    walls = [first["process_wall_seconds"], second["process_wall_seconds"]]
    assert summary["process_wall_seconds"] == pytest.approx(sum(walls), abs=1e-9)
    # the demo's own summary says its model started afresh in the second process
    assert "segments                2: each process's model started from its initial " in (
        format_summary(summary)
    )
    assert "segments" not in format_summary({**summary, "segments": [first]})
    wall = "process wall time       {:.1f} s (its 2 segments' processes added, interpreter "
    said = format_summary(summary)
    assert wall.format(summary["process_wall_seconds"]) + "start-up included)\n" in said
    killed = {**summary, "process_wall_seconds": walls[1]}  # (the first one's not known)
    killed["segments"] = [{**first, "process_wall_seconds": None}, second]
    assert wall.format(walls[1]) + "start-up included; 1 stopped without finishing: not " in (
        format_summary(killed)
    )


def test_the_report_marks_each_segment(demo_twice: Path) -> None:
    report = load_report(demo_twice)
    assert [
        (s["segment"], s["first_iteration"], s["last_iteration"]) for s in report["segments"]
    ] == [
        (0, 0, 2),
        (1, 3, 6),
    ]
    flags = {r["iteration"]: r["window_flags"] for r in report["iterations"]}
    assert flags[2] == ["drain"] and flags[3] == ["warmup"]  # each segment's ends
    text = format_report(report)
    assert "segments            0: iterations 0-2 (ok), 1: iterations 3-6 (ok)" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] == ["3"]]
    assert rows and rows[0][1] == "1" and rows[0][2] == "warm-up"  # the seg column


def test_the_trace_and_the_plots_mark_each_segment(demo_twice: Path, tmp_path: Path) -> None:
    trace = orjson.loads((demo_twice / "trace.json").read_bytes())
    markers = [e["name"] for e in trace if e.get("ph") == "i" and e.get("s") == "g"]
    assert markers == ["segment 1 resumed"]
    from twinkle.report import write_plots

    assert write_plots(load_report(demo_twice), tmp_path)  # (drawn with the segment line)


def _said(first: int | None, status: str | None) -> dict[str, Any]:
    return {"first_iteration": first, "last_iteration": None if first is None else first + 3,
            "status": status}  # fmt: skip


def test_segments_that_ran_nothing_and_ended_alike_are_said_once_with_their_count() -> None:
    said = [_said(None, "error"), _said(None, "error"), _said(0, "error"), _said(None, "error"),
            _said(None, None), _said(None, None), _said(None, None), _said(4, "ok")]  # fmt: skip
    segments = [{"segment": n, **s} for n, s in enumerate(said)]
    assert segments_line(segments) == (
        "segments            0-1: no iteration (error, 2 segments), 2: iterations 0-3 (error), "
        "3: no iteration (error), 4-6: no iteration (unfinished, 3 segments), "
        "7: iterations 4-7 (ok)"
    )


def test_a_job_restarted_into_the_same_crash_is_one_entry_of_the_report(tmp_path: Path) -> None:
    for _ in range(5):
        with RunSession(out_dir=tmp_path, run_id="r", autoload=False, resume=True) as run:
            run.finish(status="error", error="RuntimeError: no such dataset")
    text = format_report(load_report(tmp_path / "r"))
    assert "segments            0-4: no iteration (error, 5 segments)\n" in text
