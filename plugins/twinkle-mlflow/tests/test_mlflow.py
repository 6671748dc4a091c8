"""The plugin against real runs, read back with MLflow's own client from its sqlite store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from twinkle_mlflow import (
    DIR,
    EXPERIMENT,
    STORE,
    MlflowBackend,
    MlflowSink,
    _make_store,
    metric_name,
)

from twinkle.errors import PluginError
from twinkle.plugins import PluginStatus, describe_plugins
from twinkle.reporting import cut_short, flat_key, make_record, read_jsonl, record_from_dict
from twinkle.run import RunSession, replay
from twinkle.testing import (
    SCRIPTED_CONFIG,
    CtrlCWhileResuming,
    crashed_run,
    scripted_run,
    shared_writable,
    umask,
)

Points = dict[str, list[tuple[int, int, float]]]


@pytest.fixture(autouse=True)
def own_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the plugin's default
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # nothing leaves the machine
    yield


def client_of(run_dir: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{run_dir / DIR / 'mlflow.db'}")


def runs_of(client: MlflowClient) -> list[Run]:
    """The store's live MLflow runs of experiment twinkle, oldest first."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])
    return list(found)


def points(client: MlflowClient, run: Run) -> Points:
    """Every metric point of ``run``: (step, timestamp ms, value), in order."""
    return {
        key: sorted(
            (m.step, m.timestamp, m.value) for m in client.get_metric_history(run.info.run_id, key)
        )
        for key in run.data.metrics
    }


def expected(run_dir: Path) -> Points:
    """What the run's records say MLflow must hold (but an iteration cut short)."""
    want: Points = {}
    for line in read_jsonl(run_dir / "metrics_raw.jsonl"):
        record = record_from_dict(line)
        if cut_short(record):
            continue
        for key, value in record.values.items():
            if value is not None:
                point = (record.step, record.wall_ns // 1_000_000, float(value))
                want.setdefault(flat_key(record, key), []).append(point)
    return {key: sorted(set(p)) for key, p in want.items()}  # (MLflow keeps one of equal points)


def mlflow_only(tmp_path: Path, run_id: str = "r", iterations: int = 3, **kw: Any) -> Path:
    log = scripted_run(
        tmp_path, run_id, iterations, autoload=False, plugins=[("mlflow", MlflowSink())], **kw
    )
    return log.parent


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MlflowClient, Run]:
    run_dir = mlflow_only(tmp_path_factory.mktemp("logged"))
    client = client_of(run_dir)
    (run,) = runs_of(client)
    return run_dir, client, run


def test_every_value_of_every_record_is_a_metric_point(
    logged: tuple[Path, MlflowClient, Run],
) -> None:
    run_dir, client, run = logged
    got, want = points(client, run), expected(run_dir)
    assert got == want  # exact float64, at the optimizer step
    assert {k.split("/")[0] for k in want} >= {"rollout", "timing", "memory", "run", "window"}
    assert [s for s, _, _ in got["grpo/loss"]] == [1, 2, 3]


def test_the_mlflow_run_is_the_twinkle_run_with_its_configuration(
    logged: tuple[Path, MlflowClient, Run],
) -> None:
    run_dir, client, run = logged
    assert (run.info.run_name, run.info.status) == ("r", "FINISHED")
    assert run.data.tags["twinkle.run_id"] == "r"
    config = client.download_artifacts(run.info.run_id, "config.json", str(run_dir.parent))
    assert json.loads(Path(config).read_text()) == SCRIPTED_CONFIG
    assert (run_dir / DIR / "mlflow.db").is_file()  # the store is the run directory's


def test_a_resumed_segment_that_fails_ends_its_mlflow_run_failed(tmp_path: Path) -> None:
    mlflow_only(tmp_path, iterations=1)
    with (
        pytest.raises(RuntimeError, match="boom"),
        RunSession(
            out_dir=tmp_path,
            run_id="r",
            config=SCRIPTED_CONFIG,
            autoload=False,
            plugins=[("mlflow", MlflowSink())],
            resume=True,
        ) as run,
    ):
        run.bus.iteration_started(1)
        raise RuntimeError("boom")
    ok, failed = runs_of(client_of(tmp_path / "r"))
    assert [(r.info.run_name, r.info.status) for r in (ok, failed)] == [
        ("r", "FINISHED"),
        ("r-s1", "FAILED"),  # not the earlier segment's ok, fed again
    ]


