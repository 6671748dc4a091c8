"""GRPO with TRL, observed by twinkle: a tiny Llama trained to copy a string of digits.

    .venv/bin/python examples/trl_grpo.py [--steps 30] [--out runs]
    .venv/bin/torchrun --standalone --nproc_per_node 2 examples/trl_grpo.py --steps 3

(30 steps show the observation, not learning: the reward stays near its start.) On
several ranks every rank runs this script with the same callback options; rank 0
writes the run and prints its figures.

Nothing is downloaded: the tokenizer and the model are made in code
(:mod:`twinkle.demo.hf`); put your own model and dataset in their place. The three
twinkle lines are the import, ``TwinkleCallback(...)`` and ``callbacks=[callback]``;
everything else is plain TRL. The run lands in ``<out>/<run_id>/`` (events.jsonl,
metrics_raw.jsonl, metrics.jsonl, summary.json, trace.json).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from twinkle.demo.hf import tiny_llama, write_tokenizer
from twinkle.integrations.trl import TwinkleCallback


def copy_reward(completions: list[str], prompts: list[str], **kwargs: Any) -> list[float | None]:
    """0.8 x the share of the prompt's digits copied in place, + 0.2 for the right length."""
    rewards: list[float | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        target = prompt.removeprefix("<s>").removesuffix("<sep>")
        answer = completion.split("</s>")[0]
        correct = sum(a == t for a, t in zip(answer, target, strict=False))
        rewards.append(0.8 * (correct / len(target)) + 0.2 * (len(answer) == len(target)))
    return rewards


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        "<s>" + "".join(rng.choices("0123456789", k=rng.randint(2, 4))) + "<sep>" for _ in range(n)
    ]


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    parser.add_argument("--out", default="runs", help="where the run directory goes (default runs)")
    parser.add_argument("--run-id", default=None, help="the run's name (default: a fresh one)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="twinkle-trl-"))
    write_tokenizer(work)  # your own: AutoTokenizer.from_pretrained(...)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(work))
    callback = TwinkleCallback(out_dir=args.out, run_id=args.run_id)
    trainer = GRPOTrainer(
        model=tiny_llama(seed=0),  # your own: a model id or a PreTrainedModel
        processing_class=tokenizer,
        reward_funcs=[copy_reward],
        train_dataset=Dataset.from_dict({"prompt": prompts(4096)}),
        args=GRPOConfig(
            output_dir=str(work / "trl"),
            per_device_train_batch_size=16,
            num_generations=8,
            max_completion_length=6,
            learning_rate=3e-3,
            max_steps=args.steps,
            logging_steps=max(1, args.steps // 10),
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        ),
        callbacks=[callback],
    )
    trainer.train()

    if callback.session is None:
        return None  # another rank's: rank 0 writes the run
    assert callback.session.summary is not None
    summary, run_dir = callback.session.summary, callback.session.out_dir
    print(f"run: {run_dir}")
    print("\n".join(figures(summary)))
    return Path(str(run_dir))


def figures(summary: dict[str, Any]) -> list[str]:
    """The run's tokens against TRL's count, its throughput, where its time went and its
    reward, from its summary.json."""
    tokens = summary["counts"]["tokens_rollout"]
    segments = len(summary["segments"])
    theirs = (
        f"TRL {tokens['terminal']:,}"
        if segments == 1  # (else TRL's is its last process's, from its checkpoint on)
        else f"each of its {segments} segments against TRL's count of it"
    )
    window, seconds = summary["window"], summary["seconds"]
    reward = summary["scalars"]["trl"].get("reward")
    return [
        f"tokens: twinkle {tokens['accumulated']:,}, {theirs} "
        f"(discrepancy {tokens['discrepancy']})",
        f"{window['tokens_per_s_per_device']:,.0f} tokens/s/device over "
        f"{window['seconds']:.2f} s; generation {seconds['rollout_seconds']:.2f} s, "
        f"training {seconds['train_seconds']:.2f} s, idle {seconds['idle_seconds']:.2f} s",
        "reward: none logged"
        if reward is None
        else f"reward: {reward['first']:.3f} (iteration {reward['first_iteration']}) -> "
        f"{reward['last']:.3f} (iteration {reward['last_iteration']})",
    ]


if __name__ == "__main__":
    main()
