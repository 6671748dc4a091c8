"""ms-swift GRPO runs observed by twinkle, for tests/integrations/test_swift.py.

``model DIR`` (any venv with transformers) writes a tiny Llama with a byte-level
tokenizer (swift's chat templates need one) into ``DIR/model`` and a prompt file
``DIR/data.jsonl``. In ``.venv-swift`` (ms-swift 4.6, TRL 0.29):

* ``api DIR OUT``: swift's Python API (``rlhf_main``) observed through ``register()``,
  then a TRL ``SFTTrainer`` with a ``TwinkleCallback`` in the same process; prints
  what the libraries' functions are after both runs, as JSON.
* ``fail DIR OUT``: a reward function that raises at its second call; prints the
  error swift raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROMPTS = 16


def write_model(directory: Path) -> None:
    """A tiny Llama and byte-level BPE tokenizer (no merges: a token per byte) in
    ``directory/model``, and ``directory/data.jsonl``: one user message per line."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model_dir = directory / "model"
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({s: len(vocab) + i for i, s in enumerate(SPECIALS)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # (transformers: unannotated)
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS,
        model_max_length=128,
    ).save_pretrained(str(model_dir))
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<|endoftext|>"],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).float().save_pretrained(str(model_dir))  # type: ignore[no-untyped-call]
    with open(directory / "data.jsonl", "w") as f:
        for i in range(PROMPTS):
            message = {"role": "user", "content": f"count from {i} to {i + 3}"}
            f.write(json.dumps({"messages": [message]}) + "\n")


def swift_args(directory: Path, out: Path, **extra: Any) -> list[str]:
    """``swift rlhf --rlhf_type grpo``'s arguments for a 3-step CPU run."""
    args = {
        "rlhf_type": "grpo",
        "model": directory / "model",
        "model_type": "llama",
        "template": "chatml",
        "check_model": "false",
        "tuner_type": "full",
        "torch_dtype": "float32",
        "dataset": directory / "data.jsonl",
        "split_dataset_ratio": 0,
        "reward_funcs": "format",
        "callbacks": "twinkle",
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "max_length": 64,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "dataloader_num_workers": 0,
        "seed": 0,
        "output_dir": out,
        **extra,
    }
    return [part for key, value in args.items() for part in (f"--{key}", str(value))]


def _api(directory: Path, out: Path) -> None:
    import swift.rlhf_trainers.utils as swift_utils
    import trl.extras.profiling as trl_profiling
    from datasets import Dataset
    from swift.pipelines import rlhf_main
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from twinkle.integrations.swift import register
    from twinkle.integrations.trl import TwinkleCallback

    swift_before = swift_utils.profiling_context
    trl_before = trl_profiling.profiling_context
    register(out_dir=str(out), run_id="swift-api")
    rlhf_main(swift_args(directory, out / "swift"))

    model_dir = str(directory / "model")
    args = SFTConfig(
        output_dir=str(out / "sft"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
    )
    # Importing swift put its own flow callback in every transformers Trainer of the
    # process (swift/trainers/patcher.py): it reads swift's max_epochs at each epoch end.
    setattr(args, "max_epochs", None)  # (not one of SFTConfig's fields)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        train_dataset=Dataset.from_dict({"text": [f"count {i} {i + 1}" for i in range(8)]}),
        args=args,
        callbacks=[TwinkleCallback(out_dir=str(out), run_id="trl-after")],
    )
    trainer.train()
    print(
        json.dumps(
            {
                "swift_profiling_restored": swift_utils.profiling_context is swift_before,
                "trl_profiling_restored": trl_profiling.profiling_context is trl_before,
                "trainer_attributes": sorted(k for k in vars(trainer) if "twinkle" in k),
            }
        )
    )


def _fail(directory: Path, out: Path) -> None:
    import swift.rlhf_trainers.utils as swift_utils
    from swift.pipelines import rlhf_main
    from swift.rewards import ORM, orms

    from twinkle.errors import InvalidArgumentError
    from twinkle.integrations.swift import register

    swift_before = swift_utils.profiling_context
    try:  # a bad option is refused by register(), before swift builds its trainer
        register(run_id="swift-fail", devics=2)
    except InvalidArgumentError as exc:
        refused = str(exc)

    class FailsSecond(ORM):  # type: ignore[misc]  # (swift is not in .venv: ORM is Any)
        calls = 0

        def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
            FailsSecond.calls += 1
            if FailsSecond.calls == 2:
                raise ValueError("the reward model is unreachable")
            return [float(len(c)) for c in completions]

    orms["fails_second"] = FailsSecond
    register(out_dir=str(out), run_id="swift-fail")
    try:
        rlhf_main(swift_args(directory, out / "swift", reward_funcs="fails_second"))
    except ValueError as exc:
        restored = swift_utils.profiling_context is swift_before
        print(json.dumps({"raised": str(exc), "restored": restored, "refused": refused}))


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    if mode == "model":
        write_model(where)
    else:
        {"api": _api, "fail": _fail}[mode](where, Path(sys.argv[3]))
