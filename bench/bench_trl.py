"""What TwinkleCallback adds to a TRL GRPO step: the same training with and without it.

A real ``GRPOTrainer`` (tiny Llama and tokenizer made in code, CPU, 16 completions of up
to 6 tokens per step) trains ``STEPS`` steps with ``TwinkleCallback`` (every built-in
observer, the five files, a memory reading per step, TRL's profiling contexts as spans)
and without it, alternately, in this one process. Same seed, same data: both generate
the same tokens (checked), so their steps do the same work. The figure is seconds per
step, timed by a bare callback from the first step's end to the last's (the first step
carries the warm-up); the best of each mode is kept. The observed run's own account of
its overhead (``overhead_seconds`` in its summary) is printed next to it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import Row, has_module

BENCH = "trl.grpo"
STEPS = 20


def _prompts(n: int) -> list[str]:
    import random

    rng = random.Random(0)
    return [
        "<s>" + "".join(rng.choices("0123456789", k=rng.randint(2, 4))) + "<sep>" for _ in range(n)
    ]


def _reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [sum(c.isdigit() for c in text) / 6 for text in completions]


def _train(tokenizer: Any, observed: bool, steps: int, out: Path) -> tuple[float, int, Any]:
    """Seconds per step after the first, TRL's token count, and the run's summary."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from twinkle.demo.hf import tiny_llama
    from twinkle.integrations.trl import TwinkleCallback

    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    twinkle = TwinkleCallback(out_dir=str(out / "runs"), autoload=False)
    trainer = GRPOTrainer(
        model=tiny_llama(seed=0),
        processing_class=tokenizer,
        reward_funcs=[_reward],
        train_dataset=Dataset.from_dict({"prompt": _prompts(16 * steps)}),
        args=GRPOConfig(
            output_dir=str(out / "trl"),
            per_device_train_batch_size=16,
            num_generations=8,
            max_completion_length=6,
            max_steps=steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        ),
        callbacks=[StepEnds(), twinkle] if observed else [StepEnds()],
    )
    trainer.remove_callback(PrinterCallback)  # its log lines would land in the table
    trainer.train()
    summary = twinkle.session.summary if twinkle.session is not None else None
    return (ends[-1] - ends[0]) / (len(ends) - 1), trainer.state.num_input_tokens_seen, summary


def run(smoke: bool) -> list[Row]:
    subject = f"TRL GRPOTrainer ({STEPS} steps, 16 completions): s per step"
    if not has_module("trl"):
        return [Row(BENCH, subject, float("nan"), "", note="skipped: pip install -e '.[trl]'")]
    import logging

    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    from twinkle.demo.hf import write_tokenizer

    hf_logging.set_verbosity_error()
    logging.getLogger("twinkle").setLevel(logging.ERROR)
    steps, repeats = (3, 1) if smoke else (STEPS, 3)
    per_step: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, set[int]] = {True: set(), False: set()}
    overhead_share: list[float] = []
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-trl-") as tmp:
        write_tokenizer(Path(tmp))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp)
        for r in range(repeats):
            for observed in (False, True):
                seconds, seen, summary = _train(
                    tokenizer, observed, steps, Path(tmp) / f"{r}-{observed}"
                )
                per_step[observed].append(seconds)
                tokens[observed].add(seen)
                if summary is not None:
                    timing = summary["seconds"]
                    overhead_share.append(timing["overhead_seconds"] / timing["wall_seconds"])
    bare, observed_s = min(per_step[False]), min(per_step[True])
    listing = {m: ", ".join(f"{s * 1e3:.1f}" for s in v) for m, v in per_step.items()}
    same = (
        "same tokens"
        if tokens[True] == tokens[False] and len(tokens[True]) == 1
        else "TOKENS DIFFER"
    )
    return [
        Row(
            BENCH,
            subject + ", bare TRL",
            bare,
            "s",
            note=f"best of {repeats}; all: {listing[False]} ms",
        ),
        Row(
            BENCH,
            subject + ", with TwinkleCallback",
            observed_s,
            "s",
            ratio=observed_s / bare,
            baseline="bare TRL",
            target="<= 1.05x",
            met=None if smoke else observed_s / bare <= 1.05,
            note=f"best of {repeats}; all: {listing[True]} ms; {same}; the run's own "
            "overhead_seconds: "
            + ", ".join(f"{100 * s:.1f}%" for s in overhead_share)
            + " of its wall",
        ),
    ]
