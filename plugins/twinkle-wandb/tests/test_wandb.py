"""The plugin against real runs, in W&B's offline mode, read back with W&B's own reader
of its transaction logs (``wandb leet inspect --json``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import wandb
from twinkle_wandb import DIR, STEP_METRIC, WandbSink

from twinkle.errors import PluginError, ReporterError
from twinkle.plugins import PluginStatus, describe_plugins
from twinkle.reporting import cut_short, flat_key, read_jsonl, record_from_dict
from twinkle.run import RunSession, replay
from twinkle.testing import (
    SCRIPTED_CONFIG,
    CtrlCWhileResuming,
    crashed_run,
    scripted_run,
    shared_writable,
    umask,
)

WANDB = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
#: what W&B adds to every history row
W_AND_B_KEYS = {"_step", "_runtime", "_timestamp"}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the plugin's default: offline
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def read_log(log: Path) -> list[dict[str, Any]]:
    """The records of one W&B transaction log, as W&B's reader prints them."""
    lines = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(log)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    return [json.loads(line) for line in lines]


def inspect(run_dir: Path) -> list[list[dict[str, Any]]]:
    """The records of each W&B run of ``run_dir``, the oldest first (a log a crash left
    without its run record first of all)."""
    logs = list((run_dir / DIR).glob("offline-run-*/run-*.wandb"))
    assert logs, f"no W&B run in {run_dir / DIR}"

    def started(records: list[dict[str, Any]]) -> str:
        return next((r["run"]["start_time"] for r in records if r["type"] == "run"), "")

    return sorted(map(read_log, logs), key=started)


