"""TwinkleCallback on a real TRL ``GRPOTrainer`` and a plain transformers ``Trainer``
(tiny Llama and tokenizer made in code, CPU): one run per ``train()``, counts equal to
TRL's, figures recomputed from the log, replay byte-identical, spans on TRL's
boundaries, the trainer left as it was, failures finishing the run with its records."""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("trl")

import torch
from datasets import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)
from trl import GRPOConfig, GRPOTrainer

from _recompute import check_run, span_list
from twinkle.demo.hf import tiny_llama, write_tokenizer
from twinkle.errors import InvalidArgumentError, ResumeConfigError, TwinkleError
from twinkle.integrations.trl import TwinkleCallback, observer_config
from twinkle.metric import generation_flops, model_shape, training_flops
from twinkle.run import replay

FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")
PROMPTS = ["<s>123<sep>", "<s>4051<sep>", "<s>77<sep>", "<s>9102<sep>"] * 8


def _digits_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [sum(c.isdigit() for c in text) / 8 for text in completions]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    directory = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(directory)
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(str(directory))
    return tokenizer


def grpo(
    tmp: Path,
    tokenizer: PreTrainedTokenizerFast,
    callback: TwinkleCallback,
    *,
    steps: int = 3,
    reward: Any = _digits_reward,
    eval_dataset: Dataset | None = None,
    **config: Any,
) -> GRPOTrainer:
    args = {
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "logging_steps": 1,
        "save_strategy": "no",
        **config,
    }
    return GRPOTrainer(
        model=tiny_llama(seed=0),
        processing_class=tokenizer,
        reward_funcs=[reward],
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        eval_dataset=eval_dataset,
        args=GRPOConfig(
            output_dir=str(tmp / "trl"),
            max_steps=steps,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            **args,
        ),
        callbacks=[callback],
    )


@dataclass
class Trained:
    trainer: GRPOTrainer
    callback: TwinkleCallback
    out: Path
    run_dir: Path
    events: list[dict[str, Any]]
    summary: dict[str, Any]
    logs: list[dict[str, Any]]

    def spans(self, name: str | None = None) -> list[dict[str, Any]]:
        every = [s for e in self.events if e["type"] == "spans" for s in span_list(e)]
        return [s for s in every if name is None or s["name"] == name]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


def _read(trainer: Any, callback: TwinkleCallback, out: Path) -> Trained:
    assert callback.session is not None and callback.session.out_dir is not None
    run_dir = Path(callback.session.out_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return Trained(trainer, callback, out, run_dir, events, summary, trainer.state.log_history)


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerFast
) -> Trained:
    """4 GRPO steps, 2 micro-batches per step (generation once per step)."""
    tmp = tmp_path_factory.mktemp("grpo")
    callback = TwinkleCallback(out_dir=str(tmp / "runs"))
    trainer = grpo(tmp, tokenizer, callback, steps=4, gradient_accumulation_steps=2)
    trainer.train()
    return _read(trainer, callback, tmp / "runs")


def test_one_train_call_is_one_finished_run(trained: Trained) -> None:
    assert [p.name for p in trained.out.iterdir()] == [trained.run_dir.name]
    assert sorted(
        p.name for p in trained.run_dir.iterdir() if not p.name.startswith(".")
    ) == sorted((*FILES, "checkpoint.bin"))  # (a finished segment's: resumes from it)
    assert trained.summary["status"] == "ok" and trained.summary["error"] is None
    assert trained.summary["iterations"] == 4


