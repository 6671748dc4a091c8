"""ms-swift's GRPO observed by twinkle (twinkle.integrations.swift): real ``swift rlhf
--rlhf_type grpo`` runs of ms-swift 4.6 (with TRL 0.29) in ``.venv-swift``, which
``make test`` builds: through swift's command line (``--external_plugins "$(twinkle
swift-plugin)" --callbacks twinkle``) and its Python API, with a TRL trainer after it in
the same process, and a reward that raises. Tokens are checked against the completion
lengths swift logs itself, scalars against its ``logging.jsonl``, every figure
recomputed from the log, replay byte-identical. The batch reading is worked by hand."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from _swift_job import PROMPTS, swift_args, write_model

from _recompute import check_run, span_list
from twinkle.integrations._swift_run import counts_samples, encoded_sums
from twinkle.integrations.swift import OUT_DIR_ENV, RUN_ID_ENV, TwinkleSwiftCallback
from twinkle.run import replay

ROOT = Path(__file__).resolve().parents[2]
SWIFT_BIN = ROOT / ".venv-swift" / "bin"
JOB = Path(__file__).with_name("_swift_job.py")
FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")

needs_swift = pytest.mark.skipif(
    not (SWIFT_BIN / "swift").exists(),
    reason="needs ms-swift in .venv-swift (make swift-venv; make test builds it)",
)


def _run(command: list[str], **environ: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **environ}
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("swift")
    write_model(directory)
    return directory


@pytest.fixture(scope="module")
def cli_run(workdir: Path) -> tuple[Path, list[dict[str, Any]]]:
    """``swift rlhf`` as a swift user runs it: the run directory and swift's own log."""
    plugin = _run([str(SWIFT_BIN / "twinkle"), "swift-plugin"]).strip()
    out = workdir / "cli"
    args = swift_args(workdir, out, external_plugins=plugin)
    _run([str(SWIFT_BIN / "swift"), "rlhf", *args], **{RUN_ID_ENV: "cli"})
    (version,) = out.glob("v*")  # swift's versioned output directory
    logged = [json.loads(x) for x in (version / "logging.jsonl").read_text().splitlines()]
    return version / "twinkle" / "cli", logged


