"""Helpers for testing observers and plugins against a real run.

:func:`scripted_run` records a small, deterministic run (a manual clock, every event
type) through a real :class:`~twinkle.run.RunSession`: what a plugin's tests need to
check what their plugin wrote against the records the run wrote beside it::

    from twinkle.testing import scripted_run

    def test_my_sink_writes_every_record(tmp_path):
        log = scripted_run(tmp_path, plugins=[("my_sink", MySink())])
        ...  # compare log.parent / "metrics_raw.jsonl" with what MySink wrote
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from twinkle.hookspecs import RunContext, hookimpl
from twinkle.perf import ManualClock
from twinkle.run import RunSession
from twinkle.threads import wait_for_caller

__all__ = [
    "SCRIPTED_CONFIG",
    "CtrlCWhileResuming",
    "crashed_run",
    "handle_stop_signals",
    "press_ctrl_c",
    "scripted_run",
    "shared_writable",
    "signal_main",
    "umask",
]

#: the observers' configuration of :func:`scripted_run`: two phases, throughput per
#: phase on one device, the window over the rollout tokens on two
SCRIPTED_CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 2},
    "total_steps": 4,
}

#: the exit status of :func:`crashed_run`'s child, killed in its last iteration
_CRASH_STATUS = 113
#: the wall clock of :func:`scripted_run` at its manual clock's zero (unix ns)
_WALL_ZERO_NS = 1_700_000_000_000_000_000


def scripted_run(
    out_dir: str | os.PathLike[str],
    run_id: str = "cut",
    iterations: int = 4,
    *,
    first_iteration: int | None = None,
    _crash_in: int | None = None,
    **session_options: Any,
) -> Path:
    """Record ``iterations`` scripted iterations of run ``run_id`` into ``out_dir`` and
    return its event log (``out_dir/<run_id>/events.jsonl``).

    Each iteration has a generation span, rollout samples, a training span, training
    samples, one optimizer step, a memory reading, a ``grpo`` scalar, a weight publish
    acknowledged by engine ``e0`` and a snapshot, on a manual clock (every time figure
    is the same from call to call, the observers dispatched on the publishing thread:
    a dispatch thread's spans of its own time would read the clock while this loop
    moves it; the memory reading is this process's). A second
    call with the same ``out_dir`` and ``run_id`` resumes the run (``resume=True`` unless
    ``session_options`` say otherwise), from the iteration after the last one its log
    holds unless ``first_iteration`` says otherwise (optimizer step ``i + 1`` is
    iteration ``i``'s). ``session_options`` go to
    :class:`~twinkle.run.RunSession` (``plugins=``, ``autoload=``, ``blocked=``,
    ``background_writer=``, ...).
    """
    clock = ManualClock(10**9)
    options: dict[str, Any] = {
        "config": copy.deepcopy(SCRIPTED_CONFIG),
        "clock": clock,
        "wall_clock": lambda: _WALL_ZERO_NS + clock(),
        "resume": True,
        "background_dispatch": False,
        **session_options,
    }
    with RunSession(out_dir=out_dir, run_id=run_id, **options) as run:
        if first_iteration is None:
            first_iteration = 0 if run.resumed is None else run.resumed.next_iteration
        for i in range(first_iteration, first_iteration + iterations):
            run.bus.iteration_started(i)
            with run.recorder.span("generate", iteration=i):
                clock.advance(1_000_000)
            run.bus.samples(iteration=i, phase="rollout", lengths=[3 + i, 4], groups=1)
            with run.recorder.span("train.fwd"):
                clock.advance(2_000_000)
            run.bus.samples(iteration=i, phase="train", lengths=[3 + i, 4])
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
            if i == _crash_in:  # (crashed_run's child)
                time.sleep(1.0)  # the writer threads write what they were handed
                os._exit(_CRASH_STATUS)  # killed outright: no run_finished, nothing closed
            run.read_memory(iteration=i)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 0.5 / (i + 1)})
            run.bus.weights_published(
                i + 1, start_ns=clock(), end_ns=clock() + 5, acks=[("e0", clock() + 5)]
            )
            run.bus.snapshot({"version": i + 1})
            clock.advance(1_000)
    return Path(out_dir) / run.run_id / "events.jsonl"


def crashed_run(
    out_dir: str | os.PathLike[str],
    run_id: str = "cut",
    iterations: int = 3,
    *,
    plugins: Mapping[str, str] | None = None,
) -> Path:
    """Record :func:`scripted_run`'s iterations in a child process that is killed
    outright (``os._exit``) in the last of them, after its optimizer step: no
    ``run_finished``, no file closed, nothing flushed that its writer threads did not
    write in a second. ``plugins`` maps observer names to the ``module:attr`` of a
    class or factory the child builds them from (the child loads no entry points).
    A :func:`scripted_run` of the same run then resumes it; returns the event log."""
    args = {"out_dir": str(out_dir), "run_id": run_id, "iterations": iterations}
    code = "import sys; from twinkle.testing import _crash; _crash(sys.argv[1], sys.argv[2])"
    child = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args), json.dumps(dict(plugins or {}))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if child.returncode != _CRASH_STATUS:
        raise RuntimeError(
            f"crashed_run's child exited with {child.returncode}, not {_CRASH_STATUS} "
            f"(killed in its last iteration):\n{child.stderr[-2000:]}"
        )
    return Path(out_dir) / run_id / "events.jsonl"


def _crash(args_json: str, plugins_json: str) -> None:
    """:func:`crashed_run`'s child."""
    args, plugins = json.loads(args_json), json.loads(plugins_json)
    built = []
    for name, target in plugins.items():
        module, _, attr = target.partition(":")
        built.append((name, getattr(importlib.import_module(module), attr)()))
    iterations = args.pop("iterations")
    scripted_run(
        **args, iterations=iterations, _crash_in=iterations - 1, autoload=False, plugins=built
    )


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask is ``mask`` inside (``umask(0)``: what a plugin creates with
    its library's modes, 0666 and 0777, is writable by every user unless it sees to it)::

        with umask(0):
            run_dir = scripted_run(tmp_path, plugins=[("mine", MySink())]).parent
        assert shared_writable(run_dir) == []
    """
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def shared_writable(path: str | os.PathLike[str]) -> list[str]:
    """The entries of ``path`` and under it (symbolic links aside) that the group or
    others may write, as ``"<path relative to it> <mode in octal>"``: a run leaves none,
    whatever the umask (twinkle's own files are 0644, its directories 0755)."""
    found = []
    for root, dirs, files in os.walk(path):
        for entry in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
            mode = os.lstat(entry).st_mode
            if not stat.S_ISLNK(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
                found.append(f"{os.path.relpath(entry, path)} {stat.S_IMODE(mode):o}")
    return sorted(set(found))


def signal_main(signum: int = signal.SIGINT) -> None:
    """Send signal ``signum`` to the main thread, as a user's Ctrl-C (SIGINT) or a
    scheduler's SIGTERM does: its handler runs there, wherever that thread is, waiting
    for an observer's hook on the hook's own thread included. From an observer's hook
    (a plugin's runs on a thread of its own, where a ``KeyboardInterrupt`` it raises is
    its own failure, not a Ctrl-C), this waits until the main thread took it there (at
    most a second: a main thread not waiting for the hook takes it where it is)."""
    main = threading.main_thread()
    if threading.current_thread() is main:
        signal.raise_signal(signum)
        return
    assert main.ident is not None
    signal.pthread_kill(main.ident, signum)
    wait_for_caller(1.0)


def handle_stop_signals() -> None:
    """Take the stop signals the tests send again in a process a shell started as a
    background job (``make test &``, some CI runners: SIGINT ignored) or under ``nohup``
    (SIGHUP ignored). Python keeps an ignored signal ignored and every child inherits it,
    so a test that presses Ctrl-C, or hangs up a child, would wait in vain. SIGINT is
    Python's again (KeyboardInterrupt); SIGHUP is still ignored here, by a handler of
    this process's own, so the children start with it at its default. A test suite's
    ``conftest.py`` calls it; a handler the process set itself is left as it is."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_IGN:
        signal.signal(hangup, _still_ignored)


def _still_ignored(signum: int, frame: object) -> None:
    """SIGHUP's handler in a test process started under ``nohup``: ignored, as before."""


def press_ctrl_c() -> None:
    """Press Ctrl-C: :func:`signal_main` of SIGINT."""
    signal_main(signal.SIGINT)


class CtrlCWhileResuming:
    """An observer that presses Ctrl-C (:func:`press_ctrl_c`) while a
    resumed run's logged events go by again, at the last logged segment's
    ``run_finished``: after every earlier segment's ``run_resumed`` went by again, before
    the new segment's. A sink that rebuilds its output on resume must leave the earlier
    output as it was::

        scripted_run(tmp_path, "r", 2, plugins=[("mine", MySink())])
        scripted_run(tmp_path, "r", 2, plugins=[("mine", MySink())])  # resumes
        with pytest.raises(KeyboardInterrupt):
            scripted_run(tmp_path, "r", 1,
                         plugins=[("mine", MySink()), ("ctrl_c", CtrlCWhileResuming())])
    """

    def __init__(self) -> None:
        self.segment = 0
        self.finished = 0

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        self.segment, self.finished = context.segment, 0

    @hookimpl
    def twinkle_run_finished(self) -> None:
        self.finished += 1
        if self.segment and self.finished == self.segment:
            self.interrupt()

    def interrupt(self) -> None:
        """What happens at that moment: Ctrl-C (a subclass may look at its output
        there instead)."""
        press_ctrl_c()