def test_optimizer_steps_and_tokens_equal_trls(trained: Trained) -> None:
    state = trained.trainer.state
    counts = trained.summary["counts"]
    steps = trained.of_type("optimizer_step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4] == list(range(1, state.global_step + 1))
    assert counts["optimizer_updates"] == {
        "accumulated": 4,
        "terminal": 4,
        "final": 4,
        "discrepancy": 0,
    }
    rollout = [e for e in trained.of_type("samples") if e["phase"] == "rollout"]
    tokens = sum(sum(e["lengths"]) for e in rollout)
    assert tokens == state.num_input_tokens_seen > 0
    assert counts["tokens_rollout"]["accumulated"] == counts["tokens_rollout"]["terminal"] == tokens
    assert counts["tokens_rollout"]["discrepancy"] == 0
    # per step: the rollout tokens are the growth of TRL's logged num_tokens
    logged = [log["num_tokens"] for log in trained.logs if "num_tokens" in log]
    per_iteration = Counter[int]()
    for e in rollout:
        per_iteration[e["iteration"]] += sum(e["lengths"])
    growth = [b - a for a, b in zip([0, *logged], logged, strict=False)]
    assert [per_iteration[i] for i in range(4)] == growth
    # 16 completions a step (2 micro-batches of 8), 4 groups of 4
    assert [len(e["lengths"]) for e in rollout] == [16] * 4
    assert [e["groups"] for e in rollout] == [4] * 4
    train = [e for e in trained.of_type("samples") if e["phase"] == "train"]
    assert [len(e["lengths"]) for e in train] == [16] * 4
    assert [e["samples"] for e in steps] == [16] * 4
    # each generated sample is trained on once here: the same token total
    assert sum(sum(e["lengths"]) for e in train) == tokens


def test_the_figures_recompute_from_the_log(trained: Trained) -> None:
    run = check_run(trained.run_dir)
    assert run["generation_hidden_seconds"] == 0.0  # TRL generates, then trains
    window = trained.summary["window"]
    assert window["tokens"] == trained.trainer.state.num_input_tokens_seen
    records = [
        json.loads(x) for x in (trained.run_dir / "metrics_raw.jsonl").read_text().splitlines()
    ]
    (rollout,) = [r for r in records if r["kind"] == "rollout" and r["scope"] == "window"]
    assert rollout["values"]["tokens"] == window["tokens"]


def test_the_run_gets_a_verdict_on_what_limits_it(trained: Trained) -> None:
    """TRL generates, then trains, on one thread: the critical path is where the time
    went, and the verdict names a side or says why not."""
    limits = trained.summary["limits"]
    assert limits["verdict"] in {"training-bound", "generation-bound", "mixed", "abstain"}
    assert limits["reason"]
    assert limits["path_seconds"]["training"] > 0 and limits["path_seconds"]["generation"] > 0
    assert sum(limits["windows"].values()) == 4


def test_replay_gives_the_same_five_files(trained: Trained, tmp_path: Path) -> None:
    replay(trained.run_dir / "events.jsonl", tmp_path / "again")
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (trained.run_dir / name).read_bytes(), (
            name
        )


def test_spans_follow_trls_boundaries(trained: Trained) -> None:
    names = Counter(s["name"] for s in trained.spans())
    assert names["step"] == names["train.optimizer"] == 4
    assert names["train.step"] == 8  # one per micro-batch
    assert names["generate"] == 4  # one generation batch per step
    # TRL's own profiling contexts, under TRL's names
    for trl_name in (
        "GRPOTrainer.transformers.generate",
        "GRPOTrainer._calculate_rewards",
        "GRPOTrainer._digits_reward",
        "GRPOTrainer._prepare_inputs",
        "GRPOTrainer.compute_loss",
    ):
        assert names[trl_name] >= 4, trl_name
    boundaries = [e["monotonic_ns"] for e in trained.of_type("iteration_started")]
    finish = trained.of_type("run_finished")[0]["monotonic_ns"]
    ends = [*boundaries[1:], finish]
    for span in trained.spans():
        if span["name"] == "twinkle.observe":
            continue
        it = span["attrs"]["iteration"]
        assert boundaries[it] <= span["start_ns"] <= span["end_ns"] <= ends[it], span
    by_it = {
        (s["name"], s["attrs"]["iteration"]): s
        for s in trained.spans()
        if s["name"] not in ("train.step", "twinkle.observe")
    }
    for it in range(4):
        step, gen = by_it["step", it], by_it["generate", it]
        inner = by_it["GRPOTrainer.transformers.generate", it]
        assert step["start_ns"] <= gen["start_ns"] <= inner["start_ns"]
        assert inner["end_ns"] <= gen["end_ns"] <= by_it["train.optimizer", it]["start_ns"]
        assert by_it["train.optimizer", it]["end_ns"] <= step["end_ns"]


def test_memory_and_trls_logged_figures_are_recorded(trained: Trained) -> None:
    assert trained.summary["memory_readings"] == 4
    readings = trained.of_type("memory")
    assert [e["iteration"] for e in readings] == [0, 1, 2, 3]
    spans = {e["source"] for e in trained.of_type("spans")} - {"twinkle.observers"}
    assert {r["worker_id"] for e in readings for r in e["readings"]} == spans == {"main"}
    scalars = {(e["name"], e["iteration"]): e["values"] for e in trained.of_type("scalars")}
    logs = [log for log in trained.logs if "loss" in log]
    for it, log in enumerate(logs):
        assert scalars["trl", it]["reward"] == log["reward"]
        assert scalars["trl", it]["num_tokens"] == log["num_tokens"]
    assert scalars["trl.train", 3]["train_runtime"] == trained.logs[-1]["train_runtime"]


def test_the_trainer_is_left_as_it_was(trained: Trained) -> None:
    import trl.extras.profiling
    import trl.trainer.grpo_trainer

    for name in ("training_step", "_prepare_inputs", "_generate", "_twinkle_observed"):
        assert name not in vars(trained.trainer), name
    original = trl.extras.profiling.ProfilingContext
    assert trl.trainer.grpo_trainer.profiling_context is trl.extras.profiling.profiling_context
    assert trl.extras.profiling.profiling_context.__module__ == "trl.extras.profiling"
    assert original.__enter__.__module__ == "trl.extras.profiling"


def test_a_raising_reward_function_finishes_the_run_as_an_error_keeping_its_records(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    calls = []

    def flaky(completions: list[str], **kwargs: Any) -> list[float]:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the reward server went away")
        return [0.0] * len(completions)

    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = grpo(tmp_path, tokenizer, callback, steps=5, reward=flaky)
    with pytest.raises(RuntimeError, match="reward server went away"):
        trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    assert got.summary["status"] == "error"
    assert "RuntimeError: the reward server went away" in got.summary["error"]
    assert [e["step"] for e in got.of_type("optimizer_step")] == [1, 2]
    assert [e["iteration"] for e in got.of_type("iteration_started")] == [0, 1, 2]
    failed = [s for s in got.spans() if s["error"]]
    assert {s["name"] for s in failed} == {
        "step",
        "GRPOTrainer._prepare_inputs",
        "GRPOTrainer._calculate_rewards",
        "GRPOTrainer.flaky",
    }
    for name in ("training_step", "_prepare_inputs", "_generate", "_twinkle_observed"):
        assert name not in vars(trainer), name
    # the same callback observes the next train() call as a new run
    trainer.args.max_steps = 1
    calls.clear()
    trainer.train()
    assert callback.session is not None and callback.session.summary is not None
    assert callback.session.summary["status"] == "ok"
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_a_second_train_call_with_the_run_id_resumes_the_run(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    # (resume=True: the first call finished ok; continuing it is asked for)
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="grpo", resume=True)
    collecting = gc.isenabled()
    gc.disable()  # (the first trainer is freed as it is dropped: nothing of twinkle's holds it)
    try:
        grpo(tmp_path, tokenizer, callback, steps=2).train()
        again = grpo(tmp_path, tokenizer, callback, steps=2)  # a restarted job, same run id
    finally:
        if collecting:
            gc.enable()
    again.train()
    got = _read(again, callback, tmp_path / "runs")
    assert [e["iteration"] for e in got.of_type("iteration_started")] == [0, 1, 2, 3]
    assert [e["step"] for e in got.of_type("optimizer_step")] == [1, 2, 3, 4]
    assert got.summary["status"] == "ok" and len(got.summary["segments"]) == 2
    # each segment compared with TRL's own counts of it (the second's from step 0 again)
    counts = got.summary["counts"]
    assert counts["optimizer_updates"] == {**counts["optimizer_updates"], "accumulated": 4,
                                           "terminal": 4, "discrepancy": 0}  # fmt: skip
    tokens = counts["tokens_rollout"]
    assert tokens["terminal"] == tokens["accumulated"] > 0 and tokens["discrepancy"] == 0
    replay(got.run_dir, tmp_path / "again")
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (got.run_dir / name).read_bytes(), name


def test_a_resume_from_an_older_checkpoint_says_which_steps_are_done_again(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    """4 steps saved at 2 and 4; a restarted job resumes from checkpoint-2 up to step 6:
    TRL does steps 3 and 4 again. The run counts each update it saw (8, steps 1-8), says
    so, and each segment's counts equal TRL's own for it (the second's from its
    checkpoint's: TRL restores its counts)."""
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="grpo")
    saving = {"save_strategy": "steps", "save_steps": 2}
    first = grpo(tmp_path, tokenizer, callback, steps=4, **saving)
    first.train()
    tokens_at_2 = json.loads((tmp_path / "trl" / "checkpoint-2" / "trainer_state.json")
                             .read_text())["num_input_tokens_seen"]  # fmt: skip
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="grpo")  # a new job's
    again = grpo(tmp_path, tokenizer, callback, steps=6, **saving)
    with caplog.at_level(logging.WARNING, logger="twinkle.integrations.trl"):
        again.train(resume_from_checkpoint=str(tmp_path / "trl" / "checkpoint-2"))
    assert again.state.global_step == 6
    (said,) = [r.getMessage() for r in caplog.records if "done again" in r.getMessage()]
    assert "recorded 4 optimizer step(s), the last at TRL's global_step 4" in said
    assert "starts at global_step 2" in said and "global_step + 2 from here" in said
    got = _read(again, callback, tmp_path / "runs")
    assert [e["step"] for e in got.of_type("optimizer_step")] == list(range(1, 9))
    counts = got.summary["counts"]
    assert (counts["optimizer_updates"]["accumulated"], counts["optimizer_updates"]["terminal"],
            counts["optimizer_updates"]["discrepancy"]) == (8, 8, 0)  # fmt: skip
    tokens = counts["tokens_rollout"]
    whole = again.state.num_input_tokens_seen  # steps 1-2 once, 3-6 (TRL's)
    assert tokens["terminal"] == tokens["accumulated"] > whole > tokens_at_2
    assert tokens["discrepancy"] == 0
    # each segment's start: TRL's global_step and the run's steps before it
    starts = [(e["iteration"], e["values"]) for e in got.of_type("scalars")
              if e["name"] == "trl.start"]  # fmt: skip
    assert starts == [(0, {"global_step": 0, "steps_before": 0}),
                      (4, {"global_step": 2, "steps_before": 4})]  # fmt: skip
    # each save is a span of its iteration (at TRL's steps 2, 4; then 4, 6 again): its
    # time is the save's, not idle
    saves = [s["attrs"]["iteration"] for batch in got.of_type("spans")
             for s in span_list(batch) if s["name"] == "save_checkpoint"]  # fmt: skip
    assert saves == [1, 3, 5, 7]
    # A third job from the newest checkpoint (6, TRL's step at the run's last) redoes
    # nothing and says nothing, though the run counted 8 steps.
    caplog.clear()
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="grpo")
    third = grpo(tmp_path, tokenizer, callback, steps=7, **saving)
    with caplog.at_level(logging.WARNING, logger="twinkle.integrations.trl"):
        third.train(resume_from_checkpoint=str(tmp_path / "trl" / "checkpoint-6"))
    assert not [r for r in caplog.records if "done again" in r.getMessage()]
    got = _read(third, callback, tmp_path / "runs")
    assert [e["step"] for e in got.of_type("optimizer_step")] == list(range(1, 10))


