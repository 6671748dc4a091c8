"""The hand-worked run of ``tests/_whatif_run.py``, written as a run directory."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from _whatif_run import CONFIG, recorded_events
from twinkle.run import replay


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """The run of ``_whatif_run``'s table, in its directory."""
    replay(recorded_events(), tmp_path / "run", autoload=False)
    return tmp_path / "run"


@pytest.fixture
def bare_run(tmp_path: Path) -> Path:
    """The same run without a placement: its devices given as counts."""
    config = {k: v for k, v in CONFIG.items() if k != "placement"}
    config["window"] = {"samples": "rollout", "devices": 2}
    config["throughput"] = {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    }
    events = recorded_events()
    events[0] = msgspec.structs.replace(events[0], config=config)
    replay(events, tmp_path / "bare", autoload=False)
    return tmp_path / "bare"


@pytest.fixture
def shared_run(tmp_path: Path) -> Path:
    """The same run with its trainer and engine on one device (the demo's: one host's
    CPU)."""
    config = dict(CONFIG)
    config["placement"] = {
        name: {**worker, "devices": ["host-cpu"]} for name, worker in CONFIG["placement"].items()
    }
    events = recorded_events()
    events[0] = msgspec.structs.replace(events[0], config=config)
    replay(events, tmp_path / "shared", autoload=False)
    return tmp_path / "shared"
