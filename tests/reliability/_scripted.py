"""A deterministic recorded run (manual clock) using every event type: the valid log the
crash, bad-input and fuzz tests cut and corrupt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twinkle import testing
from twinkle.perf import ManualClock
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG

#: the built-in observers, by name (as make_plugin_manager() registers them)
BUILTINS = frozenset(
    {
        "compare",
        "events",
        "memory",
        "metrics_raw",
        "scalars",
        "throughput",
        "mfu",
        "timeline",
        "timing",
        "trace",
        "webui",
    }
)

CONFIG = SCRIPTED_CONFIG


def scripted_run(out_dir: Path, run_id: str = "cut", iterations: int = 4) -> Path:
    """Run ``iterations`` scripted iterations into ``out_dir``; returns the event log."""
    return testing.scripted_run(
        out_dir, run_id, iterations, autoload=False, background_writer=False
    )


#: the wall clock of a segment's process at its clock's zero (plus its offset)
WALL0 = 1_700_000_000_000_000_000


def segment(
    out: Path,
    config: dict[str, Any] = CONFIG,
    *,
    iterations: int = 2,
    wall_offset_ns: int = 0,
    fail: bool = False,
    blocked: tuple[str, ...] = (),
    plugins: tuple[tuple[str, object], ...] = (),
) -> RunSession:
    """One process's stretch of run ``r`` under ``config`` (a fresh clock: a new
    process), continuing where the directory's log says the run stopped; ``fail``
    raises out of it after its iterations (the session finishes it as an error).
    Dispatched on the publishing thread, as :func:`twinkle.testing.scripted_run` does:
    two such segments write the same bytes."""
    session, clock = segment_session(
        out, config, wall_offset_ns=wall_offset_ns, blocked=blocked, plugins=plugins
    )
    with session as run:
        first = 0 if run.resumed is None else run.resumed.next_iteration
        steps = 0 if run.resumed is None else run.resumed.optimizer_steps
        for i in range(first, first + iterations):
            run.bus.iteration_started(i)
            with run.recorder.span("generate", iteration=i):
                clock.advance(1_000_000)
            run.bus.samples(iteration=i, phase="rollout", lengths=[3 + i, 4], groups=1)
            with run.recorder.span("train.fwd"):
                clock.advance(2_000_000)
            run.bus.samples(iteration=i, phase="train", lengths=[3 + i, 4])
            steps += 1
            run.bus.optimizer_step(iteration=i, step=steps, samples=2)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 0.5 / (i + 1)})
            clock.advance(1_000)
        if fail:
            raise RuntimeError("the trainer broke")
    return session


def segment_session(
    out: Path,
    config: dict[str, Any],
    *,
    wall_offset_ns: int,
    blocked: tuple[str, ...] = (),
    plugins: tuple[tuple[str, object], ...] = (),
) -> tuple[RunSession, ManualClock]:
    """The session of one of :func:`segment`'s processes (not started) and its clock."""
    clock = ManualClock(10**9)
    session = RunSession(
        out_dir=out,
        run_id="r",
        config=config,
        autoload=False,
        clock=clock,
        wall_clock=lambda: WALL0 + wall_offset_ns + clock(),
        background_writer=False,
        background_dispatch=False,
        resume=True,
        blocked=blocked,
        plugins=list(plugins),
    )
    return session, clock


def killed_when_ready(script: str) -> int:
    """Run ``script`` in a child process and kill it outright (SIGKILL) 0.2 s after it
    prints ``ready``; its pid."""
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.2)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(10)
    return child.pid