@needs_swift
def test_the_command_line_run_has_swift_generation_reward_and_training_spans(
    cli_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, _ = cli_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iterations"] == 3
    names: dict[int, set[str]] = defaultdict(set)
    for batch in _events(run_dir, "spans"):
        for span in span_list(batch):
            names[span["attrs"].get("iteration", -1)].add(span["name"])
    for iteration in range(3):
        assert {
            "step",
            "generate",  # swift's _generate_completions
            "GRPOTrainer.generate",  # swift's own timing of the engine, inside it
            "GRPOTrainer._compute_rewards_per_func",  # the reward phase
            "train.step",
            "train.optimizer",
        } <= names[iteration]
    config = _events(run_dir, "run_started")[0]["config"]
    assert config["phases"]["reward"] == ["GRPOTrainer._compute_rewards_per_func"]
    assert config["x_swift"] == {"trainer": "GRPOTrainer", "world_size": 1}
    # swift's default recomputes activations, set on the model (its argument turned off)
    assert config["mfu"]["recompute"] is True
    assert summary["seconds"]["reward_seconds"] > 0
    # a CPU generating token by token: generation leads the critical path
    limits = summary["limits"]
    assert limits["verdict"] in {"generation-bound", "mixed"}
    # (its margin varies with the machine's load: 0.52/0.18 idle, 0.44/0.23 under CI)
    assert limits["path_shares"]["generation"] > limits["path_shares"]["training"] > 0


@needs_swift
def test_tokens_are_the_completions_swift_counted(
    cli_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, logged = cli_run
    completions: dict[int, list[int]] = defaultdict(list)
    tokens = 0
    # chatml with a token per byte: <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n
    prompt_tokens = {19 + len(f"count from {i} to {i + 3}") for i in range(PROMPTS)}
    for event in _events(run_dir, "samples"):
        if event["phase"] == "rollout":
            prompts = event["prompt_lengths"]
            assert len(prompts) == len(event["lengths"]) == 2  # one group
            assert prompts[0] == prompts[1] and prompts[0] in prompt_tokens
            pairs = zip(event["lengths"], prompts, strict=True)
            completions[event["iteration"]] += [n - p for n, p in pairs]
            tokens += sum(event["lengths"])
    steps = [line for line in logged if "completions/mean_length" in line and "loss" in line]
    assert len(steps) == 3  # logging_steps 1: one line per step, then the closing one
    for iteration, line in enumerate(steps):
        got = completions[iteration]
        assert len(got) == 2  # num_generations 2, one prompt per step
        assert sum(got) / len(got) == line["completions/mean_length"]
        assert (min(got), max(got)) == (
            line["completions/min_length"],
            line["completions/max_length"],
        )
    counts = json.loads((run_dir / "summary.json").read_text())["counts"]
    assert tokens > 0 and counts["tokens_rollout"]["final"] == tokens
    assert counts["tokens_train"]["final"] == tokens  # each completion trained on once
    assert counts["samples_rollout"]["final"] == 6 and counts["groups_rollout"]["final"] == 3
    assert counts["optimizer_updates"]["discrepancy"] == 0


@needs_swift
def test_the_scalars_are_what_swift_writes_to_logging_jsonl(
    cli_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    run_dir, logged = cli_run
    start, *scalars = _events(run_dir, "scalars")
    # the train()'s start first (TRL's step 0, no step before), then swift's logs
    assert (start["name"], start["values"]) == (
        "swift.start",
        {"global_step": 0, "steps_before": 0},
    )
    assert [e["name"] for e in scalars] == ["swift"] * 3 + ["swift.train"]
    # (swift's last line is its closing record: the model, its checkpoints; not a log)
    assert all("last_model_checkpoint" in line for line in logged[len(scalars) :])
    for event, line in zip(scalars, logged[: len(scalars)], strict=True):
        values = dict(event["values"])
        assert values.pop("global_step") == event["iteration"] + 1
        # swift's progress callback, after twinkle's, adds its train speed and rounds
        numbers = {k: v for k, v in line.items() if isinstance(v, int | float)}
        numbers.pop("train_speed(s/it)")
        assert sorted(values) == sorted(numbers)
        for key, value in values.items():
            assert value == pytest.approx(numbers[key], abs=1e-8), key


@needs_swift
def test_the_figures_recompute_and_replay_gives_the_same_files(
    cli_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    run_dir, _ = cli_run
    check_run(run_dir)
    replay(run_dir, tmp_path / "again")
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (run_dir / name).read_bytes(), name


@needs_swift
def test_the_python_api_then_trl_in_the_same_process(workdir: Path) -> None:
    out = workdir / "api"
    said = json.loads(
        _run([str(SWIFT_BIN / "python"), str(JOB), "api", str(workdir), str(out)]).splitlines()[-1]
    )
    # twinkle put back the profiling functions of both libraries, and left TRL's trainer
    assert said == {
        "swift_profiling_restored": True,
        "trl_profiling_restored": True,
        "trainer_attributes": [],
    }
    swift_run = json.loads((out / "swift-api" / "summary.json").read_text())
    assert swift_run["status"] == "ok" and swift_run["counts"]["tokens_rollout"]["final"] > 0
    trl_run = json.loads((out / "trl-after" / "summary.json").read_text())
    assert trl_run["status"] == "ok" and trl_run["iterations"] == 2
    assert trl_run["counts"]["samples_train"]["final"] == 4
    trl_config = _events(out / "trl-after", "run_started")[0]["config"]
    assert trl_config["x_trl"]["trainer"] == "SFTTrainer" and "x_swift" not in trl_config
    names = {s["name"] for b in _events(out / "trl-after", "spans") for s in span_list(b)}
    assert names - {"twinkle.observe"} == {"step", "train.step", "train.optimizer"}


@needs_swift
def test_a_reward_that_raises_finishes_the_run_with_its_records(workdir: Path) -> None:
    out = workdir / "fail"
    said = json.loads(
        _run([str(SWIFT_BIN / "python"), str(JOB), "fail", str(workdir), str(out)]).splitlines()[-1]
    )
    assert said["raised"] == "the reward model is unreachable"
    assert said["restored"]  # swift's profiling_context is swift's again after the failure
    assert "unknown option(s) ['devics']" in said["refused"]
    run_dir = out / "swift-fail"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "error"
    assert summary["error"] == "ValueError: the reward model is unreachable"
    assert summary["counts"]["optimizer_updates"]["final"] == 1  # the step before it
    assert summary["counts"]["samples_rollout"]["final"] == 2
    check_run(run_dir)


def test_a_grpo_micro_batch_gives_each_sample_and_its_prompt() -> None:
    # Two samples padded to 5 positions: 3 and 5 tokens, of which 1 and 2 completion
    # tokens (swift's completion mask in the completion's frame: logits_to_keep wide).
    batch = {
        "model_inputs": {
            "input_ids": torch.zeros(2, 5, dtype=torch.long),
            "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
        },
        "grpo_batch": _Grpo(torch.tensor([[1, 0, 0], [1, 1, 0]])),
    }
    lengths, prompts = encoded_sums(batch)  # type: ignore[misc]
    assert lengths.tolist() == [3, 5] and prompts.tolist() == [2, 3]
    # padding-free: the same two samples packed in one row, cut where positions restart
    packed: dict[str, Any] = {
        "model_inputs": {
            "input_ids": torch.zeros(1, 8, dtype=torch.long),
            "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]),
        },
        "grpo_batch": _Grpo(torch.tensor([[1, 0, 0], [1, 1, 0]])),
    }
    lengths, prompts = encoded_sums(packed)  # type: ignore[misc]
    assert lengths.tolist() == [3, 5] and prompts.tolist() == [2, 3]
    packed["model_inputs"]["text_position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    lengths, prompts = encoded_sums(packed)  # type: ignore[misc]
    assert lengths.tolist() == [5, 3]  # (a multimodal model's text positions win)
    three = {**packed, "grpo_batch": _Grpo(torch.ones(3, 2))}
    assert encoded_sums(three) is None  # two packed samples, three completion rows
    mrope = {
        "model_inputs": {"position_ids": torch.zeros(3, 1, 8)},
        "grpo_batch": _Grpo(torch.ones(1, 2)),
    }
    assert encoded_sums(mrope) is None
    assert encoded_sums({"input_ids": torch.zeros(2, 5)}) is None  # not swift's GRPO batch
    assert encoded_sums([1, 2]) is None


class _Grpo:
    def __init__(self, completion_mask: Any) -> None:
        self.completion_mask = completion_mask


class _Args:
    output_dir = "/data/output/v3-20261203"
    resume_from_checkpoint: str | None = None


def test_the_callback_writes_beside_swifts_output_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OUT_DIR_ENV, raising=False)
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    callback = TwinkleSwiftCallback(_Args(), None)
    assert callback.out_dir == "/data/output/v3-20261203/twinkle" and callback.run_id is None
    monkeypatch.setenv(OUT_DIR_ENV, "/runs")
    monkeypatch.setenv(RUN_ID_ENV, "grpo-7b")
    callback = TwinkleSwiftCallback(_Args(), None)
    assert (callback.out_dir, callback.run_id) == ("/runs", "grpo-7b")
    given = TwinkleSwiftCallback(_Args(), None, out_dir="/elsewhere", run_id="mine")
    assert (given.out_dir, given.run_id) == ("/elsewhere", "mine")


def test_a_sequence_parallel_group_counts_its_samples_once() -> None:
    assert counts_samples(1, 0, -1)  # no sequence parallelism: every rank its own
    assert counts_samples(1, 3, -1)
    assert counts_samples(4, 0, -1) and not counts_samples(4, 1, -1)
    assert counts_samples(4, 0, 0) and not counts_samples(4, 0, 1)  # with ring attention


def test_a_resumed_swift_launch_without_the_runs_names_is_said_to_start_a_new_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(OUT_DIR_ENV, raising=False)
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    resumed = _Args()
    resumed.resume_from_checkpoint = "/data/output/v3-20261203/checkpoint-200"
    with caplog.at_level("WARNING", logger="twinkle.integrations.swift"):
        TwinkleSwiftCallback(resumed, None)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("checkpoint-200" in m for m in said)
    assert "no out_dir" in said[0] and "set TWINKLE_OUT_DIR (and TWINKLE_RUN_ID)" in said[0]
    assert "no run_id" in said[1]
    caplog.clear()
    monkeypatch.setenv(OUT_DIR_ENV, "/runs")
    monkeypatch.setenv(RUN_ID_ENV, "grpo-7b")
    TwinkleSwiftCallback(resumed, None)  # given both: it continues that run, silently
    TwinkleSwiftCallback(_Args(), None)  # not resumed: nothing to say
    assert not caplog.records