def test_a_plain_transformers_trainer_counts_its_attention_mask_tokens(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    texts = ["<s>12<sep>21</s>", "<s>3456<sep>6543</s>", "<s>7<sep>7</s>"] * 6
    data = Dataset.from_dict(dict(tokenizer(texts)))
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = Trainer(
        model=tiny_llama(seed=1),
        args=TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            per_device_train_batch_size=3,
            gradient_accumulation_steps=2,
            max_steps=3,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            logging_steps=1,
        ),
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[callback],
    )
    trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    assert got.summary["status"] == "ok"
    assert set(got.of_type("run_started")[0]["config"]["phases"]) == {"train", "step", "checkpoint"}
    train = [e for e in got.of_type("samples") if e["phase"] == "train"]
    assert [len(e["lengths"]) for e in train] == [6, 6, 6]  # 2 micro-batches of 3
    lengths = {len(tokenizer(t)["input_ids"]) for t in texts}
    assert {n for e in train for n in e["lengths"]} == lengths
    assert got.summary["window"]["tokens"] == sum(sum(e["lengths"]) for e in train)
    assert Counter(s["name"] for s in got.spans())["train.step"] == 6
    assert got.summary["counts"]["optimizer_updates"]["discrepancy"] == 0


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown option\(s\) \['autolaod'\]"):
        TwinkleCallback(autolaod=False)
    with pytest.raises(InvalidArgumentError, match="devices must be a positive"):
        TwinkleCallback(devices=0)
    with pytest.raises(InvalidArgumentError, match="peak_flops must be a positive, finite FLOP"):
        TwinkleCallback(peak_flops=float("inf"))
    with pytest.raises(InvalidArgumentError, match="config must be a mapping"):
        TwinkleCallback(config=["phases"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="memory must be True or False"):
        TwinkleCallback(memory="yes")  # type: ignore[arg-type]
    # (numpy and torch scalars are taken as the numbers they hold: they are the point)
    assert TwinkleCallback(devices=np.int64(2)).devices == 2  # type: ignore[arg-type]
    assert TwinkleCallback(devices=torch.tensor(0.5)).devices == 0.5  # type: ignore[arg-type]


def test_a_callback_outside_a_trainer_says_how_to_attach_it(tmp_path: Path) -> None:
    callback = TwinkleCallback(out_dir=str(tmp_path))

    class Args:
        world_size = 1

    with pytest.raises(TwinkleError, match=r"pass it in Trainer\(callbacks=\[...\]\)"):
        callback.on_train_begin(Args(), object(), object())
    assert list(tmp_path.iterdir()) == []


def test_the_default_configuration_names_its_phases_and_denominators() -> None:
    config = observer_config(trainer="GRPOTrainer", generates=True, devices=2, total_steps=10)
    assert config["phases"] == {
        "rollout": ["generate"],
        "reward": ["GRPOTrainer._calculate_rewards"],
        "publish": ["GRPOTrainer.sync_weights"],
        "train": ["train.step", "train.optimizer"],
        "step": ["step"],
        "checkpoint": ["save_checkpoint"],
    }
    assert config["window"] == {"samples": "rollout", "devices": 2}
    assert config["throughput"]["rollout"] == {"samples": "rollout", "devices": 2}
    plain = observer_config(trainer="Trainer", generates=False, devices=1, total_steps=3)
    assert "streaming" not in plain and plain["window"]["samples"] == "train"
    assert config["streaming"] == {
        "generation": "rollout",
        "training": "train",
        "publish": "publish",
    }


def test_the_example_script_runs(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "trl_grpo.py"
    sys.path.insert(0, str(example.parent))
    try:
        import trl_grpo
    finally:
        sys.path.remove(str(example.parent))
    run_dir = trl_grpo.main(["--steps", "2", "--out", str(tmp_path)])
    assert run_dir is not None  # (one process: rank 0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    tokens = summary["counts"]["tokens_rollout"]
    assert tokens["discrepancy"] == 0
    said = trl_grpo.figures(summary)
    twinkle, trl = f"{tokens['accumulated']:,}", f"{tokens['terminal']:,}"
    assert said[0] == f"tokens: twinkle {twinkle}, TRL {trl} (discrepancy 0)"
    # A resumed run: TRL's count is its last process's, so each segment is compared.
    resumed = {**summary, "segments": summary["segments"] * 2}
    resumed["counts"] = {"tokens_rollout": {**tokens, "accumulated": 776, "terminal": 472}}
    assert trl_grpo.figures(resumed)[0] == (
        "tokens: twinkle 776, each of its 2 segments against TRL's count of it (discrepancy 0)"
    )
    reward = summary["scalars"]["trl"]["reward"]
    assert said[2].endswith(f"(iteration {reward['last_iteration']})")  # (no step: its own)


def test_evaluation_during_training_is_kept_apart_from_training(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = grpo(
        tmp_path,
        tokenizer,
        callback,
        steps=2,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=8,
        eval_dataset=Dataset.from_dict({"prompt": PROMPTS[:8]}),
    )
    trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    names = Counter(s["name"] for s in got.spans())
    assert names["generate"] == 2 and names["eval.generate"] >= 1
    tags = Counter(e["phase"] for e in got.of_type("samples"))
    assert tags["rollout"] == 2 and tags["eval"] >= 1
    # the window's effective tokens are the training rollouts only, as TRL's num_tokens
    assert got.summary["counts"]["tokens_rollout"]["discrepancy"] == 0
    scalars = {e["name"] for e in got.of_type("scalars")}
    assert {"trl", "trl.eval", "trl.train"} <= scalars
    # evaluation's reward scoring is eval.<TRL's name>, outside the reward phase
    assert names["GRPOTrainer._calculate_rewards"] == 2
    assert names["eval.GRPOTrainer._calculate_rewards"] >= 1


def test_two_callbacks_on_one_trainer_are_refused(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    first = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = grpo(tmp_path, tokenizer, first, steps=1)
    trainer.add_callback(TwinkleCallback(out_dir=str(tmp_path / "runs")))
    with pytest.raises(TwinkleError, match="already observed by another TwinkleCallback"):
        trainer.train()
    assert first.session is not None and first.session.summary is not None
    assert first.session.summary["status"] == "error"
    for name in ("training_step", "_prepare_inputs", "_generate", "_twinkle_observed"):
        assert name not in vars(trainer), name


def test_a_raising_callback_between_steps_finishes_the_run_as_an_error(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    """An error while logging (another callback's on_log, inside transformers'
    _maybe_log_save_evaluate) ends the run there, with the records before it."""
    from transformers import TrainerCallback

    class Broken(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                raise OSError("the metrics disk is full")

    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = grpo(tmp_path, tokenizer, callback, steps=4)
    trainer.add_callback(Broken())
    with pytest.raises(OSError, match="disk is full"):
        trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    assert got.summary["status"] == "error"
    assert "OSError: the metrics disk is full" in got.summary["error"]
    assert [e["step"] for e in got.of_type("optimizer_step")] == [1, 2]
    for name in ("training_step", "_maybe_log_save_evaluate", "get_batch_samples"):
        assert name not in vars(trainer), name


def test_the_profiling_wrapper_is_counted_in_and_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs overlapping, a trl module loaded while the wrapper is in place (wrapped
    by the next acquire), one that copied the wrapper (restored): after the last release
    every module holds TRL's function again."""
    import types

    import trl.extras.profiling as profiling
    import trl.trainer.grpo_trainer as grpo_module

    from twinkle.integrations._trl_profiling import PROFILING

    original = profiling.profiling_context
    assert PROFILING.acquire()
    wrapper = grpo_module.profiling_context
    assert wrapper is not original and profiling.profiling_context == wrapper
    late = types.ModuleType("trl._twinkle_test_late")
    setattr(late, "profiling_context", original)  # loaded after the first acquire
    copied = types.ModuleType("trl._twinkle_test_copied")
    setattr(copied, "profiling_context", wrapper)  # imported while the wrapper was in place
    monkeypatch.setitem(sys.modules, late.__name__, late)
    monkeypatch.setitem(sys.modules, copied.__name__, copied)
    assert PROFILING.acquire()
    assert late.profiling_context == wrapper
    PROFILING.release()
    assert grpo_module.profiling_context == wrapper  # one run still open
    PROFILING.release()
    for module in (profiling, grpo_module, late, copied):
        assert module.profiling_context is original, module.__name__


def test_samples_reused_across_steps_count_once_as_rollout_and_per_visit_as_train(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    """num_iterations=2: each generation batch trains two steps. The rollout tokens are
    TRL's num_tokens, counted in the generating step; the train tokens count each visit."""
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = grpo(tmp_path, tokenizer, callback, steps=4, num_iterations=2)
    trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    rollout = [e for e in got.of_type("samples") if e["phase"] == "rollout"]
    train = [e for e in got.of_type("samples") if e["phase"] == "train"]
    assert [e["iteration"] for e in rollout] == [0, 2]
    assert [e["iteration"] for e in train] == [0, 1, 2, 3]
    tokens = sum(sum(e["lengths"]) for e in rollout)
    assert tokens == trainer.state.num_input_tokens_seen
    assert got.summary["counts"]["tokens_rollout"]["discrepancy"] == 0
    assert sum(sum(e["lengths"]) for e in train) == 2 * tokens
    assert Counter(s["name"] for s in got.spans())["generate"] == 2


def test_each_phases_flops_recompute_from_the_samples_and_a_cpu_abstains(
    trained: Trained,
) -> None:
    """The model's shape is read from its configuration; each iteration's FLOPs are the
    formulas' over the samples the log holds; a CPU has no datasheet peak: no MFU, and
    the reason says how to give one."""
    mfu = trained.summary["mfu"]
    # (TRL's GRPOConfig trains in bf16 by default: on the CPU too, under autocast)
    dtype = "bfloat16" if trained.trainer.args.bf16 else "float32"
    assert (mfu["model_type"], mfu["dtype"], mfu["device"]) == ("llama", dtype, "cpu")
    assert "'cpu' is not in twinkle's table" in mfu["abstained"]
    model = trained.trainer.model
    assert isinstance(model, PreTrainedModel)
    shape = model_shape(model.config)
    samples = trained.of_type("samples")
    records = [
        json.loads(x) for x in (trained.run_dir / "metrics_raw.jsonl").read_text().splitlines()
    ]
    by_iteration = {
        r["iteration"]: r for r in records if r["kind"] == "mfu" and r["scope"] == "iteration"
    }
    assert sorted(by_iteration) == [0, 1, 2, 3]
    for iteration, record in by_iteration.items():
        train = [s for s in samples if s["iteration"] == iteration and s["phase"] == "train"]
        rollout = [s for s in samples if s["iteration"] == iteration and s["phase"] == "rollout"]
        lengths = [n for s in train for n in s["lengths"]]
        recompute = trained.trainer.args.gradient_checkpointing  # (TRL's default: on)
        # (GRPO computes the policy's logits on the completion tokens only)
        train_prompts = [p for s in train for p in s["prompt_lengths"]]
        assert 0 < sum(train_prompts) < sum(lengths)
        assert record["values"]["train_flops"] == training_flops(
            shape, lengths, recompute=recompute, prompt_lengths=train_prompts
        )
        prompts = [p for s in rollout for p in s["prompt_lengths"]]
        completions = [n - p for s in rollout for n, p in zip(s["lengths"], s["prompt_lengths"])]
        assert record["values"]["rollout_flops"] == generation_flops(shape, prompts, completions)
        assert not [k for k in record["values"] if k.endswith("mfu")]


def test_a_given_peak_gives_each_phase_its_mfu(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), peak_flops=1e11)
    trainer = grpo(tmp_path, tokenizer, callback, steps=2)
    trainer.train()
    mfu = _read(trainer, callback, tmp_path / "runs").summary["mfu"]
    run = mfu["run"]
    # (activations recomputed, TRL's default: training's FLOPs are the hardware's)
    assert mfu["recompute"] is True and mfu["phases"]["train"]["figure"] == "hfu"
    assert run["train_hfu"] == run["train_flops_per_s_per_device"] / 1e11
    assert 0 < run["rollout_mfu"] == run["rollout_flops_per_s_per_device"] / 1e11 < 1


def test_a_resume_that_would_change_the_mfu_says_why_and_what_to_do(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    out = str(tmp_path / "runs")
    grpo(tmp_path, tokenizer, TwinkleCallback(out_dir=out, run_id="r"), steps=1).train()
    other = TwinkleCallback(out_dir=out, run_id="r", peak_flops=1e11, resume=True)
    with pytest.raises(ResumeConfigError) as caught:
        grpo(tmp_path, tokenizer, other, steps=1).train()
    assert caught.value.keys == ("mfu",)
    assert "the run began with MFU for 'cpu'" in str(caught.value)
    assert "its MFU may not change on resume" in str(caught.value)


def test_a_resume_keeps_the_mfu_settings_the_run_began_with(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    """What the callback detects (here gradient checkpointing turned off) may differ in
    the process that resumes: the run keeps its MFU settings, and says so."""
    out = str(tmp_path / "runs")
    grpo(tmp_path, tokenizer, TwinkleCallback(out_dir=out, run_id="r"), steps=1).train()
    again = TwinkleCallback(out_dir=out, run_id="r", resume=True)
    with caplog.at_level(logging.WARNING, logger="twinkle.integrations.trl"):
        grpo(tmp_path, tokenizer, again, steps=1, gradient_checkpointing=False).train()
    assert "keeps the MFU settings it began with (recompute=True)" in caplog.text
    assert "this process detects recompute=False" in caplog.text
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert [s["status"] for s in summary["segments"]] == ["ok", "ok"]
    assert summary["mfu"]["recompute"] is True and summary["mfu"]["logits"] == "completion"


def test_sft_with_a_completion_only_loss_counts_the_lm_head_on_the_completion(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    """TRL's SFT scores only the labelled positions (its fused LM head): a train sample's
    prompt is its tokens before the first label, and its FLOPs charge the head on the
    rest. A digit, <s>, <sep> and </s> are a token each: '<s>12<sep>' + '21</s>' is 7
    tokens after a prompt of 4; '<s>3456<sep>' + '6543</s>' 11 after 6; '<s>7<sep>' +
    '7</s>' 5 after 3."""
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict(
        {
            "prompt": ["<s>12<sep>", "<s>3456<sep>", "<s>7<sep>"] * 4,
            "completion": ["21</s>", "6543</s>", "7</s>"] * 4,
        }
    )
    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"))
    trainer = SFTTrainer(
        model=tiny_llama(seed=1),
        processing_class=tokenizer,
        train_dataset=data,
        args=SFTConfig(
            output_dir=str(tmp_path / "sft"),
            per_device_train_batch_size=3,
            max_steps=2,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        ),
        callbacks=[callback],
    )
    trainer.train()
    got = _read(trainer, callback, tmp_path / "runs")
    train = [e for e in got.of_type("samples") if e["phase"] == "train"]
    pairs = {(n, p) for e in train for n, p in zip(e["lengths"], e["prompt_lengths"])}
    assert pairs == {(7, 4), (11, 6), (5, 3)}
    assert got.summary["mfu"]["logits"] == "completion"
    assert isinstance(trainer.model, PreTrainedModel)
    shape = model_shape(trainer.model.config)
    records = [json.loads(x) for x in (got.run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    for r in (r for r in records if r["kind"] == "mfu" and r["scope"] == "iteration"):
        mine = [e for e in train if e["iteration"] == r["iteration"]]
        assert r["values"]["train_flops"] == training_flops(
            shape,
            [n for e in mine for n in e["lengths"]],
            recompute=bool(trainer.args.gradient_checkpointing),
            prompt_lengths=[p for e in mine for p in e["prompt_lengths"]],
        )


class _Group:
    """torch.distributed as a process of a group of 2 sees it (rank 1)."""

    @staticmethod
    def get_world_size() -> int:
        return 2

    @staticmethod
    def get_rank() -> int:
        return 1


def test_a_rank_of_a_group_whose_trainer_trains_alone_is_told_how_to_run_it_distributed(
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ms-swift on CPU ranks without --use_cpu: torch.distributed holds 2 ranks, each
    trainer's world_size is 1. Each rank would be a run of its own; given one run id,
    they would race for its directory, so that is refused before training."""
    from twinkle.integrations import _trl_ranks

    monkeypatch.setattr(_trl_ranks, "initialised_dist", lambda: _Group)
    assert _trl_ranks.lone_rank(2) is None  # (the trainer's world is the group's)
    fix = "pass use_cpu=True and ddp_backend='gloo' to the training arguments"
    named = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="r")
    with pytest.raises(TwinkleError, match=r"this process is rank 1 of a torch\.distributed"):
        grpo(tmp_path, tokenizer, named, steps=1).train()
    assert not (tmp_path / "runs" / "r").exists()
    caplog.set_level(logging.WARNING, logger="twinkle")
    grpo(tmp_path, tokenizer, TwinkleCallback(out_dir=str(tmp_path / "runs")), steps=1).train()
    assert fix in caplog.text and "so each rank is a run of its own" in caplog.text