def test_an_mlflow_run_a_killed_attempt_left_running_is_ended_killed_by_the_next_segment(
    tmp_path: Path,
) -> None:
    crashed_run(tmp_path, "r", 2)  # killed outright
    # What the attempt's MLflow backend left, had it opened before the kill (it opens on
    # a thread of its own, in the first seconds: a job killed sooner leaves no MLflow
    # run): an MLflow run never ended.
    MlflowBackend(tmp_path / "r" / DIR, twinkle_run_id="r").open()
    (left,) = runs_of(client_of(tmp_path / "r"))
    assert left.info.status == "RUNNING"  # nobody ended it
    run_dir = mlflow_only(tmp_path, iterations=1, first_iteration=2)
    client = client_of(run_dir)
    killed, newest = runs_of(client)
    assert (killed.info.status, newest.info.status) == ("KILLED", "FINISHED")
    assert points(client, newest) == expected(run_dir)


def test_a_relative_out_dir_keeps_store_and_artifacts_in_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = mlflow_only(Path("runs"), iterations=1)
    client = client_of(tmp_path / run_dir)
    (run,) = runs_of(client)
    assert run.info.artifact_uri.startswith((tmp_path / run_dir / DIR).as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing in the cwd


def test_names_mlflow_refuses_are_made_fit_and_the_batch_is_kept(tmp_path: Path) -> None:
    with RunSession(
        out_dir=tmp_path, run_id="odd", autoload=False, plugins=[("mlflow", MlflowSink())]
    ) as run:
        run.bus.iteration_started(0)
        run.bus.scalars(iteration=0, name="reward.v2", values={"mean%": 0.5, "x" * 300: 1.0})
    client = client_of(tmp_path / "odd")
    (found,) = runs_of(client)
    assert found.data.metrics["reward.v2/mean_"] == 0.5
    assert found.data.metrics["reward.v2/" + "x" * 240] == 1.0  # 250 characters
    record = make_record(
        kind="grpo",
        scope="run",
        run_id="odd",
        step=1,
        iteration=0,
        wall_ns=0,
        monotonic_ns=0,
        values={"c": 1},
    )
    assert metric_name(record, "d:e f.g-h%+") == "run/grpo/d:e f.g-h__"


def test_each_resumed_segment_logs_the_whole_run_into_an_mlflow_run_of_its_own(
    tmp_path: Path,
) -> None:
    for first in (0, 2):  # segments 0 and 1
        run_dir = mlflow_only(tmp_path, iterations=2, first_iteration=first)
    client = client_of(run_dir)
    first_run, newest = runs_of(client)
    assert (first_run.info.run_name, newest.info.run_name) == ("r", "r-s1")
    assert newest.data.tags["twinkle.segment"] == "1"
    assert points(client, newest) == expected(run_dir)  # every record, once
    assert (first_run.info.status, newest.info.status) == ("FINISHED", "FINISHED")
    assert [s for s, _, _ in points(client, first_run)["grpo/loss"]] == [1, 2]  # as it was


def test_a_resume_interrupted_before_its_segment_leaves_no_mlflow_run(tmp_path: Path) -> None:
    for first in (0, 2):  # segments 0 and 1: segment 1's run_resumed is fed again next
        run_dir = mlflow_only(tmp_path, iterations=2, first_iteration=first)
    plugins = [("mlflow", MlflowSink()), ("ctrl_c", CtrlCWhileResuming())]
    with pytest.raises(KeyboardInterrupt):
        scripted_run(tmp_path, "r", 1, first_iteration=4, autoload=False, plugins=plugins)
    assert [r.info.run_name for r in runs_of(client_of(run_dir))] == ["r", "r-s1"]


def test_its_store_is_writable_by_its_owner_alone_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):  # (MLflow makes its artifacts' directories 0777 and files 0666)
        mlflow_only(tmp_path, iterations=2)
        run_dir = mlflow_only(tmp_path, iterations=1, first_iteration=2)  # resumed
    assert [r.info.run_name for r in runs_of(client_of(run_dir))] == ["r", "r-s1"]
    assert shared_writable(run_dir) == []


def test_replay_logs_every_record_again(tmp_path: Path) -> None:
    run_dir = mlflow_only(tmp_path / "live")
    out = tmp_path / "replayed"
    replay(run_dir, out, autoload=False, plugins=[("mlflow", MlflowSink())])
    client = client_of(out)
    (run,) = runs_of(client)
    assert points(client, run) == expected(run_dir)


