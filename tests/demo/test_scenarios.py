"""Real demo runs made slow on one side on purpose (issue 28, the scenario knobs): the
verdict names that side, with and without streaming, on Ray actors and on DDP ranks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.errors import ConfigError
from twinkle.whatif._helps import what_would_help

SMALL = DemoConfig(iterations=6, prompts_per_iteration=8, completions_per_prompt=8, micro_batch=16)


def _verdict(tmp_path: Path, **knobs: Any) -> dict[str, Any]:
    cfg = dataclasses.replace(SMALL, **knobs)
    result = run_demo(cfg, out_dir=tmp_path, run_id="s", autoload=False)
    limits: dict[str, Any] = result.summary["limits"]
    return limits


# With streaming, the side that is not slowed waits for the other most of the time:
# the trainer for rollouts, the engines for the weights they are due.
TRAINER_WAITS = ("wait.rollout", ["trainer"])  # (this process: the trainer)
ENGINES_WAIT = ("wait.weights", ["engine0", "engine1"])
RANK0_WAITS = ("wait.rollout", ["rank0"])  # (with several ranks, this process is rank 0)


@pytest.mark.parametrize(
    ("knobs", "expected", "waiting"),
    [
        ({"slow_generation": 6.0}, "generation-bound", TRAINER_WAITS),
        ({"slow_training": 5.0}, "training-bound", ENGINES_WAIT),
        ({"slow_publish": 300.0}, "publish-bound", None),
        ({"slow_engine": "engine1:8"}, "generation-bound", TRAINER_WAITS),  # one straggler
        ({"slow_generation": 6.0, "overlap": False}, "generation-bound", None),
        ({"slow_training": 5.0, "overlap": False}, "training-bound", None),
        ({"slow_generation": 6.0, "train_workers": 2}, "generation-bound", RANK0_WAITS),
    ],
)
def test_the_verdict_names_the_slowed_side(
    knobs: dict[str, Any], expected: str, waiting: tuple[str, list[str]] | None, tmp_path: Path
) -> None:
    limits = _verdict(tmp_path, **knobs)
    assert limits["verdict"] == expected, limits
    assert limits["over"] == "steady state"
    assert limits["windows"].get(expected, 0) >= 3, limits["windows"]  # of the 6
    if waiting is not None:
        name, workers = waiting
        waits = limits["workers"]["waits"][name]
        assert all(waits[w]["share"] > 0.3 for w in workers), limits["workers"]


def test_a_straggling_engine_is_named_chronic_and_the_others_not(tmp_path: Path) -> None:
    stragglers = _verdict(tmp_path, slow_engine="engine1:8")["stragglers"]["generation"]
    engines = stragglers["workers"]
    assert engines["engine1"]["verdict"] == "chronic", stragglers
    assert engines["engine1"]["median_ratio_to_peers"] > 4
    assert engines["engine0"]["verdict"] == "ok"
    assert stragglers["unit"] == "token"
    # what would help names the straggler's fix: engine1 at its peers' speed, its
    # speed times its ratio to them; it helps this generation-bound run most
    rows = {r["change"]: r for r in what_would_help(str(tmp_path / "s"))}
    fixed = rows["engine1 at its peers' speed"]
    assert fixed["speed"] == {"engine1": engines["engine1"]["median_ratio_to_peers"]}
    assert "engine0 at its peers' speed" not in rows
    assert fixed["speedup"] > 1.5
    assert fixed["speedup"] == max(r["speedup"] or 0 for r in rows.values())


def test_ranks_of_equal_speed_are_no_stragglers(tmp_path: Path) -> None:
    # ten iterations: a verdict over more than a handful, as jitter on two shared cores
    # can put either rank past 1.5x its peer on any one of them
    training = _verdict(tmp_path, train_workers=2, iterations=10)["stragglers"]["training"]
    assert sorted(training["workers"]) == ["rank0", "rank1"]  # rank 0: the run's process
    assert all(w["verdict"] != "chronic" for w in training["workers"].values()), training


def test_on_ray_the_verdict_names_the_slowed_side(ray_cluster: Any, tmp_path: Path) -> None:
    limits = _verdict(tmp_path, backend="ray", slow_training=5.0)
    assert limits["verdict"] == "training-bound", limits


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"slow_training": 0.5}, r"slow_training must be a number in \[1, 1000\]"),
        ({"slow_engine": "engine7:2"}, r"slow_engine must be NAME:FACTOR with NAME one of"),
        ({"slow_engine": "engine1"}, r"e.g. engine1:4"),
        ({"slow_generation": 2.0, "engine": "vllm"}, r"the vLLM demo has none"),
    ],
)
def test_a_bad_knob_is_refused_by_name(knobs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(SMALL, **knobs)
