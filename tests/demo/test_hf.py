"""twinkle.demo.hf: the tiny Llama and tokenizer that real engines load (the vLLM side is
tests/engines/test_vllm_real.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle.demo.hf import TinyLlamaSpec, token_vocab, write_tiny_llama, write_tokenizer
from twinkle.demo.task import BOS, EOS, PAD, SEP, VOCAB
from twinkle.errors import InvalidArgumentError


def test_importing_the_module_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, twinkle.demo.hf; "
        "assert not {'torch', 'transformers', 'tokenizers'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_token_ids_are_the_task_ids() -> None:
    vocab = token_vocab()
    assert sorted(vocab.values()) == list(range(VOCAB))
    assert all(vocab[str(d)] == d for d in range(10))
    assert (vocab["<s>"], vocab["<sep>"], vocab["</s>"], vocab["<pad>"]) == (BOS, SEP, EOS, PAD)


def test_tokenizer_round_trips_the_task_strings(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer("<s>1203<sep>").input_ids == [BOS, 1, 2, 0, 3, SEP]  # nothing added
    assert tokenizer.decode([BOS, 4, 2, SEP, 4, 2, EOS]) == "<s>42<sep>42</s>"
    assert tokenizer.decode([4, 2, EOS], skip_special_tokens=True) == "42"
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (EOS, PAD)


def test_model_has_the_task_vocab_a_64_head_dim_and_seeded_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    spec = TinyLlamaSpec(layers=1)
    a = write_tiny_llama(tmp_path / "a", spec=spec, seed=3)
    b = write_tiny_llama(tmp_path / "b", spec=spec, seed=3)
    config = json.loads((a / "config.json").read_text())
    assert (config["vocab_size"], config["head_dim"], config["num_hidden_layers"]) == (VOCAB, 64, 1)
    assert (config["bos_token_id"], config["eos_token_id"]) == (BOS, EOS)
    assert (a / "tokenizer.json").is_file()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert "lm_head.weight" in wa and wa["lm_head.weight"].shape == (VOCAB, spec.hidden_size)
    assert all(str(t.dtype) == "torch.float32" for t in wa.values())
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)


def test_spec_refuses_a_head_size_vllm_cpu_cannot_run() -> None:
    with pytest.raises(InvalidArgumentError, match=r"hidden_size=32 .*use hidden_size=128"):
        TinyLlamaSpec(hidden_size=32, heads=2)
    with pytest.raises(InvalidArgumentError, match="kv_heads=3"):
        TinyLlamaSpec(hidden_size=256, heads=4, kv_heads=3)
