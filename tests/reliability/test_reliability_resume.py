"""Resume: a second session on a run directory that holds the run's log — what a
restarted job does — appends a segment that replay understands, and every output
covers every segment."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from reliability._scripted import CONFIG, killed_when_ready, segment
from twinkle.errors import ConfigError, RecordError, TwinkleError
from twinkle.events import OptimizerStep
from twinkle.hookspecs import hookimpl
from twinkle.reporting import read_jsonl
from twinkle.run import RunSession, replay
from twinkle.testing import CtrlCWhileResuming, press_ctrl_c, scripted_run

DERIVED = ("metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def assert_replay_identical(run_dir: Path, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "replayed"
    result = replay(run_dir / "events.jsonl", out)
    for name in (*DERIVED, "events.jsonl"):
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name
    return result.summary


def test_a_restarted_run_appends_a_segment_every_output_covers(tmp_path: Path) -> None:
    segment(tmp_path, iterations=2, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    one = orjson.loads((run_dir / "summary.json").read_bytes())
    # The restart comes an hour later, in a new process with its own clock.
    second = segment(tmp_path, iterations=3, wall_offset_ns=3600 * 10**9)
    assert second.resumed is not None
    assert (second.resumed.segment, second.resumed.last_iteration) == (1, 1)
    assert second.resumed.previous_status == "ok"

    events = lines(run_dir / "events.jsonl")
    kinds = [e["type"] for e in events]
    assert kinds.count("run_started") == 1 and kinds.count("run_resumed") == 1
    assert kinds.count("run_finished") == 2
    # a segment ends with run_finished, then what its backends did; the next one begins
    assert kinds.index("run_resumed") == kinds.index("run_finished") + 2
    assert kinds[kinds.index("run_finished") + 1] == "backends_closed"
    assert [e["seq"] for e in events] == list(range(len(events)))  # seq continues

    records = lines(run_dir / "metrics_raw.jsonl")
    assert [r["seq"] for r in records] == list(range(len(records)))
    timing = [r for r in records if r["kind"] == "timing" and r["scope"] == "iteration"]
    assert [r["iteration"] for r in timing] == [0, 1, 2, 3, 4]
    webui = lines(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in webui] == [0, 1, 2, 3, 4]  # no step repeated
    assert len({r["step"] for r in webui}) == len(webui)

    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["status"] == "ok"
    assert [s["segment"] for s in summary["segments"]] == [0, 1]
    assert summary["iterations"] == 5 and summary["counts"]["samples_rollout"]["accumulated"] == 10
    # The hour between the segments is in no window: the run's wall is its segments'.
    seconds = summary["seconds"]
    assert seconds["wall_seconds"] == pytest.approx(
        one["seconds"]["wall_seconds"] * 5 / 2, rel=0.01
    )
    assert seconds["wall_seconds"] < 1.0
    trace = orjson.loads((run_dir / "trace.json").read_bytes())
    spans = [e for e in trace if e.get("ph") == "X" and e.get("cat") == "main"]
    assert len(spans) == 10 and max(e["ts"] for e in spans) > 3600 * 1e6  # both segments
    assert_replay_identical(run_dir, tmp_path)  # summary.json too, byte for byte


def test_a_crashed_segment_is_closed_as_an_error_and_the_run_goes_on(tmp_path: Path) -> None:
    """The first process is killed outright (SIGKILL) mid-run; the restart closes its
    segment with an error status and continues after its last iteration."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from twinkle.run import RunSession
        with RunSession(out_dir={str(tmp_path)!r}, run_id="r", autoload=False) as run:
            for i in range(1000):
                run.bus.iteration_started(i)
                with run.recorder.span("generate", iteration=i):
                    time.sleep(0.001)
                run.bus.samples(iteration=i, phase="rollout", lengths=[5])
                if i == 3:
                    print("ready", flush=True)
        """
    )
    pid = killed_when_ready(script)
    run_dir = tmp_path / "r"
    assert not (run_dir / "summary.json").exists()
    # The dead process's lock is reclaimed; the run resumes after its last iteration.
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False, resume=True) as run:
        assert run.resumed is not None and run.resumed.previous_status is None
        start = run.resumed.next_iteration
        assert start >= 4
        run.bus.iteration_started(start)
        run.bus.samples(iteration=start, phase="rollout", lengths=[5])
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    first, second = summary["segments"]
    assert first["status"] == "error" and "stopped without finishing" in first["error"]
    assert first["pid"] == pid and second["pid"] == os.getpid()
    assert summary["status"] == "ok"
    logged = [e for e in lines(run_dir / "events.jsonl") if e["type"] == "samples"]
    assert summary["counts"]["samples_rollout"]["accumulated"] == len(logged) >= start
    assert_replay_identical(run_dir, tmp_path)  # summary.json too, byte for byte


def test_a_failed_segment_keeps_its_status_in_the_summary(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        segment(tmp_path, iterations=1, wall_offset_ns=0, fail=True)
    segment(tmp_path, iterations=1, wall_offset_ns=10**9)
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert [s["status"] for s in summary["segments"]] == ["error", "ok"]
    assert "the trainer broke" in summary["segments"][0]["error"]


def test_resuming_with_another_configuration_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    segment(tmp_path, iterations=2, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    other = {**CONFIG, "phases": {**CONFIG["phases"], "train": ["train.fwd"]}}
    session = RunSession(out_dir=tmp_path, run_id="r", config=other, autoload=False, resume=True)
    with pytest.raises(ConfigError, match=r"cannot resume with this configuration.*\['phases'\]"):
        session.start()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    segment(tmp_path, iterations=1, wall_offset_ns=10**9)  # the lock was given back


def test_a_resumed_run_that_repeats_an_iteration_is_refused(tmp_path: Path) -> None:
    segment(tmp_path, iterations=2, wall_offset_ns=0)
    with (
        RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False, resume=True) as run,
        pytest.raises(RecordError, match=r"iteration_started 0 goes backwards.*next is 2 or more"),
    ):
        run.bus.iteration_started(0)


def test_a_log_of_another_run_is_not_resumed(tmp_path: Path) -> None:
    segment(tmp_path, iterations=1, wall_offset_ns=0)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "events.jsonl").write_bytes((tmp_path / "r" / "events.jsonl").read_bytes())
    with pytest.raises(ConfigError, match=r"not the log of run 's'.*run 'r'"):
        RunSession(out_dir=tmp_path, run_id="s", autoload=False).start()


def test_replay_refuses_a_second_run_started(tmp_path: Path) -> None:
    """Two logs concatenated are not a resumed run: the second run_started is named."""
    segment(tmp_path, iterations=1, wall_offset_ns=0)
    log = (tmp_path / "r" / "events.jsonl").read_bytes()
    events = [orjson.loads(line) for line in log.splitlines()]
    for e in events:
        e.pop("seq", None)
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events * 2))
    with pytest.raises(Exception, match=r"run_started starts run 'r' a second time"):
        replay(doubled, tmp_path / "out")


class Echo:
    """Publishes a scalar on the run's bus at every optimizer step (an observer that
    publishes from its hooks)."""

    def __init__(self) -> None:
        self.bus: Any = None

    @hookimpl
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        if self.bus is not None:
            self.bus.scalars(iteration=event.iteration, name="echo", values={"step": event.step})


def echo_segment(out: Path, iterations: int) -> RunSession:
    echo = Echo()
    session = RunSession(
        out_dir=out,
        run_id="r",
        config=CONFIG,
        autoload=False,
        plugins=[("echo", echo)],
        resume=True,
    )
    echo.bus = session.bus
    with session as run:
        first = 0 if run.resumed is None else run.resumed.next_iteration
        steps = 0 if run.resumed is None else run.resumed.optimizer_steps
        for i in range(first, first + iterations):
            run.bus.iteration_started(i)
            run.bus.optimizer_step(iteration=i, step=steps + 1)
            steps += 1
    return session


def test_what_observers_publish_while_a_run_resumes_is_not_logged_twice(tmp_path: Path) -> None:
    echo_segment(tmp_path, 2)
    echo_segment(tmp_path, 2)
    run_dir = tmp_path / "r"
    events = lines(run_dir / "events.jsonl")
    echoes = [e["values"] for e in events if e["type"] == "scalars"]
    assert echoes == [{"step": 1}, {"step": 2}, {"step": 3}, {"step": 4}]  # once each
    assert [e["type"] for e in events].count("run_finished") == 2
    scalars = [r for r in lines(run_dir / "metrics_raw.jsonl") if r["kind"] == "echo"]
    assert [r["values"]["step"] for r in scalars] == [1, 2, 3, 4]
    assert_replay_identical(run_dir, tmp_path)
    echo_segment(tmp_path, 1)  # and the run resumes again


class Interrupts:
    """Ctrl-C while the logged events are fed again (the third optimizer step)."""

    def __init__(self) -> None:
        self.steps = 0

    @hookimpl
    def twinkle_optimizer_step(self, event: OptimizerStep) -> None:
        self.steps += 1
        if self.steps == 3:
            press_ctrl_c()


def test_a_resume_that_fails_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    segment(tmp_path, iterations=4, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    session = RunSession(
        out_dir=tmp_path,
        run_id="r",
        config=CONFIG,
        autoload=False,
        plugins=[("interrupts", Interrupts())],
        resume=True,
    )
    with pytest.raises(KeyboardInterrupt):
        session.start()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    segment(tmp_path, iterations=1, wall_offset_ns=10**9)  # a later restart resumes it
    assert_replay_identical(run_dir, tmp_path)


def test_a_torn_last_line_is_said_once_by_the_resume_that_moves_it_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash's torn last line: the resume reads the log past it without a word (twice:
    its scan and its feed), and its event log moves it to ``events.jsonl.torn``, saying
    so once; the run goes on."""
    scripted_run(tmp_path, "r", 2, autoload=False)
    with (tmp_path / "r" / "events.jsonl").open("ab") as log:
        log.write(b'{"type": "spa')
    with caplog.at_level("WARNING"):
        scripted_run(tmp_path, "r", 1, autoload=False)
    said = [r.getMessage() for r in caplog.records if "events.jsonl" in r.getMessage()]
    assert len(said) == 1 and "moved 13 byte(s)" in said[0], said
    assert (tmp_path / "r" / "events.jsonl.torn").is_file()


