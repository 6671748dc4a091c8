"""Signals: SIGINT, SIGTERM and SIGHUP finish a run (``run_finished``, summary, complete
trace) and end the process promptly with the shell's exit status; a second signal while
the run finishes is ignored with a message; nothing is left running.

The process tests run the real ``twinkle demo`` command and a small trainer script using
``RunSession`` in subprocesses and signal them while they iterate; a plugin that sleeps
in ``twinkle_unconfigure`` (and says so in a marker file) makes the finish observable, so
the second signal lands inside it.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from reliability._scripted import scripted_run
from twinkle.cli import main
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.plugins import DISABLE_AUTOLOAD_ENV
from twinkle.run import RunSession, SignalInterrupt, finish_on_signals

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
EXIT_WITHIN_S = 1.0
FINISH_SLEEP_S = 1.5


def wait_for(what: str, predicate: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def iterations_logged(log: Path) -> int:
    try:
        return log.read_bytes().count(b'"type":"iteration_started"')
    except FileNotFoundError:
        return 0


def env(path: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment, plugin autoload on, ``path`` first on the module path."""
    e = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    if path is not None:
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), e.get("PYTHONPATH")]))
    return {**e, **extra}


def demo(out: Path, *more: str, environ: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "twinkle.cli", "demo", "--iterations", "5000"]
    argv += ["--prompts", "2", "--completions", "2", "--micro-batch", "4", "--grad-accum", "1"]
    argv += ["--no-progress", "--out", str(out), "--run-id", "r", *more]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environ or env()
    )


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def check_finished_run(run_dir: Path, signame: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "error"
    assert signame in summary["error"], summary["error"]
    trace = json.loads((run_dir / "trace.json").read_text())  # complete: it parses
    assert trace, "the trace holds the run's spans"
    finished, closed = map(json.loads, (run_dir / "events.jsonl").read_bytes().splitlines()[-2:])
    assert finished["type"] == "run_finished" and signame in finished["error"]
    assert closed["type"] == "backends_closed"  # (the log's last event)
    return summary


def interrupted_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("twinkle:")]


# -- the demo command ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_demo_signalled_while_iterating_finishes_the_run_and_exits_promptly(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = demo(tmp_path, "--no-autoload")
    log = tmp_path / "r" / "events.jsonl"
    wait_for("three iterations", lambda: iterations_logged(log) >= 3, proc)
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err_bytes = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    err = err_bytes.decode()
    assert proc.returncode == 128 + sig, err
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after {sig.name}"
    assert "Traceback" not in err, err
    assert interrupted_lines(err) == [
        f"twinkle: interrupted by {sig.name}: the run finished as an error; its summary and "
        f"trace are in {tmp_path / 'r'}/"
    ], err
    check_finished_run(tmp_path / "r", sig.name)
    assert alive(children) == []


