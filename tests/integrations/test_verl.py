"""verl observed by twinkle (twinkle.integrations.verl): verl 0.9.1's real
``PPOTrainerSync.fit()`` on the CPU (tests/integrations/_verl_job.py, in .venv-verl, which
``make test`` builds) with ``trainer.logger=[console,twinkle]`` and the
``worker_process_setup_hook`` override. Every timer of verl is a span holding verl's own
``timing_s``; tokens are verl's ``perf/total_num_tokens``; verl's ``perf/throughput`` is
recomputed from the log; a failed step finishes the run with its records."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from _recompute import check_run, span_list
from twinkle.errors import ConfigError
from twinkle.integrations._verl_resume import resume_choice
from twinkle.integrations.verl import PHASES, RESUME_ENV, RUN_ID_ENV, observer_config
from twinkle.report import format_report, load_report
from twinkle.run import replay

ROOT = Path(__file__).resolve().parents[2]
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
JOB = Path(__file__).with_name("_verl_job.py")
FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")

needs_verl = pytest.mark.skipif(
    not VERL_PY.exists(), reason="needs verl in .venv-verl (make verl-venv; make test builds it)"
)


def _job(
    out: Path, run_id: str, steps: int, fail_at: int = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "TWINKLE_OUT_DIR": str(out),
        RUN_ID_ENV: run_id,
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "disabled",
        **env,
    }
    command = [str(VERL_PY), str(JOB), str(out / "job"), str(steps), str(fail_at)]
    return subprocess.run(
        command, check=False, env=environ, capture_output=True, text=True, timeout=600, cwd=out
    )


def _fit(out: Path, run_id: str, steps: int, fail_at: int = 0, **env: str) -> dict[str, Any]:
    done = _job(out, run_id, steps, fail_at, **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return said


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def _spans(run_dir: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Per iteration, per name, the spans of verl's timers."""
    out: dict[int, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for batch in _events(run_dir, "spans"):
        for span in span_list(batch):
            if "iteration" in span["attrs"]:
                out[span["attrs"]["iteration"]][span["name"]].append(span)
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("verl")
    said = _fit(out, "verl", steps=3)
    return out / "verl", said


@needs_verl
def test_every_verl_timer_is_a_span_holding_its_timing(
    fitted: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, said = fitted
    assert said["hooked"]  # the worker_process_setup_hook ran install() in a Ray worker
    assert said["restored"]  # verl's timer and the trainer's method are verl's again
    logged = said["logged"]
    assert [line["step"] for line in logged] == [1, 2, 3]
    spans = _spans(run_dir)
    for iteration, line in enumerate(logged):
        timings = {k.removeprefix("timing_s/"): v for k, v in line.items() if "timing_s/" in k}
        assert {"step", "gen", "old_log_prob", "ref", "adv", "update_actor"} <= set(timings)
        for name, seconds in timings.items():
            (span,) = spans[iteration][name]
            took = (span["end_ns"] - span["start_ns"]) / 1e9
            assert seconds <= took <= seconds + 1e-3, (iteration, name, took, seconds)


@needs_verl
def test_tokens_and_throughput_are_verls(fitted: tuple[Path, dict[str, Any]]) -> None:
    run_dir, said = fitted
    tokens: dict[int, int] = defaultdict(int)
    for event in _events(run_dir, "samples"):
        if event["phase"] == "rollout":
            tokens[event["iteration"]] += sum(event["lengths"])
            assert event["groups"] == len(event["lengths"]) // 2  # rollout.n 2
    spans = _spans(run_dir)
    records = [json.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    window = {
        r["iteration"]: r["values"]["tokens_per_s_per_device"]
        for r in records
        if r["kind"] == "iteration" and r["scope"] == "iteration"
    }
    for iteration, line in enumerate(said["logged"]):
        assert tokens[iteration] == line["perf/total_num_tokens"]
        (step,) = spans[iteration]["step"]
        step_seconds = (step["end_ns"] - step["start_ns"]) / 1e9
        # verl's figure: the step's tokens over its step timer, per GPU (1 here)
        assert line["perf/throughput"] == pytest.approx(tokens[iteration] / step_seconds, rel=2e-3)
        # twinkle's window also holds what follows the step: metrics, logging
        assert window[iteration] < line["perf/throughput"]
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["tokens_rollout"]["final"] == sum(tokens.values())
    assert counts["optimizer_updates"]["final"] == 3
    # the summary sets verl's own figures beside twinkle's
    compare = summary["compare"]
    assert compare["throughput"]["iterations"] == 3
    assert compare["throughput"]["max_relative_difference"] < 2e-3
    for name in ("step", "gen", "old_log_prob", "ref", "adv", "update_actor"):
        seconds = compare["seconds"][name]
        assert seconds["key"] == f"timing_s/{name}" and seconds["iterations"] == 3
        assert 0 <= seconds["max_difference_seconds"] <= 1e-3
    # and the report says them under its throughput
    text = format_report(load_report(run_dir))
    assert "verl's own          perf/throughput " in text and "(mean of 3 steps)" in text
    assert "  timers            " in text and "never logged: " in text


@needs_verl
def test_the_run_recomputes_and_replays(
    fitted: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    run_dir, said = fitted
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iterations"] == 3
    config = _events(run_dir, "run_started")[0]["config"]
    assert config["x_verl"] == {
        "project": "verl_cpu",
        "experiment": "fit_cpu",
        "trainer": "PPOTrainerSync",
        "mode": "sync",
    }
    scalars = _events(run_dir, "scalars")
    assert [e["values"]["global_step"] for e in scalars] == [1, 2, 3]
    for event, line in zip(scalars, said["logged"], strict=True):
        assert event["values"]["perf/throughput"] == line["perf/throughput"]
    check_run(run_dir)
    replay(run_dir, tmp_path / "again")
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (run_dir / name).read_bytes(), name


@needs_verl
def test_a_failed_step_finishes_the_run_with_its_records(tmp_path: Path) -> None:
    said = _fit(tmp_path, "fails", steps=3, fail_at=2)
    assert said["error"] == "the actor update of step 2 ran out of memory"
    assert said["restored"]
    run_dir = tmp_path / "fails"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "error"
    assert summary["error"] == "RuntimeError: the actor update of step 2 ran out of memory"
    assert summary["counts"]["optimizer_updates"]["final"] == 1  # step 1's, kept
    (failed,) = _spans(run_dir)[1]["update_actor"]
    assert failed["error"] is not None
    check_run(run_dir)
    # Relaunched without a checkpoint (verl saves none here), the job trains from
    # scratch: the run goes on, and says that its step 1 is done and counted again.
    again = _job(tmp_path, "fails", steps=1)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (
        "run 'fails' logged verl's global step 1, and this fit() starts at global step 0 "
        "(its checkpoint's, or 0 without one): the steps after it, to 1, are done again"
    ) in again.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["optimizer_updates"]["final"] == 2


@needs_verl
def test_a_job_relaunched_on_a_finished_run_is_refused_naming_the_switch_or_continues(
    tmp_path: Path,
) -> None:
    """The job relaunched with the finished run's ``TWINKLE_RUN_ID`` trains from scratch
    (``trainer.resume_mode=auto``, verl's default, finds no checkpoint: it saves none):
    refused before training, naming the fix; with ``TWINKLE_RESUME=1`` it continues
    the run."""
    _fit(tmp_path, "again", steps=1)
    refused = _job(tmp_path, "again", steps=1, VERL_RESUME_MODE="auto")
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "run 'again'" in said and "finished ok" in said
    assert "verl trains from scratch (no checkpoint to resume from): give another" in said
    assert "or set TWINKLE_RESUME=1 in the trainer's environment" in said
    _fit(tmp_path, "again", steps=1, TWINKLE_RESUME="1")
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert [s["status"] for s in summary["segments"]] == ["ok", "ok"]
    assert summary["iterations"] == 2


def test_the_configuration_groups_verls_timers() -> None:
    config = observer_config(devices=8, total_steps=100)
    assert config["phases"] == PHASES
    assert config["compare"]["seconds"]["update_actor"] == "timing_s/update_actor"
    assert config["compare"]["throughput"]["devices"] == 8
    assert config["phases"]["train"] == [
        "old_log_prob",
        "ref",
        "values",
        "update_critic",
        "update_actor",
    ]
    assert config["window"] == {"samples": "rollout", "devices": 8}
    assert config["total_steps"] == 100
    assert "total_steps" not in observer_config(devices=1, total_steps=None)
    # separate_async: the rollout's own GPUs count in verl's denominator, not the
    # trainer's; gen only waits for samples generated beside training
    apart = observer_config(devices=12, total_steps=None, train_devices=8, mode="separate_async")
    assert apart["throughput"] == {"train": {"samples": "train", "devices": 8}}
    assert apart["window"]["devices"] == 12
    assert apart["phases"]["switch"] == ["switch_to_trainer", "switch_wait", "switch_to_rollout"]


@pytest.mark.parametrize(
    ("said", "mode", "expected"),
    [
        (None, "auto", None),  # no checkpoint (or no verl here): verl trains from scratch
        (None, "resume_path", True),  # verl resumes from that checkpoint: so does the run
        (None, "disable", None),  # verl trains from scratch: a finished run is refused
        ("1", "disable", True),
        ("0", "auto", False),
        (" Yes ", None, True),
    ],
)
def test_whether_a_finished_run_continues_follows_verl_unless_the_environment_says(
    said: str | None, mode: str | None, expected: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if said is None:
        monkeypatch.delenv(RESUME_ENV, raising=False)
    else:
        monkeypatch.setenv(RESUME_ENV, said)
    assert resume_choice({"trainer": {"resume_mode": mode}}) is expected


def test_a_resume_switch_it_cannot_read_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(RESUME_ENV, "maybe")
    with pytest.raises(ConfigError, match=r"TWINKLE_RESUME='maybe': give 1 .* or 0"):
        resume_choice({})


def test_auto_continues_a_finished_run_only_when_verl_finds_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's own look-up (stood in for here) of the latest checkpoint in
    ``trainer.default_local_dir``, relative to the working directory, decides."""
    import sys
    import types

    asked: list[str] = []

    def find_latest_ckpt_path(path: str) -> str | None:
        asked.append(path)
        return f"{path}/global_step_3" if path.endswith("ckpts") else None

    names: tuple[str, ...] = ("verl", "verl.utils", "verl.utils.checkpoint")
    names += (f"{names[-1]}.checkpoint_manager",)
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].find_latest_ckpt_path = find_latest_ckpt_path  # type: ignore[attr-defined]
    monkeypatch.delenv(RESUME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert resume_choice({"trainer": {"resume_mode": "auto", "default_local_dir": "ckpts"}}) is True
    assert resume_choice({"trainer": {"resume_mode": "auto", "default_local_dir": "none"}}) is None
    assert asked == [str(tmp_path / "ckpts"), str(tmp_path / "none")]


def test_padding_samples_are_left_out_counted_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl pads a batch of 3 samples to 4 with a no-op sample of 128 tokens: the run's
    tokens are the 3 real ones' (8 + 6 + 7 = 21), the 'verl' scalars hold the padding
    (1 sample, 128 tokens), and the log says why verl's token count is 149."""
    from twinkle.integrations import verl

    # (verl's timers are not patched here: .venv has no verl; the run's own calls are)
    monkeypatch.setattr(verl, "TIMERS", SimpleNamespace(acquire=id, release=id))
    monkeypatch.setenv("TWINKLE_OUT_DIR", str(tmp_path))
    monkeypatch.setenv(RUN_ID_ENV, "pad")
    run = verl.VerlRun("p", "e", {"actor_rollout_ref": {"rollout": {"n": 3}}}, None)
    tags = [{"prompt_len": 3, "response_len": r} for r in (5, 3, 4)]
    tags.append({"prompt_len": 128, "response_len": 0, "is_padding": True})
    with run.timed("step"):
        run._samples(tags)
    run.log({"perf/total_num_tokens": 149}, step=1)
    run.finish(0)
    summary = json.loads((tmp_path / "pad" / "summary.json").read_text())
    assert summary["counts"]["tokens_rollout"]["accumulated"] == 21
    (scalars,) = [e["values"] for e in _events(tmp_path / "pad", "scalars") if e["name"] == "verl"]
    assert (scalars["padding_samples"], scalars["padding_tokens"]) == (1, 128)
    assert "verl padded iteration 0's batch with 1 no-op sample(s) of 128 tokens" in caplog.text


def test_only_a_fit_behind_the_last_logged_step_is_said_to_redo_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three jobs on one run: steps 1-3, then from checkpoint 2 (step 3 redone: said),
    steps 3-5, then from checkpoint 5 (nothing redone: not said, though the run has
    counted 6 steps to verl's 5)."""
    from twinkle.integrations import verl

    monkeypatch.setattr(verl, "TIMERS", SimpleNamespace(acquire=id, release=id))
    monkeypatch.setenv("TWINKLE_OUT_DIR", str(tmp_path))
    monkeypatch.setenv(RUN_ID_ENV, "r")
    said = []
    for start, stop in ((0, 3), (2, 5), (5, 6)):
        caplog.clear()
        trainer = SimpleNamespace(global_steps=start, _compute_metrics=lambda *a, **k: None)
        run = verl.VerlRun("p", "e", {}, trainer)
        for step in range(start + 1, stop + 1):
            with run.timed("step"):
                pass
            run.log({"actor/loss": 0.5}, step=step)
        run.finish(1 if stop < 6 else 0)
        said.append([r.getMessage() for r in caplog.records if "done again" in r.getMessage()])
    assert said[0] == [] and said[2] == []
    (redo,) = said[1]
    assert "logged verl's global step 3, and this fit() starts at global step 2" in redo
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["counts"]["optimizer_updates"]["final"] == 3 + 3 + 1