def test_a_log_starting_with_a_blank_line_resumes(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "events.jsonl").write_bytes(b"\n")  # what a reader passes over
    segment(tmp_path, iterations=1, wall_offset_ns=0)
    again = segment(tmp_path, iterations=1, wall_offset_ns=10**9)
    assert again.resumed is not None and again.resumed.last_iteration == 0


def test_a_resume_interrupted_after_an_earlier_resume_went_by_again_changes_nothing(
    tmp_path: Path,
) -> None:
    """The re-fed ``run_resumed`` of segment 1 is not the new segment's: the rebuilt
    files stay aside until the new segment (3) begins."""
    for first in (0, 2, 4):  # segments 0, 1, 2
        scripted_run(tmp_path, "r", 2, first_iteration=first, autoload=False)
    run_dir = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        scripted_run(
            tmp_path,
            "r",
            1,
            first_iteration=6,
            autoload=False,
            plugins=[("ctrl_c", CtrlCWhileResuming())],
        )
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    log = scripted_run(tmp_path, "r", 1, first_iteration=6, autoload=False)  # resumes
    records = list(read_jsonl(log.parent / "metrics_raw.jsonl"))
    assert sorted({r["iteration"] for r in records if r["kind"] == "grpo"}) == list(range(7))


def test_a_summary_that_is_a_directory_stops_the_resume_before_it_writes(tmp_path: Path) -> None:
    """The resume removes the run's summary (it vouched for the segments before): a
    directory in its place is named before a line is logged, so the log stays as the
    failed segment left it, and the resume goes on once it is moved away."""
    with pytest.raises(RuntimeError):
        segment(tmp_path, iterations=2, fail=True)
    run = tmp_path / "r"
    (run / "summary.json").unlink()
    (run / "summary.json").mkdir()
    logged = (run / "events.jsonl").read_bytes()
    with pytest.raises(TwinkleError, match=r"summary\.json' is a directory, where the run writes"):
        segment(tmp_path, iterations=1)
    assert (run / "events.jsonl").read_bytes() == logged
    (run / "summary.json").rmdir()
    resumed = segment(tmp_path, iterations=1).resumed
    assert resumed is not None and resumed.segment == 1
