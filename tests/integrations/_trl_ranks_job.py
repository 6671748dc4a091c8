"""One rank of a TRL GRPO training under ``torchrun`` (gloo, CPU), observed by a
:class:`~twinkle.integrations.trl.TwinkleCallback`, for tests/integrations/test_trl_ranks.py.

``python -m torch.distributed.run --standalone --nproc_per_node N _trl_ranks_job.py OUT
STEPS [KILL_RANK KILL_STEP]``: trains STEPS steps into run ``r`` under ``OUT``; rank 0
writes ``OUT/trl.json`` (TRL's own counts). With KILL_RANK, that rank kills itself
outright (SIGKILL) at its reward call of step KILL_STEP (with ``KILL_AT=step_end`` in
the environment: as that step ends, before its callback's gather). With ``BARE_RANK=N`` in the
environment, rank N trains without the callback (and the ranks wait 5 s to join); with
``TRAIN_AGAIN=1``, ``train()`` is called a second time; with ``RAISE_AT=N``, every
rank's reward function raises at its N-th call.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from twinkle.demo.hf import tiny_llama, write_tokenizer
from twinkle.integrations import _trl_ranks
from twinkle.integrations.trl import TwinkleCallback

PROMPTS = ["<s>123<sep>", "<s>4051<sep>", "<s>77<sep>", "<s>9102<sep>"] * 8


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    kill = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None
    rank = int(os.environ["RANK"])
    tokens = out / f"tokenizer{rank}"
    tokens.mkdir(parents=True, exist_ok=True)
    write_tokenizer(tokens)
    calls = [0]

    at_step_end = os.environ.get("KILL_AT") == "step_end"

    raise_at = int(os.environ.get("RAISE_AT", "0"))

    def reward(completions: list[str], **kwargs: Any) -> list[float | None]:
        calls[0] += 1
        if calls[0] == raise_at:
            raise ValueError(f"the reward function failed on rank {rank}")
        if kill is not None and not at_step_end and rank == kill[0] and calls[0] == kill[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        return [sum(c.isdigit() for c in text) / 8 for text in completions]

    class Killer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if kill is not None and at_step_end and rank == kill[0]:
                if state.global_step == kill[1]:
                    os.kill(os.getpid(), signal.SIGKILL)

    bare = os.environ.get("BARE_RANK")
    if bare is not None:
        _trl_ranks.JOIN_TIMEOUT = datetime.timedelta(seconds=5)
    callback = TwinkleCallback(out_dir=str(out), run_id="r")
    trainer = GRPOTrainer(
        model=tiny_llama(seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(str(tokens)),
        reward_funcs=[reward],
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        args=GRPOConfig(
            output_dir=str(out / f"trl{rank}"),
            max_steps=steps,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        ),
        callbacks=[Killer()] if bare == str(rank) else [Killer(), callback],
    )
    trainer.train()
    if os.environ.get("TRAIN_AGAIN"):  # (from step 0 on the run that finished ok)
        trainer.train()
    if rank == 0:
        state = trainer.state
        (out / "trl.json").write_text(
            json.dumps(
                {
                    "num_tokens": int(state.num_input_tokens_seen),
                    "global_step": int(state.global_step),
                    "world_size": int(trainer.args.world_size),
                }
            )
        )


if __name__ == "__main__":
    main()
