"""Device denominators from the placement (issue 27, item 4): each worker states the
devices it used; a phase divides by the distinct devices of the workers that ran it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_steady_state import CONFIG as STEADY_CONFIG
from observers.test_steady_state import _one, _run
from twinkle.errors import ConfigError
from twinkle.observers import ObserverConfig

PHASES = {"rollout": ["generate"], "train": ["train.*"], "publish": ["weights.load"]}


def _config(placement: dict[str, Any], **overrides: Any) -> ObserverConfig:
    return ObserverConfig.parse(
        {
            "phases": PHASES,
            "placement": placement,
            "throughput": {"rollout": {"samples": "rollout"}, "train": {"samples": "train"}},
            "window": {"samples": "rollout"},
            **overrides,
        }
    )


def _gpu(phases: list[str], *names: str) -> dict[str, Any]:
    return {"phases": phases, "device_type": "cuda", "devices": list(names)}


def test_each_phase_counts_the_distinct_devices_of_the_workers_that_ran_it() -> None:
    config = _config(
        {
            "engine0": _gpu(["rollout", "publish"], "GPU-a"),
            "engine1": _gpu(["rollout", "publish"], "GPU-b"),
            # the trainer drives two GPUs, one of them shared with engine1 (colocated)
            "trainer": _gpu(["train", "publish"], "GPU-b", "GPU-c"),
        }
    )
    assert config.throughput["rollout"].devices == 2  # GPU-a, GPU-b
    assert config.throughput["train"].devices == 2  # GPU-b, GPU-c
    assert config.window is not None and config.window.devices == 3  # a, b, c once each
    assert config.device_sources == {
        "rollout": "placement",
        "train": "placement",
        None: "placement",
    }


def test_unnamed_devices_count_per_worker_and_the_callers_count_wins() -> None:
    config = _config(
        {
            "engine0": {"phases": ["rollout"], "device_type": "cuda", "count": 4},
            "engine1": {"phases": ["rollout"], "device_type": "cuda", "count": 4},
            "trainer": {"phases": ["train"], "device_type": "cuda", "count": 8},
        },
        throughput={
            "rollout": {"samples": "rollout"},
            "train": {"samples": "train", "devices": 6},  # the caller's: wins
        },
    )
    assert config.throughput["rollout"].devices == 8  # 4 + 4: no names, none shared
    assert config.throughput["train"].devices == 6
    assert config.window is not None and config.window.devices == 16
    assert config.device_sources["train"] == "config"


def test_four_engines_on_one_cpu_share_one_device() -> None:
    cpu = {"device_type": "cpu", "devices": ["cpu:host"]}
    placement = {f"engine{i}": {**cpu, "phases": ["rollout"]} for i in range(4)}
    placement["trainer"] = {**cpu, "phases": ["train"]}
    config = _config(placement)
    assert config.throughput["rollout"].devices == 1
    assert config.window is not None and config.window.devices == 1


@pytest.mark.parametrize(
    ("placement", "match"),
    [
        ([], r"config.placement must be an object of workers"),
        ({"e": {"phases": ["rollout"], "device_type": "cuda"}}, r"name its devices .* or count"),
        ({"e": _gpu([], "a")}, r"config.placement\['e'\].phases must be a non-empty list"),
        ({"e": _gpu(["sample"], "a")}, r"names 'sample', not a phase of config.phases"),
        ({"e": _gpu(["rollout"], "a", "a")}, r"names a device twice"),
        ({"e": {**_gpu(["rollout"], "a"), "count": 2}}, r"count is 2 but it names 1 devices"),
        ({"e": {**_gpu(["rollout"], "a"), "gpus": 1}}, r"must be an object with keys"),
        ({"e": {"phases": ["rollout"], "count": 1}}, r"device_type must be a non-empty string"),
        # nobody ran train: its denominator is unknown
        ({"e": _gpu(["rollout"], "a")}, r"no worker of config.placement ran phase 'train'"),
    ],
)
def test_a_bad_placement_is_refused_by_name(placement: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _config(placement)


def test_without_a_placement_the_count_is_still_required() -> None:
    with pytest.raises(ConfigError, match=r"devices must be a positive.*config.placement"):
        ObserverConfig.parse({"phases": PHASES, "throughput": {"rollout": {"samples": "rollout"}}})


def test_the_summary_lists_the_placement_and_the_figures_use_it(tmp_path: Path) -> None:
    """The scripted steady-state run with its devices from a placement: two engines on
    two GPUs, a trainer on a third; the window divides by 3, rollout by 2, train by 1."""
    config = {
        **STEADY_CONFIG,
        "placement": {
            "engine0": _gpu(["rollout", "startup", "shutdown"], "GPU-a"),
            "engine1": _gpu(["rollout"], "GPU-b"),
            "trainer": _gpu(["train", "startup", "shutdown"], "GPU-c"),
        },
        "throughput": {"rollout": {"samples": "rollout"}, "train": {"samples": "train"}},
        "window": {"samples": "rollout"},
    }
    run_dir = _run(tmp_path, config=config)
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    placement = summary["placement"]
    assert placement["window"] == {"devices": 3, "from": "placement"}
    assert placement["phases"] == {
        "rollout": {"devices": 2, "from": "placement"},
        "train": {"devices": 1, "from": "placement"},
    }
    assert placement["workers"]["engine1"] == {
        "phases": ["rollout"],
        "device_type": "cuda",
        "devices": ["GPU-b"],
        "count": 1,
    }
    # the steady state of test_steady_state (240 tokens over 60 ms), on 3 devices
    assert _one(run_dir, "run", "run")["steady_tokens_per_s_per_device"] == 240 / (0.06 * 3)


def test_the_report_says_which_given_counts_are_not_the_placements(tmp_path: Path) -> None:
    """The placement names two GPUs for the engines and one for the trainer, and the
    configuration gives 8 for train and the run: its counts divide, and the report says
    they are not what the placement holds (rollout, from the placement, agrees)."""
    from twinkle.report import format_report, load_report

    config = {
        **STEADY_CONFIG,
        "placement": {
            "engine0": _gpu(["rollout"], "GPU-a"),
            "engine1": _gpu(["rollout"], "GPU-b"),
            "trainer": _gpu(["train"], "GPU-c"),
        },
        "throughput": {
            "rollout": {"samples": "rollout"},
            "train": {"samples": "train", "devices": 8},
        },
        "window": {"samples": "rollout", "devices": 8},
    }
    text = format_report(load_report(_run(tmp_path, config=config)))
    assert (
        "  not the placement's: run 8 given, 3 placed, train 8 given, 1 placed (the "
        "configuration's count divides; leave its devices out to divide by the placement's)"
    ) in text.splitlines()