def history(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    return [{k: v for k, v in row.items() if k not in W_AND_B_KEYS} for row in rows]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            merged.update(r["summary"].get("update", {}))
    return merged


def one(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [r[kind] for r in records if r["type"] == kind]
    assert len(found) == 1, (kind, found)
    return found[0]


def the_records(run_dir: Path) -> list[Any]:
    return [record_from_dict(r) for r in read_jsonl(run_dir / "metrics_raw.jsonl")]


def expected_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One history row per iteration record with a value, in record order (but an
    iteration cut short)."""
    rows = []
    for record in the_records(run_dir):
        if cut_short(record):
            continue
        values = {flat_key(record, k): v for k, v in record.values.items() if v is not None}
        if record.scope == "iteration" and values:
            rows.append({STEP_METRIC: record.step, "iteration": record.iteration, **values})
    return rows


def wandb_only(tmp_path: Path, run_id: str = "r", iterations: int = 3, **kw: Any) -> Path:
    log = scripted_run(
        tmp_path, run_id, iterations, autoload=False, plugins=[("wandb", WandbSink())], **kw
    )
    return log.parent


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    run_dir = wandb_only(tmp_path_factory.mktemp("logged"))
    (records,) = inspect(run_dir)
    return run_dir, records


def test_every_iteration_record_is_one_history_row_of_its_exact_values(
    logged: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, records = logged
    rows = history(records)
    assert rows == expected_rows(run_dir)
    assert [r["grpo/loss"] for r in rows if "grpo/loss" in r] == [0.5, 0.25, 0.5 / 3]


def test_the_runs_and_windows_figures_are_the_summary(
    logged: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, records = logged
    want = {
        flat_key(r, k): v
        for r in the_records(run_dir)
        if r.scope != "iteration"
        for k, v in r.values.items()
        if v is not None
    }
    assert want and {k.split("/")[0] for k in want} == {"run", "window"}
    got = summary(records)
    assert {k: got[k] for k in want} == want


def test_every_chart_is_drawn_against_the_optimizer_step(
    logged: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, records = logged
    metrics = [r["metric"] for r in records if r["type"] == "metric"]
    assert {"glob_name": "*", "step_metric": STEP_METRIC} in [
        {k: m[k] for k in ("glob_name", "step_metric") if k in m} for m in metrics
    ]


def test_the_wandb_run_is_the_twinkle_run_offline(
    logged: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, records = logged
    run = one(records, "run")
    assert (run["display_name"], run["run_group"], run["project"]) == ("r", "r", "twinkle")
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    assert config == SCRIPTED_CONFIG
    assert run["telemetry"]["feature"]["offline"] is True
    assert one(records, "exit").get("exit_code", 0) == 0
    assert (run_dir / DIR).is_dir()


def test_a_failed_run_finishes_its_wandb_run_with_exit_code_1(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        RunSession(
            out_dir=tmp_path, run_id="failed", autoload=False, plugins=[("wandb", WandbSink())]
        ) as run,
    ):
        run.bus.iteration_started(0)
        raise RuntimeError("boom")
    (records,) = inspect(tmp_path / "failed")
    assert one(records, "exit")["exit_code"] == 1


def test_each_resumed_segment_logs_the_whole_run_into_a_wandb_run_of_its_own(
    tmp_path: Path,
) -> None:
    for first in (0, 2, 4):  # segments 0, 1 and 2
        run_dir = wandb_only(tmp_path, iterations=2, first_iteration=first)
    runs = inspect(run_dir)
    assert [one(r, "run")["display_name"] for r in runs] == ["r", "r-s1", "r-s2"]
    assert {one(r, "run")["run_group"] for r in runs} == {"r"}
    assert len({one(r, "run")["run_id"] for r in runs}) == 3  # W&B's ids, one each
    newest = history(runs[-1])
    assert newest == expected_rows(run_dir)  # every record of the run, once, in order
    assert sorted({r[STEP_METRIC] for r in newest}) == [1, 2, 3, 4, 5, 6]
    assert sorted({r[STEP_METRIC] for r in history(runs[0])}) == [1, 2]  # as it was
    assert all(one(r, "exit").get("exit_code", 0) == 0 for r in runs)


def test_its_files_are_writable_by_their_owner_alone_whatever_the_umask(
    tmp_path: Path,
) -> None:
    with umask(0):  # (W&B creates its files 0666 and its directories 0777)
        wandb_only(tmp_path, iterations=2)
        run_dir = wandb_only(tmp_path, iterations=1, first_iteration=2)  # resumed
    assert len(inspect(run_dir)) == 2
    assert shared_writable(run_dir) == []


def test_replay_logs_every_record_again(tmp_path: Path) -> None:
    run_dir = wandb_only(tmp_path / "live")
    out = tmp_path / "replayed"
    replay(run_dir, out, autoload=False, plugins=[("wandb", WandbSink())])
    (records,) = inspect(out)
    assert history(records) == expected_rows(run_dir)


def test_a_wandb_run_of_the_trainer_is_left_alone(tmp_path: Path) -> None:
    mine = wandb.init(dir=tmp_path, mode="offline", project="mine", id="mine")
    try:
        wandb_only(tmp_path / "runs")
        assert wandb.run is mine
        wandb.log({"my/loss": 1.0})  # the trainer's own logging still goes to its run
    finally:
        mine.finish()
    logs = sorted((tmp_path / DIR).glob("offline-run-*/run-*.wandb"))
    assert [log.name for log in logs] == ["run-mine.wandb"]
    assert history(read_log(logs[0])) == [{"my/loss": 1.0}]


def test_installed_it_loads_through_the_entry_point(tmp_path: Path) -> None:
    info = {p.name: p for p in describe_plugins()}["wandb"]
    assert (info.builtin, info.status, info.distribution) == (
        False,
        PluginStatus.LOADS,
        "twinkle-wandb 0.1.0",
    )
    others = [p.name for p in describe_plugins() if not p.builtin and p.name != "wandb"]
    run_dir = scripted_run(tmp_path, "auto", 2, blocked=others).parent  # autoload on
    (records,) = inspect(run_dir)
    assert history(records) == expected_rows(run_dir)


def test_a_run_without_files_starts_no_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with RunSession(out_dir=None, autoload=False, plugins=[("wandb", WandbSink())]) as run:
        run.bus.iteration_started(0)
    assert not list(tmp_path.rglob("*.wandb"))


def summary_of(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def assert_records_complete(run_dir: Path, iterations: int = 3) -> None:
    """The run's own records are all there (one row per iteration, the run's totals)."""
    rows = expected_rows(run_dir)
    assert sorted({r["iteration"] for r in rows}) == list(range(iterations))
    assert any(r.scope == "run" for r in the_records(run_dir))


def test_an_unknown_wandb_mode_leaves_the_plugin_out_of_a_run_that_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "sideways")
    run_dir = wandb_only(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "ok"
    assert re.search(
        r"WANDB_MODE='sideways' is not a W&B mode.*'offline'", summary["plugins_left_out"]["wandb"]
    )
    assert "wandb" not in summary["backends"]  # it gave the run no backend
    assert_records_complete(run_dir)
    assert not (run_dir / DIR).exists()


def test_an_unknown_wandb_mode_fails_the_start_of_a_run_that_requires_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(ReporterError, match=r"WANDB_MODE='sideways' is not a W&B mode.*'offline'"):
        wandb_only(tmp_path, required_plugins=["wandb"])
    assert not (tmp_path / "r").exists()  # the failed start left nothing behind


def not_a_directory(tmp_path: Path) -> Path:
    """Run ``r``'s W&B directory made a file."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / DIR).write_text("not a directory")
    return tmp_path / "r" / DIR


def test_a_wandb_run_that_cannot_start_leaves_its_backend_out_of_a_run_that_goes_on(
    tmp_path: Path,
) -> None:
    path = not_a_directory(tmp_path)
    run_dir = wandb_only(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "ok"
    health = summary["backends"]["wandb"]
    assert re.search(
        r"(?s)^ReporterError: cannot start the W&B run of 'r' in '.*/r/wandb'.*--block wandb",
        health["setup_error"],
    )
    assert health["records"] == health["records_lost"] > 0  # none reached W&B
    assert_records_complete(run_dir)
    assert path.read_text() == "not a directory"  # left as it was


def test_a_wandb_run_that_cannot_start_fails_the_start_of_a_run_that_requires_it(
    tmp_path: Path,
) -> None:
    path = not_a_directory(tmp_path)
    with pytest.raises(
        PluginError,
        match=r"(?s)required plugin 'wandb' could not open its backend: ReporterError: "
        r"cannot start the W&B run of 'r'.*--block wandb",
    ):
        wandb_only(tmp_path, required_plugins=["wandb"])
    assert path.read_text() == "not a directory"  # left as it was


def test_in_disabled_mode_the_run_goes_on_without_a_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = wandb_only(tmp_path, required_plugins=["wandb"])  # (opened on its thread)
    summary = summary_of(run_dir)
    assert summary["status"] == "ok"
    assert summary["backends"]["wandb"]["setup_error"] is None
    assert not list(run_dir.rglob("*.wandb"))


def test_loading_the_plugin_imports_no_wandb() -> None:
    code = "import sys, twinkle_wandb; print(sorted(m for m in sys.modules if 'wandb' in m))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert loaded.strip() == "['twinkle_wandb']"


def test_a_resume_interrupted_before_its_segment_leaves_no_wandb_run(tmp_path: Path) -> None:
    for first in (0, 2):  # segments 0 and 1: segment 1's run_resumed is fed again next
        run_dir = wandb_only(tmp_path, iterations=2, first_iteration=first)
    before = sorted(p.name for p in (run_dir / DIR).glob("offline-run-*"))
    plugins = [("wandb", WandbSink()), ("ctrl_c", CtrlCWhileResuming())]
    with pytest.raises(KeyboardInterrupt):
        scripted_run(tmp_path, "r", 1, first_iteration=4, autoload=False, plugins=plugins)
    assert sorted(p.name for p in (run_dir / DIR).glob("offline-run-*")) == before


def test_the_segment_after_a_crash_holds_every_record_of_the_crashed_one(tmp_path: Path) -> None:
    crashed_run(tmp_path, "r", 3, plugins={"wandb": "twinkle_wandb:WandbSink"})
    logged = list(read_jsonl(tmp_path / "r" / "events.jsonl"))
    assert [e["iteration"] for e in logged if e["type"] == "iteration_started"] == [0, 1, 2]
    assert "run_finished" not in {e["type"] for e in logged}  # it crashed
    run_dir = wandb_only(tmp_path, iterations=1, first_iteration=3)
    rows = history(inspect(run_dir)[-1])
    assert rows == expected_rows(run_dir)
    # 2: finished only by the resume, at the step of 1 (the crash took its optimizer
    # step with it), flagged partial: no row of its own, but in metrics_raw.jsonl
    assert {r["iteration"] for r in rows} == {0, 1, 3}
    assert {r.iteration for r in the_records(run_dir) if cut_short(r)} == {2}