def test_demo_signalled_after_its_run_finished_says_the_run_had_finished(tmp_path: Path) -> None:
    """A signal while the table is printed (stdout is a full 4 KiB pipe nobody reads
    yet) finds the run finished ok, and says so."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    argv = [sys.executable, "-m", "twinkle.cli", "demo", "--iterations", "80"]
    argv += ["--prompts", "2", "--completions", "2", "--micro-batch", "4", "--grad-accum", "1"]
    argv += ["--no-progress", "--no-autoload", "--out", str(tmp_path), "--run-id", "r"]
    proc = subprocess.Popen(argv, stdout=write_end, stderr=subprocess.PIPE, env=env())
    os.close(write_end)
    summary = tmp_path / "r" / "summary.json"
    wait_for("the summary", summary.exists, proc)
    time.sleep(0.2)  # it is blocked printing the table
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    with os.fdopen(read_end, "rb") as out:
        printed = out.read()
    _, err_bytes = proc.communicate(timeout=30)
    err = err_bytes.decode()
    assert proc.returncode == 143, err
    assert interrupted_lines(err) == [
        f"twinkle: interrupted by SIGTERM: the run had finished (ok); its files are in "
        f"{tmp_path / 'r'}/"
    ], err
    assert "Traceback" not in err and printed.startswith(b"run r (ok): ")
    assert json.loads(summary.read_text())["status"] == "ok"


@pytest.fixture
def slow_finish_dist(tmp_path: Path) -> Path:
    """A distribution whose observer ``slowfinish`` marks, then sleeps through, its
    ``twinkle_unconfigure``: the run's finish lasts long enough to signal into it."""
    root = tmp_path / "dist"
    (root / "twinkle_slowfinish").mkdir(parents=True)
    (root / "twinkle_slowfinish" / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import os, time
            from twinkle.hookspecs import hookimpl

            class SlowFinish:
                @hookimpl
                def twinkle_unconfigure(self, context):
                    with open(os.environ["SLOW_FINISH_MARKER"], "w") as f:
                        f.write("finishing")
                    time.sleep({FINISH_SLEEP_S})
            """
        )
    )
    info = root / "twinkle_slowfinish-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: twinkle-slowfinish\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[twinkle.observers]\nslowfinish = twinkle_slowfinish:SlowFinish\n"
    )
    return root


def test_second_ctrl_c_while_the_demo_finishes_is_ignored_and_the_finish_completes(
    tmp_path: Path, slow_finish_dist: Path
) -> None:
    marker = tmp_path / "finishing"
    out = tmp_path / "runs"
    proc = demo(out, environ=env(slow_finish_dist, SLOW_FINISH_MARKER=str(marker)))
    log = out / "r" / "events.jsonl"
    wait_for("three iterations", lambda: iterations_logged(log) >= 3, proc)
    proc.send_signal(signal.SIGINT)
    wait_for("the finish", marker.exists, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err_bytes = proc.communicate(timeout=60)
    err = err_bytes.decode()
    assert proc.returncode == 130, err  # not -6 (SIGABRT), not -2
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    ignored = [line for line in err.splitlines() if "SIGINT again, ignored" in line]
    assert len(ignored) == 2, err
    assert ignored[0].startswith("twinkle: SIGINT again, ignored: the run is finishing"), err
    assert "twinkle: interrupted by SIGINT: the run finished as an error; its summary and " in err
    summary = check_finished_run(out / "r", "SIGINT")
    # The first SIGINT may land inside an observer's hook on the main thread: that hook is
    # counted (its state may be half made) and says so; no other failure is.
    interrupted = {
        name: 1
        for name in summary["observer_failures"]
        if f"observer {name!r} was interrupted" in err
    }
    assert summary["observer_failures"] == interrupted, err
    assert len(interrupted) <= 1, err


# -- a trainer of one's own ---------------------------------------------------------------

TRAINER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from twinkle.hookspecs import hookimpl
    from twinkle.run import RunSession, SignalInterrupt, finish_on_signals

    out, marker = Path(sys.argv[1]), Path(sys.argv[2])

    class SlowFinish:
        @hookimpl
        def twinkle_unconfigure(self, context):
            marker.write_text("finishing")
            time.sleep(%(sleep)r)

    try:
        with finish_on_signals(), RunSession(
            out_dir=out, run_id="mine", autoload=False, plugins=[("slow", SlowFinish())]
        ) as run:
            # an inference engine of the trainer's own, stopped by its with block
            with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as engine:
                try:
                    for it in range(10**9):
                        run.bus.iteration_started(it)
                        with run.recorder.span("train.step", iteration=it):
                            time.sleep(0.005)
                        run.bus.samples(iteration=it, phase="train", lengths=[3, 4])
                        print(it, engine.pid, flush=True)
                finally:
                    engine.kill()
    except SignalInterrupt as exc:
        print(f"stopped by {exc.signal_name}", file=sys.stderr)
        sys.exit(exc.exit_code)
    """
) % {"sleep": FINISH_SLEEP_S}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_trainer_script_with_finish_on_signals_finishes_its_run_and_stops_its_engine(
    tmp_path: Path, sig: signal.Signals
) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    marker = tmp_path / "finishing"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    assert proc.stdout is not None
    engine_pid = int(proc.stdout.readline().split()[1])
    for _ in range(20):  # let it iterate
        proc.stdout.readline()
    assert alive([engine_pid]) == [engine_pid]
    proc.send_signal(sig)
    wait_for("the finish", marker.exists, proc)
    proc.send_signal(sig)  # again, inside the finish
    _, err_bytes = proc.communicate(timeout=60)
    err = err_bytes.decode()
    assert proc.returncode == 128 + sig, err
    assert f"twinkle: {sig.name} again, ignored" in err, err
    assert err.rstrip().endswith(f"stopped by {sig.name}"), err
    assert "Traceback" not in err, err
    check_finished_run(tmp_path / "mine", sig.name)
    assert alive([engine_pid]) == []


