"""A tiny Llama and its tokenizer, made in code, for real engines (vLLM) to load.

Nothing comes from a model hub: the weights are a randomly initialised transformers
``LlamaForCausalLM`` saved with ``save_pretrained`` (safetensors), the tokenizer a
``tokenizers`` word-level vocabulary wrapped in ``PreTrainedTokenizerFast``. Its ids are
the copy task's own (:mod:`twinkle.demo.task`: digit ``d`` is id ``d``, then BOS, SEP,
EOS, PAD), so token ids sent to and returned by an engine mean what the trainer and the
reward mean, with no mapping in between.

transformers, tokenizers and torch are imported by the functions that use them, never
at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from twinkle.demo.task import BOS, DIGITS, EOS, PAD, SEP, VOCAB
from twinkle.engines.vllm import VllmConfig, VllmNotInstalledError, require_vllm
from twinkle.errors import InvalidArgumentError

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SEP_TOKEN",
    "VLLM_PYTHON_ENV",
    "TinyLlamaSpec",
    "check_vllm_python",
    "default_vllm_python",
    "tiny_llama",
    "tiny_vllm_config",
    "token_vocab",
    "write_model",
    "write_tiny_llama",
    "write_tokenizer",
]

BOS_TOKEN: Final = "<s>"
SEP_TOKEN: Final = "<sep>"
EOS_TOKEN: Final = "</s>"
PAD_TOKEN: Final = "<pad>"
#: The environment variable naming the interpreter that runs the engines.
VLLM_PYTHON_ENV: Final = "TWINKLE_VLLM_PYTHON"
# vLLM's CPU attention accepts only some head sizes (16 is refused, 64 works).
_HEAD_DIM: Final = 64


# How a vLLM server runs the tiny model on a CPU here: float32, eager (no graph capture),
# a short context and a small, fixed KV cache.
_SERVER_ARGS: Final = (
    "--dtype",
    "float32",
    "--enforce-eager",
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    str(256 * 2**20),
)
_SERVER_ENV: Final = {
    "VLLM_SERVER_DEV_MODE": "1",  # serves /collective_rpc (reload_weights)
    # The model runs inside the engine-core process instead of a worker of its own: one
    # process less to start (one server was ready in 27 s instead of 50 s here).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",  # a local model: never ask a hub
}


def default_vllm_python() -> Path:
    """The interpreter that runs the engines: ``$TWINKLE_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` under the current directory (``make vllm-venv``)."""
    named = os.environ.get(VLLM_PYTHON_ENV)
    return Path(named) if named else Path(".venv-vllm") / "bin" / "python"


def check_vllm_python(python: str | os.PathLike[str] | None, *, ask: bool = True) -> Path:
    """The engines' interpreter (``python``, else :func:`default_vllm_python`) if it
    exists and (``ask``: asked in a child process) finds vLLM;
    :class:`~twinkle.errors.InvalidArgumentError` naming it and the fix if not."""
    interpreter = Path(python) if python is not None else default_vllm_python()
    fix = f"build it with make vllm-venv, or name one with --vllm-python or ${VLLM_PYTHON_ENV}"
    if not interpreter.exists():
        raise InvalidArgumentError(
            f"the vLLM interpreter {str(interpreter)!r} does not exist: {fix}"
        )
    if ask:
        try:
            require_vllm(str(interpreter))
        except VllmNotInstalledError:
            raise InvalidArgumentError(
                f"the vLLM interpreter {str(interpreter)!r} does not find vLLM: {fix}"
            ) from None
    return interpreter


def tiny_vllm_config(
    model_dir: str | Path, *, python: str | Path, log_dir: Path | None = None
) -> VllmConfig:
    """The :class:`~twinkle.engines.VllmConfig` of a server for the tiny model in
    ``model_dir`` on a CPU, run by the interpreter ``python`` (``.venv-vllm``)."""
    return VllmConfig(
        model=str(model_dir),
        args=_SERVER_ARGS,
        env=dict(_SERVER_ENV),
        python=str(python),
        log_dir=log_dir,
    )


@dataclass(frozen=True, slots=True)
class TinyLlamaSpec:
    """The shape of the tiny Llama; the defaults load in vLLM's CPU build."""

    hidden_size: int = 128
    layers: int = 2
    heads: int = 2  # head_dim = hidden_size // heads must be 64
    kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 256  # >= the engines' --max-model-len

    def config_dict(self) -> dict[str, Any]:
        """The ``LlamaConfig`` keyword arguments of this shape (and ``model_type``)."""
        return {
            "model_type": "llama",
            "vocab_size": VOCAB,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": _HEAD_DIM,
            "max_position_embeddings": self.max_positions,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "pad_token_id": PAD,
            "tie_word_embeddings": False,  # lm_head is its own tensor
        }

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name}={getattr(self, name)!r} must be >= 1")
        if self.hidden_size != self.heads * _HEAD_DIM:
            raise InvalidArgumentError(
                f"hidden_size={self.hidden_size!r} with heads={self.heads!r} gives a head "
                f"size other than {_HEAD_DIM}, which vLLM's CPU attention refuses; use "
                f"hidden_size={self.heads * _HEAD_DIM}"
            )
        if self.heads % self.kv_heads:
            raise InvalidArgumentError(
                f"heads={self.heads!r} is not a multiple of kv_heads={self.kv_heads!r}"
            )
        if self.max_positions < 8:
            raise InvalidArgumentError(f"max_positions={self.max_positions!r} must be >= 8")


def token_vocab() -> dict[str, int]:
    """Token string -> id, the task's ids: ``"0".."9"``, then BOS, SEP, EOS, PAD."""
    vocab = {str(d): d for d in range(DIGITS)}
    vocab.update({BOS_TOKEN: BOS, SEP_TOKEN: SEP, EOS_TOKEN: EOS, PAD_TOKEN: PAD})
    return vocab


def write_tokenizer(directory: Path, *, max_length: int = 256) -> None:
    """Save the task's tokenizer (``tokenizer.json`` and its config) into ``directory``.

    Text splits into single digits and the four special tokens; decoding joins tokens
    without spaces, so ``"<s>123<sep>"`` round-trips. Nothing is added to an encoded
    text: the task's prompts carry their own BOS and SEP.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=token_vocab(), unk_token=PAD_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        additional_special_tokens=[SEP_TOKEN],
        model_max_length=max_length,
    )
    tokenizer.save_pretrained(str(directory))


def tiny_llama(*, spec: TinyLlamaSpec | None = None, seed: int = 0) -> Any:
    """A randomly initialised tiny ``LlamaForCausalLM`` (float32, untied ``lm_head``) with
    the task's vocabulary; the same ``seed`` gives the same weights. Needs torch and
    transformers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = spec or TinyLlamaSpec()
    config = LlamaConfig(**spec.config_dict())
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.float()  # type: ignore[no-untyped-call]  # whatever torch's default dtype is
    return model


def write_model(model: Any, directory: Path) -> Path:
    """Save ``model`` (a transformers causal LM of the task's vocabulary) and the task's
    tokenizer into ``directory`` (created if needed), as an engine loads them."""
    from transformers.utils import logging

    directory.mkdir(parents=True, exist_ok=True)
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # one tiny shard: no "Writing model shards" bar
    try:
        model.save_pretrained(str(directory), safe_serialization=True)
    finally:
        if shown:
            logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    write_tokenizer(directory, max_length=model.config.max_position_embeddings)
    return directory


def write_tiny_llama(directory: Path, *, spec: TinyLlamaSpec | None = None, seed: int = 0) -> Path:
    """Write a randomly initialised tiny Llama (:func:`tiny_llama`, float32 safetensors)
    and its tokenizer into ``directory``; returns ``directory``."""
    return write_model(tiny_llama(spec=spec, seed=seed), directory)
