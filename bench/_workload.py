"""A synthetic observed iteration, shared by the event and scaling benchmarks.

What a GRPO-style trainer publishes per iteration besides its spans: the iteration
boundary (which flushes the attached recorders into span batches), the rollout and
train samples (128 trajectories' token lengths), two optimizer steps, the loss/reward
scalars, the workers' memory readings and a driver snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.events import EventBus
from twinkle.perf.stats import MemoryReading

EVENTS_PER_ITERATION = 8

CONFIG: dict[str, Any] = {
    "phases": {
        "rollout": ["generate", "reward"],
        "train": ["advantage", "train.*"],
        "publish": ["weights.load"],
    },
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 1},
    "total_steps": 1_000_000,
}

SPAN_NAMES = (
    "generate",
    "reward",
    "advantage",
    "train.forward",
    "train.backward",
    "train.optimizer_step",
    "weights.load",
    "wait.rollout",
)

LENGTHS = [100 + (i * 37) % 900 for i in range(128)]  # 128 trajectories' token counts


def publish_iteration(bus: EventBus, it: int, readings: Sequence[MemoryReading]) -> None:
    """Publish one iteration's events (:data:`EVENTS_PER_ITERATION` of them)."""
    bus.iteration_started(it)
    publish_results(bus, it, readings)


def publish_results(bus: EventBus, it: int, readings: Sequence[MemoryReading]) -> None:
    """What :func:`publish_iteration` publishes after the boundary: the iteration's
    results, which a training loop publishes once its work is done."""
    bus.samples(iteration=it, phase="rollout", lengths=LENGTHS, groups=16)
    bus.samples(iteration=it, phase="train", lengths=LENGTHS)
    bus.optimizer_step(iteration=it, step=2 * it + 1, samples=64)
    bus.optimizer_step(iteration=it, step=2 * it + 2, samples=64)
    bus.scalars(iteration=it, name="grpo", values={"reward_mean": 0.5, "loss": 0.1, "kl": 0.01})
    bus.memory(readings, iteration=it)
    bus.snapshot({"version": it, "buffered": 2, "staleness_max": 1})
