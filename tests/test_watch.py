"""``twinkle watch`` through a terminal (a pty, its screen kept by pyte) following a
demo written by another process: in progress, killed, resumed, finished. Each stage's
screen is printed (``pytest -s`` shows it); and ``twinkle report`` of a live run."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyte
import pytest

from twinkle.errors import ReplayError
from twinkle.run import Follower

COLS, ROWS = 240, 70
DEMO = [sys.executable, "-m", "twinkle.cli", "demo", "--no-progress", "--engines", "1"]


class Terminal:
    """A command run on a pty of COLS x ROWS; :attr:`text` is what its screen shows."""

    def __init__(self, argv: list[str]) -> None:
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        self._master = master
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # the command exited: the pty is closed
                return
            if not data:
                return
            with self._lock:
                self.stream.feed(data)

    @property
    def text(self) -> str:
        with self._lock:
            return "\n".join(line.rstrip() for line in self.screen.display).strip()

    def wait_for(self, check: Callable[[str], bool], what: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text
            if check(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"the screen never showed {what}; it shows:\n{self.text}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        os.close(self._master)


def _stage(name: str, text: str) -> None:
    print(f"\n===== {name} =====\n{text}\n")


def _rows(text: str) -> list[str]:
    """The table's iteration rows on the screen (lines that start with a number)."""
    return [line for line in text.splitlines() if line.strip().split(" ")[0].isdigit()]


@pytest.mark.timeout(300)
def test_watch_follows_a_run_through_a_kill_a_resume_and_its_finish(tmp_path: Path) -> None:
    out, run_id = tmp_path / "runs", "watched"
    run_dir = out / run_id
    argv = [*DEMO, "--out", str(out), "--run-id", run_id]
    watch = Terminal(
        [sys.executable, "-m", "twinkle.cli", "watch", str(run_dir), "--interval", "0.3"]
    )
    first = subprocess.Popen([*argv, "--iterations", "2000"], stdout=subprocess.DEVNULL)
    try:
        # 1. In progress: its writer named, the iterations finalised so far, a verdict.
        text = watch.wait_for(
            lambda t: f"in progress (pid {first.pid} on" in t and len(_rows(t)) >= 4,
            "the run in progress with 4 iterations",
        )
        _stage("in progress", text)
        assert "What limits this run" in text and "verdict" in text
        assert "steady state" in text and "peak memory" in text
        # 2. Killed outright: the view says it stopped, and keeps watching.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        text = watch.wait_for(lambda t: "stopped without finishing" in t, "the run stopped")
        _stage("killed", text)
        assert f"pid {first.pid} on" in text and "which is gone" in text
        assert "watching on: a restart with the same run id resumes it" in text
        assert watch.proc.poll() is None
        stopped_at = len(_rows(text))
        # 3. Resumed by another process: a second segment, followed to its finish.
        second = subprocess.Popen([*argv, "--iterations", "6"], stdout=subprocess.DEVNULL)
        text = watch.wait_for(lambda t: f"(pid {second.pid} on" in t, "the resumed run")
        _stage("resumed", text)
        assert second.wait(timeout=120) == 0
        assert watch.proc.wait(timeout=60) == 0  # the run finished: the watch ends
        text = watch.text
        _stage("finished", text)
        assert f"run {run_id} (ok)" in text
        assert "seg" in text.split("\n\n")[2]  # the table shows each iteration's segment
        assert len(_rows(text)) > stopped_at
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
        watch.close()
    # What it showed last is the run's own report, to the figure.
    report = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "report", str(run_dir), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    done = json.loads(report.stdout)
    assert done["status"] == "ok" and done["live"] is None
    steady = done["window"]["steady_tokens_per_s_per_device"]
    assert f"{steady:,.0f}" in text


def test_watch_of_a_missing_run_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "watch", str(tmp_path / "nope"), "--once"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "twinkle: error:" in done.stderr and "holds no events.jsonl" in done.stderr
    log = tmp_path / "events.jsonl"  # the run's log given for its directory
    log.write_bytes(b"")
    with pytest.raises(ReplayError, match=r"is a file: give its run's directory"):
        Follower(log)


@pytest.mark.parametrize("planted", ["file", "fifo", "directory"])
def test_watch_of_what_no_wait_mends_fails_at_once(tmp_path: Path, planted: str) -> None:
    """A file given for the run, or a run whose events.jsonl is a FIFO or a directory:
    ``watch`` said it waited for the log, for ever; it fails at once, naming it."""
    run = tmp_path / "r"
    if planted == "file":
        run.write_bytes(b"hi\n")
        why = "is a file: give its run's directory"
    else:
        run.mkdir()
        log = run / "events.jsonl"
        os.mkfifo(log) if planted == "fifo" else log.mkdir()
        why = "events.jsonl' is not a regular file (" + (
            "mode p" if planted == "fifo" else "a directory"
        )
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "watch", str(run), "--interval", "0.2"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert why in done.stderr and "waiting for" not in done.stdout
