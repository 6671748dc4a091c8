"""``twinkle watch`` through a terminal (a pty, its screen kept by pyte) following a
demo written by another process: in progress, killed, resumed, finished. Each stage's
screen is printed (``pytest -s`` shows it); and ``twinkle report`` of a live run. Its
view fitted to small terminals (rich consoles of a given size), and a run that ended in
error."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
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
from rich.console import Console
from rich.text import Text

from test_report import SIGTERM_ERROR, ended_in_error
from twinkle.cli import main
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.errors import ReplayError
from twinkle.report import format_report, load_report
from twinkle.report._live_view import LiveView
from twinkle.report._watch import watch
from twinkle.run import Follower
from twinkle.testing import crashed_run

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


def test_watch_of_a_finished_run_whose_log_was_emptied_fails_at_once(tmp_path: Path) -> None:
    """Its summary written, its log emptied after: no event will come. ``watch`` said
    it waited for the first, for ever; it fails at once, saying why, as ``report`` does."""
    run = ended_in_error(tmp_path)
    (run / "events.jsonl").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "watch", str(run), "--interval", "0.2"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "holds no event, yet the run wrote its summary.json: its log was emptied" in done.stderr
    assert "waiting for" not in done.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished demo of 12 iterations."""
    out = tmp_path_factory.mktemp("watch")
    config = DemoConfig(
        iterations=12, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8
    )
    run_demo(config, out_dir=out, run_id="d", autoload=False)
    return out / "d"


def _drawn(view: object, width: int, height: int) -> list[str]:
    """The lines ``view`` draws on a console of ``width`` x ``height``."""
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None).print(view)
    return out.getvalue().splitlines()


def _one(lines: list[str]) -> str:
    """The lines as one text, wrapped lines joined again."""
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize(("width", "height"), [(120, 24), (80, 24), (100, 30)])
def test_a_small_terminal_shows_the_headline_and_the_newest_rows(
    demo: Path, width: int, height: int
) -> None:
    report = load_report(demo)
    lines = _drawn(LiveView(report), width, height)
    assert len(lines) <= height - 1  # (the bottom row: where the cursor rests after)
    assert max(map(len, lines)) <= width
    text = _one(lines)
    for headline in ("What limits this run", "verdict", "steady state", "whole loop"):
        assert headline in text
    assert "peak memory" in text and f"{report['limits']['verdict']}:" in text
    rows = [int(line.split()[0]) for line in lines if line[:4].strip().isdigit()]
    total = len(report["iterations"])
    assert rows and rows == list(range(total - len(rows), total))  # the newest, in order
    older = total - len(rows)
    assert f"(the newest {len(rows)} of {total} iterations: {older} older not shown; " in text
    assert "twinkle report has all of them" in text
    table = len(next(x for x in format_report(report).splitlines() if x.startswith("iter")))
    assert f"(the table is {table} columns wide, cropped at {width}" in text
    assert any(line.endswith("\u2026") for line in lines if line.startswith("iter"))


def test_a_narrow_terminal_wraps_the_text_and_a_tall_one_shows_every_row(demo: Path) -> None:
    report = load_report(demo)
    lines = _drawn(LiveView(report), 40, 200)
    assert max(map(len, lines)) <= 40
    reason = " ".join(report["limits"]["reason"].split())
    assert f"{report['limits']['verdict']}: {reason}" in _one(lines)  # wrapped, not cut
    window = report["window"]
    assert f"{window['steady_tokens_per_s_per_device']:,.0f} tokens/s/device" in _one(lines)
    tall = _drawn(LiveView(report), 400, 70)
    rows = [int(line.split()[0]) for line in tall if line[:4].strip().isdigit()]
    assert rows == list(range(len(report["iterations"])))
    assert not any(re.match(r"\(the (newest|table)", line) for line in tall)


def test_watch_in_a_terminal_draws_the_fitted_view(demo: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, height=24, force_terminal=True, color_system=None)
    assert watch(demo, once=True, console=console) == 0
    shown = Text.from_ansi(out.getvalue()).plain
    assert "verdict" in shown and "whole loop" in shown and "older not shown" in shown


def test_the_watch_of_a_run_that_ended_in_error_shows_its_error_and_exits_1(
    tmp_path: Path,
) -> None:
    run = ended_in_error(tmp_path)

    def no_sleep(_: float) -> None:
        raise AssertionError("a finished run is not watched on")

    for terminal in (True, False):
        out = io.StringIO()
        console = Console(file=out, width=100, height=30, force_terminal=terminal)
        assert watch(run, console=console, sleep=no_sleep) == 1
        assert f"error               {SIGTERM_ERROR}" in Text.from_ansi(out.getvalue()).plain
        assert watch(run, once=True, console=console) == 1
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "watch", str(run), "--once"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and SIGTERM_ERROR in done.stdout


def test_a_watch_of_a_log_with_no_event_yet_says_it_waits(tmp_path: Path) -> None:
    """The run's log made, its first line not yet written: said once, as for a log not
    there yet, then the run followed as it comes."""
    done = ended_in_error(tmp_path / "done")
    run = tmp_path / "starting"
    run.mkdir()
    (run / "events.jsonl").write_bytes(b"")
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:  # (its first line comes after a while)
            (run / "events.jsonl").write_bytes((done / "events.jsonl").read_bytes())

    out = io.StringIO()
    console = Console(file=out, width=400, height=30, force_terminal=False)  # (a long path)
    assert watch(run, console=console, sleep=sleep, interval_s=0.5) == 1
    shown = out.getvalue()
    assert shown.count(f"waiting for {run}/events.jsonl (Ctrl-C to stop) ...") == 1
    assert SIGTERM_ERROR in shown and naps == [0.5, 0.5]


def test_one_look_at_a_stopped_run_says_it_stopped_and_not_that_it_watches_on(
    tmp_path: Path,
) -> None:
    log = crashed_run(tmp_path, "cut", 2)
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "watch", str(log.parent), "--once"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "stopped without finishing" in done.stdout
    assert "watching on" not in done.stdout


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "1e308", "3601"])
def test_an_interval_out_of_range_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    """inf or 1e308 failed with an OverflowError of time_t once the run had stopped."""
    assert main(["watch", str(tmp_path), "--interval", interval]) == 2
    err = capsys.readouterr().err
    assert f"--interval must be a number of seconds in (0, 3600], got {float(interval)}" in err


def test_a_run_removed_while_watched_is_named_as_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said 'free disk space or fix the permissions', the fix of another fault."""
    import twinkle.report._commands as commands

    gone = tmp_path / "r" / "events.jsonl"

    def removed(args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", str(gone))

    monkeypatch.setattr(commands, "watch_command", removed)
    assert main(["watch", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == (
        f"twinkle: error: No such file or directory ({str(gone)!r}): it was removed or moved "
        "while the command ran: give its new path\n"
    )
