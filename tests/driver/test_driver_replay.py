"""A driven run's event log replays to the same records, byte for byte."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson

from twinkle.driver import StreamingDriver
from twinkle.run import RunSession, replay

CONFIG = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 2},
    "total_steps": 3,
}
COMPARED = ["metrics_raw.jsonl", "metrics.jsonl", "summary.json"]


class Engine:
    def __init__(self, name: str) -> None:
        self.name = name

    def load_weights(self, version: int, weights: Any) -> None:
        sum(range(1000))


def rollouts(seed: int) -> Any:
    lengths = itertools.count(seed)

    def produce(version: int) -> list[int]:
        return [next(lengths) % 17 + 3, 11]

    return produce


def test_driver_events_replay_to_the_same_records(tmp_path: Path) -> None:
    with RunSession(out_dir=tmp_path, run_id="driven", config=CONFIG, autoload=False) as run:
        rec = run.recorder
        with StreamingDriver(
            {"engine0": rollouts(0), "engine1": rollouts(5)},
            bus=run.bus,
            publisher=[Engine("engine0"), Engine("engine1")],
            buffer_size=8,
            auto_iterations=False,
        ) as driver:
            for i in range(3):
                assert driver.begin_iteration() == i
                with rec.span("generate"):
                    batch = driver.next_batch(4)
                lengths = [n for item in batch for n in item.payload]
                run.bus.samples(iteration=i, phase="rollout", lengths=lengths, groups=2)
                with rec.span("train.step"):
                    sum(range(5000))
                run.bus.samples(iteration=i, phase="train", lengths=lengths)
                run.bus.optimizer_step(iteration=i, step=i + 1, samples=len(batch))
                driver.publish_weights({"step": i})
                driver.snapshot()
        run_dir = run.out_dir
    assert run_dir is not None

    events = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    kinds = [
        e["type"]
        for e in events
        if e["type"] in {"iteration_started", "weights_published", "snapshot"}
    ]
    assert kinds == ["iteration_started", "weights_published", "snapshot"] * 3

    result = replay(run_dir / "events.jsonl", tmp_path / "replayed", autoload=False)
    assert result.summary["status"] == "ok"
    for name in COMPARED:
        live = (run_dir / name).read_bytes()
        assert live, name
        assert (tmp_path / "replayed" / name).read_bytes() == live, name