def test_installed_it_loads_through_the_entry_point(tmp_path: Path) -> None:
    info = {p.name: p for p in describe_plugins()}["mlflow"]
    assert (info.builtin, info.status, info.distribution) == (
        False,
        PluginStatus.LOADS,
        "twinkle-mlflow 0.1.0",
    )
    others = [p.name for p in describe_plugins() if not p.builtin and p.name != "mlflow"]
    run_dir = scripted_run(tmp_path, "auto", 2, blocked=others).parent  # autoload on
    client = client_of(run_dir)
    (run,) = runs_of(client)
    assert points(client, run) == expected(run_dir)


def test_a_tracking_uri_in_the_environment_is_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # (MLflow puts such a store's artifacts in ./mlruns)
    store = tmp_path / "shared.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "grpo-runs")
    a = mlflow_only(tmp_path / "runs", "a", iterations=1)
    b = mlflow_only(tmp_path / "runs", "b", iterations=1)
    assert not (a / DIR / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("grpo-runs")
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])
    assert [r.info.run_name for r in found] == ["a", "b"]
    assert points(client, found[1]) == expected(b)
    for run in found:  # the artifacts are the store's, not inside the first run directory
        assert not run.info.artifact_uri.startswith(a.as_uri())


def summary_of(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def test_a_store_it_cannot_open_leaves_its_backend_out_of_a_run_that_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")
    run_dir = mlflow_only(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "ok"
    health = summary["backends"]["mlflow"]
    assert re.search(
        r"(?s)^ReporterError: cannot start the MLflow run of 'r' in 'nosuchscheme://x'.*"
        r"MLFLOW_TRACKING_URI.*--block mlflow",
        health["setup_error"],
    )
    assert health["records"] == health["records_lost"] > 0  # none reached MLflow
    want = expected(run_dir)  # the run's own records are all there
    assert [s for s, _, _ in want["grpo/loss"]] == [1, 2, 3]
    assert "run/run/iterations" in want
    assert not (run_dir / DIR).exists()  # (a tracking URI: no store of the run's own)


def test_a_store_it_cannot_open_fails_the_start_of_a_run_that_requires_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")
    with pytest.raises(
        PluginError,
        match=r"(?s)required plugin 'mlflow' could not open its backend: ReporterError: "
        r"cannot start the MLflow run of 'r' in 'nosuchscheme://x'.*--block mlflow",
    ):
        mlflow_only(tmp_path, required_plugins=["mlflow"])
    assert not (tmp_path / "r").exists()  # the failed start left nothing behind


def test_a_store_a_killed_attempt_left_half_made_is_made_again_and_one_never_appears(
    tmp_path: Path,
) -> None:
    """MLflow makes the run's own store's tables under another name: what a process
    killed meanwhile left there is made again, and the store's name only ever holds a
    whole store."""
    own = tmp_path / "r" / DIR
    own.mkdir(parents=True)
    (own / f"{STORE}.making-1-0").write_bytes(b"half a store")
    (own / f"{STORE}.making-1-0-journal").write_bytes(b"its journal")
    run_dir = mlflow_only(tmp_path)
    assert sorted(p.name for p in own.iterdir() if p.name.startswith(STORE)) == [STORE]
    client = client_of(run_dir)
    (run,) = runs_of(client)
    assert points(client, run) == expected(run_dir)
    # moved away (its error's fix), it is made again in this process too
    (own / STORE).rename(own / "moved.db")
    _make_store(own / STORE)
    assert client_of(run_dir).search_experiments()


def test_a_store_of_its_own_it_cannot_open_says_to_move_it_away(tmp_path: Path) -> None:
    own = tmp_path / "r" / DIR
    own.mkdir(parents=True)
    (own / STORE).write_bytes(b"not sqlite")  # (what no MLflow can read)
    health = summary_of(mlflow_only(tmp_path))["backends"]["mlflow"]
    assert f"move '{own.absolute() / STORE}' away if MLflow cannot read it" in health["setup_error"]


def test_loading_the_plugin_imports_no_mlflow() -> None:
    code = "import sys, twinkle_mlflow; print(sorted(m for m in sys.modules if 'mlflow' in m))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert loaded.strip() == "['twinkle_mlflow']"
