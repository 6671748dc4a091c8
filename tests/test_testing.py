"""twinkle.testing.scripted_run: the recorded run plugin tests check their output against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinkle.plugins import loaded_plugins, make_plugin_manager
from twinkle.reporting import read_jsonl
from twinkle.testing import SCRIPTED_CONFIG, crashed_run, scripted_run


def test_its_times_are_the_manual_clocks(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, "timed", autoload=False)
    assert log == tmp_path / "timed" / "events.jsonl"
    walls = [
        r["values"]["window_wall_seconds"]
        for r in read_jsonl(log.parent / "metrics_raw.jsonl")
        if (r["kind"], r["scope"]) == ("timing", "iteration")
    ]
    assert walls == [0.003001] * 4  # 1 ms generating, 2 ms training, 1 us between


def test_it_records_every_kind_of_event_under_its_config(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, autoload=False)
    events = list(read_jsonl(log))
    assert {e["type"] for e in events} == {
        "run_started",
        "iteration_started",
        "spans",
        "samples",
        "optimizer_step",
        "memory",
        "scalars",
        "weights_published",
        "snapshot",
        "run_finished",
        "backends_closed",
    }
    assert events[0]["config"] == SCRIPTED_CONFIG
    assert events[0]["plugins"] == list(loaded_plugins(make_plugin_manager(autoload=False)))


def test_a_second_call_resumes_the_run_from_its_next_iteration(tmp_path: Path) -> None:
    scripted_run(tmp_path, "r", 2, autoload=False)
    log = scripted_run(tmp_path, "r", 3, autoload=False)  # from iteration 2, step 3
    summary = json.loads((log.parent / "summary.json").read_text())
    assert summary["counts"]["optimizer_updates"]["final"] == 5
    assert [e["type"] for e in read_jsonl(log)].count("run_resumed") == 1


def test_session_options_reach_the_run(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, autoload=False, blocked=["trace"])
    assert not (log.parent / "trace.json").exists()
    assert "trace" not in next(iter(read_jsonl(log)))["plugins"]


def test_crashed_run_leaves_a_segment_killed_outright_that_a_resume_closes(
    tmp_path: Path,
) -> None:
    log = crashed_run(tmp_path, "crash", 3)
    logged = list(read_jsonl(log))
    assert "run_finished" not in {e["type"] for e in logged}
    assert [e["iteration"] for e in logged if e["type"] == "iteration_started"] == [0, 1, 2]
    assert not (log.parent / "summary.json").exists()  # nothing was finished
    scripted_run(tmp_path, "crash", 1, first_iteration=3, autoload=False)
    summary = json.loads((log.parent / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert "stopped without finishing" in json.dumps(summary)


def test_crashed_run_says_when_its_child_did_not_crash(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)exited with 1, not 113.*no_such_module"):
        crashed_run(tmp_path, "bad", 2, plugins={"x": "no_such_module:Nothing"})