def test_without_finish_on_signals_sigterm_loses_the_summary(tmp_path: Path) -> None:
    """The reason for finish_on_signals: Python's default for SIGTERM ends the process
    on the spot, with no summary."""
    script = tmp_path / "bare.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from twinkle.run import RunSession
            with RunSession(out_dir=sys.argv[1], run_id="bare", autoload=False) as run:
                for it in range(10**9):
                    run.bus.iteration_started(it)
                    print(it, flush=True)
                    time.sleep(0.005)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, env=env()
    )
    assert proc.stdout is not None
    for _ in range(10):
        proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert not (tmp_path / "bare" / "summary.json").exists()


# -- replay ------------------------------------------------------------------------------


@pytest.fixture
def ctrl_c_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed observer ``ctrl_c`` that presses Ctrl-C at the 5th event (a SIGINT
    to the main thread, waiting for the hook on the plugin's thread)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "twinkle_ctrl_c.py").write_text(
        "from twinkle.hookspecs import hookimpl\n"
        "from twinkle.testing import press_ctrl_c\n\n"
        "class CtrlC:\n"
        "    def __init__(self):\n"
        "        self.seen = 0\n\n"
        "    @hookimpl\n"
        "    def twinkle_event(self, event):\n"
        "        self.seen += 1\n"
        "        if self.seen == 5:\n"
        "            press_ctrl_c()\n"
    )
    info = site / "twinkle_ctrl_c-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twinkle-ctrl-c\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[twinkle.observers]\nctrl_c = twinkle_ctrl_c:CtrlC\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    importlib.invalidate_caches()
    return site


