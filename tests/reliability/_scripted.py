"""A deterministic recorded run (manual clock) using every event type: the valid log the
crash, bad-input and fuzz tests cut and corrupt."""

from __future__ import annotations

from pathlib import Path

from twinkle.perf import ManualClock
from twinkle.run import RunSession

#: the built-in observers, by name (as make_plugin_manager() registers them)
BUILTINS = frozenset(
    {
        "events",
        "memory",
        "metrics_raw",
        "scalars",
        "throughput",
        "timeline",
        "timing",
        "trace",
        "webui",
    }
)

CONFIG = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 2},
    "total_steps": 4,
}


def scripted_run(out_dir: Path, run_id: str = "cut", iterations: int = 4) -> Path:
    """Run ``iterations`` scripted iterations into ``out_dir``; returns the event log."""
    clock = ManualClock(10**9)
    with RunSession(
        out_dir=out_dir,
        run_id=run_id,
        config=CONFIG,
        autoload=False,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
        background_writer=False,
    ) as run:
        for i in range(iterations):
            run.bus.iteration_started(i)
            with run.recorder.span("generate", iteration=i):
                clock.advance(1_000_000)
            run.bus.samples(iteration=i, phase="rollout", lengths=[3 + i, 4], groups=1)
            with run.recorder.span("train.fwd"):
                clock.advance(2_000_000)
            run.bus.samples(iteration=i, phase="train", lengths=[3 + i, 4])
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
            run.read_memory(iteration=i)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 0.5 / (i + 1)})
            run.bus.weights_published(
                i + 1, start_ns=clock(), end_ns=clock() + 5, acks=[("e0", clock() + 5)]
            )
            run.bus.snapshot({"version": i + 1})
            clock.advance(1_000)
    assert run.out_dir is not None
    return run.out_dir / "events.jsonl"
