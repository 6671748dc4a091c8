"""One live writer per run directory (a lock owned by a pid; a dead owner's reclaimed),
and a forked child never finishes or writes its parent's run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from twinkle.errors import ReporterError, RunDirInUseError, TwinkleError
from twinkle.hookspecs import hookimpl
from twinkle.locks import RUN_LOCK_FILE
from twinkle.run import RunSession


def holder(out: Path, run_id: str = "r") -> subprocess.Popen[str]:
    """A process that starts run ``run_id`` and keeps it open until its stdin closes."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from twinkle.run import RunSession
        with RunSession(out_dir={str(out)!r}, run_id={run_id!r}, autoload=False) as run:
            run.bus.iteration_started(0)
            log = Path({str(out)!r}) / {run_id!r} / "events.jsonl"
            while log.read_bytes().count(b"\\n") < 2:  # on disk (the writer's thread)
                time.sleep(0.01)
            print("ready", flush=True)
            sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_second_process_on_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    child = holder(tmp_path)
    try:
        log = tmp_path / "r" / "events.jsonl"
        before = log.read_bytes()
        session = RunSession(out_dir=tmp_path, run_id="r", autoload=False)
        with pytest.raises(RunDirInUseError, match=rf"in use by pid {child.pid} .*run 'r'"):
            session.start()
        assert log.read_bytes() == before  # the refused session wrote nothing
        with pytest.raises(TwinkleError, match="not started"):
            session.bus.iteration_started(1)
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        try:
            assert child.wait(30) == 0
        finally:
            child.stdout.close()
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert summary["status"] == "ok" and len(summary["segments"]) == 1


def test_a_second_session_in_the_same_process_is_refused(tmp_path: Path) -> None:
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False):
        with pytest.raises(RunDirInUseError, match=rf"in use by pid {os.getpid()}"):
            RunSession(out_dir=tmp_path, run_id="r", autoload=False).start()
    # Given back at the finish: the next session resumes the run (asked to: it was ok).
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False, resume=True) as again:
        assert again.resumed is not None


def test_a_dead_owners_lock_is_reclaimed(tmp_path: Path) -> None:
    child = holder(tmp_path)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert child.stdin is not None and child.stdout is not None
    child.stdin.close()
    child.stdout.close()
    lock = orjson.loads((tmp_path / "r" / RUN_LOCK_FILE).read_bytes())
    assert lock["pid"] == child.pid  # the stale record stays until the next owner
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False) as run:
        assert orjson.loads((tmp_path / "r" / RUN_LOCK_FILE).read_bytes())["pid"] == os.getpid()
        assert run.resumed is not None and run.resumed.previous_status is None
    assert not (tmp_path / "r" / RUN_LOCK_FILE).exists()  # given back, the file with it


def test_two_demos_on_one_run_id_do_not_interleave(tmp_path: Path) -> None:
    """Two `twinkle demo` processes on one run id: one runs, the other is refused with
    a clear error and a non-zero exit, and the run's files stay valid."""
    args = [sys.executable, "-m", "twinkle.cli", "demo", "--out", str(tmp_path)]
    args += ["--run-id", "same", "--iterations", "40"]  # (still running when the second asks)
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "same" / "events.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert second.returncode != 0
    assert "in use by pid" in second.stderr and "Traceback" not in second.stderr
    run_dir = tmp_path / "same"
    events = [orjson.loads(x) for x in (run_dir / "events.jsonl").read_bytes().splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events].count("run_started") == 1
    orjson.loads((run_dir / "trace.json").read_bytes())  # valid JSON
    assert orjson.loads((run_dir / "summary.json").read_bytes())["status"] == "ok"


FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from twinkle.errors import TwinkleError
    from twinkle.run import RunSession

    out = sys.argv[1]
    read, write = os.pipe()
    run = RunSession(out_dir=out, run_id="r", autoload=False).start()
    run.bus.iteration_started(0)
    with run:
        pid = os.fork()
        if pid == 0:  # the child: tries the parent's run, then leaves by sys.exit
            os.close(read)
            said = []
            for attempt in (lambda: run.bus.iteration_started(1), run.finish):
                try:
                    attempt()
                    said.append("done")
                except TwinkleError as exc:
                    said.append(str(exc))
            os.write(write, "\\n".join(said).encode())
            os.close(write)
            sys.exit(0)  # runs __exit__ and atexit in the child: both leave the run be
        os.close(write)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("child", "hung" if done[0] != pid else os.waitstatus_to_exitcode(done[1]))
        with os.fdopen(read) as f:
            print(f.read())
        run.bus.iteration_started(1)  # the parent's run goes on
    """
)


def test_a_forked_child_never_finishes_or_writes_the_parents_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("child 0\n"), done.stdout  # exited, did not hang
    publish, finish = done.stdout.splitlines()[1:3]
    assert "run 'r' belongs to process" in publish and "forked child" in publish
    assert "cannot finish run 'r' in process" in finish
    log = (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()
    events = [orjson.loads(x) for x in log]
    kinds = [e["type"] for e in events]
    assert kinds.count("run_finished") == 1 and kinds[-2:] == ["run_finished", "backends_closed"]
    assert [e["iteration"] for e in events if e["type"] == "iteration_started"] == [0, 1]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert orjson.loads((tmp_path / "r" / "summary.json").read_bytes())["status"] == "ok"


class BackendFails:
    @hookimpl
    def twinkle_make_backends(self, context: object) -> None:
        raise ReporterError("cannot open the backend's file /nowhere/x: fix the path")


def test_a_failed_start_leaves_no_run_directory_behind(tmp_path: Path) -> None:
    session = RunSession(
        out_dir=tmp_path,
        run_id="r",
        autoload=False,
        plugins=[("fails", BackendFails())],
        required_plugins=["fails"],  # (else it is left out and the run goes on)
    )
    with pytest.raises(ReporterError, match="cannot open the backend's file"):
        session.start()
    assert not (tmp_path / "r").exists()  # made by the start, nothing of a run in it
    # A directory that was there before is kept.
    (tmp_path / "kept").mkdir()
    with pytest.raises(RunDirInUseError):
        with RunSession(out_dir=tmp_path, run_id="kept", autoload=False):
            RunSession(out_dir=tmp_path, run_id="kept", autoload=False).start()
    assert (tmp_path / "kept").is_dir()


def test_an_event_log_that_is_not_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "r" / "events.jsonl").mkdir(parents=True)
    with pytest.raises(ReporterError, match=r"events\.jsonl' is not a file"):
        RunSession(out_dir=tmp_path, run_id="r", autoload=False).start()