def test_interrupted_cli_replay_says_so_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ctrl_c_plugin: Path
) -> None:
    log = scripted_run(tmp_path / "live", run_id="replayed")
    out = tmp_path / "out"
    assert main(["replay", str(log), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err == (
        f"twinkle: interrupted by SIGINT: the replay stopped; --out {str(out)!r} was left "
        "as it was\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live", "site"]
    assert main(["replay", str(log), "--out", str(out), "--block", "ctrl_c"]) == 0


@pytest.mark.parametrize("command", ["report", "watch", "whatif"])
def test_ctrl_c_in_a_command_that_writes_no_run_says_so_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """Before, report, watch and whatif asked the demo's arguments where the run was:
    an AttributeError's traceback, exit 1."""

    def ctrl_c(args: Any, *rest: Any) -> int:
        raise KeyboardInterrupt

    import twinkle.report._commands as commands
    import twinkle.whatif._cli as whatif_cli

    monkeypatch.setattr(commands, "report_command", ctrl_c)
    monkeypatch.setattr(commands, "watch_command", ctrl_c)
    monkeypatch.setattr(whatif_cli, "whatif_command", ctrl_c)
    assert main([command, str(tmp_path)]) == 130
    assert capsys.readouterr().err == f"twinkle: interrupted by SIGINT: the {command} stopped\n"


# -- the context manager, in this process -------------------------------------------------


@pytest.fixture
def default_handlers() -> Iterator[None]:
    """Every signal under test starts at its default handler and is put back after."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def raise_signal_and_wait(sig: int) -> None:
    signal.raise_signal(sig)  # the handler runs in this (main) thread before it returns
    raise AssertionError(f"{signal.Signals(sig).name} did not interrupt")


@pytest.mark.usefixtures("default_handlers")
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_signal_raises_signal_interrupt_once_then_handlers_are_restored(sig: int) -> None:
    with finish_on_signals() as guard:
        assert set(guard.handled) == set(SIGNALS)
        with pytest.raises(SignalInterrupt) as info:
            raise_signal_and_wait(sig)
    assert isinstance(info.value, KeyboardInterrupt)
    assert info.value.signum == sig and info.value.exit_code == 128 + sig
    assert guard.received == sig
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


@pytest.mark.usefixtures("default_handlers")
def test_later_signals_are_ignored_with_a_message_until_the_block_exits(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with finish_on_signals() as guard:
        with pytest.raises(SignalInterrupt):
            raise_signal_and_wait(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # ignored: no exception
        signal.raise_signal(signal.SIGTERM)
    assert guard.ignored == 2
    err = capfd.readouterr().err
    assert "twinkle: SIGINT again, ignored: the run is finishing" in err
    assert f"kill -9 {os.getpid()} abandons it" in err
    assert err.count("again, ignored") == 2


@pytest.mark.usefixtures("default_handlers")
def test_a_run_unwound_by_sigterm_is_finished_with_the_signal_named(tmp_path: Path) -> None:
    with pytest.raises(SignalInterrupt), finish_on_signals():
        with RunSession(out_dir=tmp_path, run_id="r", autoload=False) as run:
            run.bus.iteration_started(0)
            raise_signal_and_wait(signal.SIGTERM)
    assert run.summary is not None and run.summary["status"] == "error"
    assert run.summary["error"] == (
        "SignalInterrupt: SIGTERM (signal 15): the process was asked to stop"
    )
    check_finished_run(tmp_path / "r", "SIGTERM")


@pytest.mark.usefixtures("default_handlers")
def test_handlers_of_ones_own_and_ignored_signals_are_left_alone() -> None:
    seen: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        seen.append(signum)

    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    with finish_on_signals() as guard:
        assert guard.handled == (signal.SIGINT,)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


@pytest.mark.usefixtures("default_handlers")
def test_a_handler_installed_inside_the_block_is_kept() -> None:
    def mine(signum: int, frame: Any) -> None: ...

    with finish_on_signals(signals=[signal.SIGTERM]) as guard:
        assert guard.handled == (signal.SIGTERM,)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not asked
        signal.signal(signal.SIGTERM, mine)
    assert signal.getsignal(signal.SIGTERM) is mine


def test_finish_on_signals_off_the_main_thread_is_refused() -> None:
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with finish_on_signals():
                pass
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=enter)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], TwinkleError)
    assert "must be entered in the main thread" in str(errors[0])


@pytest.mark.parametrize(
    ("signals", "match"),
    [
        ([signal.SIGKILL], r"SIGKILL cannot be caught"),
        ([signal.SIGTERM, "SIGHUP"], r"'SIGHUP' is not a signal number"),
        ([10_000], r"10000 is not a signal number"),
        (signal.SIGTERM, r"signals must be an iterable of signal numbers, got <Signals\.SIGTERM"),
    ],
)
def test_bad_signals_are_refused_naming_them(signals: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        finish_on_signals(signals=signals)


@pytest.mark.usefixtures("default_handlers")
def test_demo_command_in_process_joins_every_thread_after_sigterm(tmp_path: Path) -> None:
    """The command's own unwinding (not the process exit) stops the driver's, engines'
    and writers' threads."""
    before = set(threading.enumerate())
    log = tmp_path / "r" / "events.jsonl"

    def signal_when_iterating() -> None:
        deadline = time.monotonic() + 60
        while iterations_logged(log) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:  # the command's guard is in
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=signal_when_iterating)
    sender.start()
    argv = ["demo", "--iterations", "5000", "--prompts", "2", "--completions", "2"]
    argv += ["--micro-batch", "4", "--grad-accum", "1", "--no-progress", "--no-autoload"]
    rc = main([*argv, "--out", str(tmp_path), "--run-id", "r"])
    sender.join()
    assert rc == 143
    assert set(threading.enumerate()) == before
    check_finished_run(tmp_path / "r", "SIGTERM")


class _DropsTheInterrupt:
    """Its ``__del__`` takes the signal: Python prints what it raises and drops it."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.usefixtures("default_handlers")
def test_a_signal_dropped_in_a_del_is_sent_again_and_raises_in_the_code(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The first SIGTERM's handler ran inside a ``__del__`` (as inside a WeakSet's
    callback in a training loop): its SignalInterrupt was dropped, ``received`` was set,
    and every later SIGTERM was ignored as 'the run is finishing' while it trained on.
    Now it is sent again and raises in the loop."""
    hook = sys.unraisablehook
    with finish_on_signals() as guard:
        with pytest.raises(SignalInterrupt) as info:
            _DropsTheInterrupt()  # (dropped at once: no reference kept)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the training loop
                time.sleep(0.001)
        assert info.value.signum == signal.SIGTERM and guard.received == signal.SIGTERM
        assert guard.ignored == 0
    assert sys.unraisablehook is hook  # (the one it wrapped is put back)
    assert "SIGTERM arrived where Python drops exceptions" in capfd.readouterr().err
