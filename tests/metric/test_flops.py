"""Model FLOPs: the analytic formulas against torch's FlopCounterMode on the real
transformers modules (tiny configurations, on the CPU), and the seed's model worked out
by hand."""

from __future__ import annotations

from typing import Any

import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.metric.flops import (
    ModelShape,
    forward_flops,
    generation_flops,
    model_shape,
    training_flops,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

L = 40  # a sequence's length: longer than the sliding window below
COMMON: dict[str, Any] = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
MOE: dict[str, Any] = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
LINEAR: dict[str, Any] = {
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}


def _configs() -> dict[str, Any]:
    t = transformers
    return {
        "llama": t.LlamaConfig(**COMMON),
        "mistral": t.MistralConfig(**COMMON, sliding_window=16),
        "qwen2": t.Qwen2Config(**COMMON),
        "qwen3": t.Qwen3Config(**COMMON, head_dim=24),
        "gemma": t.GemmaConfig(**COMMON, head_dim=32),
        "qwen3_moe": t.Qwen3MoeConfig(**COMMON, **MOE, decoder_sparse_step=2),
        "qwen2_moe": t.Qwen2MoeConfig(**COMMON, **MOE, shared_expert_intermediate_size=48),
        "qwen3_next": t.Qwen3NextConfig(
            **COMMON, **MOE, **LINEAR, shared_expert_intermediate_size=48
        ),
        "qwen3_5": t.Qwen3_5TextConfig(**COMMON, **LINEAR),
    }


def _counted(config: Any) -> tuple[int, dict[str, int]]:
    """FlopCounterMode's count of one forward pass over one sequence of L tokens: the
    total, and per module."""
    from torch.utils.flop_counter import FlopCounterMode

    # eager attention and a loop over the experts: matmuls the counter sees (on the CPU
    # the fused attention kernel and the grouped expert matmul count 0)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(0, COMMON["vocab_size"], (1, L)))
    per_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    return counter.get_total_flops(), per_module


def _unmasked_attention(shape: ModelShape) -> int:
    """What the counter sees of attention: eager attention multiplies every query by
    every key (L x L), then masks the future (and past a sliding window) away."""
    layers = sum(t != "linear_attention" for t in shape.layer_types)
    return layers * 4 * shape.heads * shape.head_dim * L * L


@pytest.mark.parametrize(
    "family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "qwen3_moe", "qwen2_moe"]
)
def test_the_formula_equals_the_counted_matmuls_but_for_the_masked_attention(family: str) -> None:
    """Every linear layer (experts: the two routed to) to the FLOP; attention differs by
    exactly the masked-away part: the counter's L x L against the formula's causal
    L(L+1)/2 keys (a window of 16: 16 keys at most)."""
    config = _configs()[family]
    shape = model_shape(config)
    counted, _ = _counted(config)
    ours = forward_flops(shape, [L])
    assert counted == ours - shape.attention_flops(L) + _unmasked_attention(shape)
    causal = 4 * shape.heads * shape.head_dim * (L * (L + 1) // 2) * shape.layers
    if family == "mistral":  # positions 1..16 see themselves and those before; 17..40 see 16
        window = 4 * shape.heads * shape.head_dim * (16 * 17 // 2 + 24 * 16) * shape.layers
        assert shape.attention_flops(L) == window
    else:
        assert shape.attention_flops(L) == causal


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_a_hybrid_differs_from_the_count_by_its_attention_convolution_and_recurrence(
    family: str,
) -> None:
    """Term by term, per linear-attention layer: its projections equal the counted ones;
    the convolution is counted over L + kernel - 1 positions (the causal padding, cut off
    after); the recurrence is counted as the CPU's chunked kernel does it (sequences padded
    to 64-token chunks, each chunk's tokens against each other), which the formula counts
    in the recurrent form: 6 x head_k x head_v per value head and token. With those three
    terms swapped, the totals are equal."""
    config = _configs()[family]
    shape = model_shape(config)
    counted, per_module = _counted(config)
    name = "Qwen3NextForCausalLM" if family == "qwen3_next" else "Qwen3_5ForCausalLM"
    layer = f"{name}.model.layers.0.linear_attn"
    projections = sum(n for k, n in per_module.items() if k.startswith(f"{layer}.") and "proj" in k)
    terms = shape.linear_per_token()
    linear_layers = shape.layer_types.count("linear_attention")
    assert projections * linear_layers == L * terms["linear_attention_projections"]
    assert shape.linear is not None
    k_heads, v_heads, k_dim, v_dim, kernel = shape.linear
    channels = 2 * k_heads * k_dim + v_heads * v_dim
    convolution = (L + kernel - 1) * 2 * channels * kernel
    kernel_core = per_module[layer] - projections - convolution  # the chunked kernel's
    ours = forward_flops(shape, [L])
    swapped = (
        ours
        - shape.attention_flops(L)
        + _unmasked_attention(shape)
        - L * terms["linear_attention_convolution"]
        + linear_layers * convolution
        - L * terms["linear_attention_recurrence"]
        + linear_layers * kernel_core
    )
    assert counted == swapped
    assert terms["linear_attention_recurrence"] == linear_layers * 6 * v_heads * k_dim * v_dim


def test_the_seeds_model_qwen3_5_4b_worked_out_by_hand() -> None:
    """Qwen3.5-4B's published text configuration: 32 layers (3 linear-attention, then 1
    full-attention, 8 times), hidden 2560, MLP 9216, 16 heads of 256 (4 KV heads, the
    output gated), linear attention 16 key heads and 32 value heads of 128, kernel 4,
    vocabulary 248,320.

    Per token:
      full attention (8 layers): 2*2560*(16*256*2 + 2*4*256) + 2*16*256*2560
                               = 52,428,800 + 20,971,520 = 73,400,320 each
      linear attention (24):    2*2560*(2*2048 + 2*4096 + 2*32) + 2*4096*2560
                               = 63,242,240 + 20,971,520 = 84,213,760 each
        convolution:            2*(2*2048 + 4096)*4 = 65,536 each
        recurrence:             6*32*128*128 = 3,145,728 each
      MLP (32):                 2*3*2560*9216 = 141,557,760 each
      LM head:                  2*2560*248,320 = 1,271,398,400
    Attention scores, a sequence of 1,024: 4*16*256 = 16,384 per key seen, and
    1024*1025/2 = 524,800 keys seen, in 8 layers: 68,786,585,600.
    """
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "vocab_size": 248320,
    }
    shape = model_shape({"model_type": "qwen3_5", "text_config": text})
    assert shape.linear_per_token() == {
        "attention_projections": 8 * 73_400_320,
        "mlp": 32 * 141_557_760,
        "linear_attention_projections": 24 * 84_213_760,
        "linear_attention_convolution": 24 * 65_536,
        "linear_attention_recurrence": 24 * 3_145_728,
    }
    assert shape.lm_head == 1_271_398_400
    per_token = 7_215_251_456 + 1_271_398_400  # the terms above, and the LM head
    assert sum(shape.linear_per_token().values()) + shape.lm_head == per_token
    assert shape.attention_flops(1024) == 68_786_585_600
    assert forward_flops(shape, [1024]) == 1024 * per_token + 68_786_585_600
    assert training_flops(shape, [1024]) == 3 * forward_flops(shape, [1024])
    # recomputed: the layers' forward again, not the LM head's
    head = 1024 * 1_271_398_400
    assert (
        training_flops(shape, [1024], recompute=True)
        == 4 * (forward_flops(shape, [1024]) - head) + 3 * head
    )
    # GRPO's log-probabilities: the LM head on the 768 tokens after a 256-token prompt
    assert training_flops(shape, [1024], prompt_lengths=[256]) == 3 * (
        forward_flops(shape, [1024]) - 256 * 1_271_398_400
    )


def test_generation_is_prefill_and_decode_with_the_lm_head_per_completion_token() -> None:
    """Prompt 3, completion 2 of the tiny Llama: the completion's last token is never
    fed, so 4 positions go through every layer (each seeing its 1..4 keys: 10 in all),
    and the LM head runs on 2 tokens. A completion of none is the prompt's prefill."""
    shape = model_shape(_configs()["llama"])
    per_token = sum(shape.linear_per_token().values())
    keys = 4 * shape.heads * shape.head_dim * 10 * shape.layers
    assert generation_flops(shape, [3], [2]) == 4 * per_token + keys + 2 * shape.lm_head
    assert generation_flops(shape, [3, 3], [2, 0]) == generation_flops(
        shape, [3], [2]
    ) + 3 * per_token + shape.attention_flops(3)
    assert generation_flops(shape, [0], [1]) == shape.lm_head  # (a lone token: its logits)


def test_unknown_models_and_bad_lengths_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError, match=r"no FLOPs formula for model type 'gpt2'"):
        model_shape({"model_type": "gpt2"})
    shape = model_shape(_configs()["llama"])
    with pytest.raises(InvalidArgumentError, match="lengths must be non-negative ints"):
        forward_flops(shape, [3, -1])
    with pytest.raises(InvalidArgumentError, match="2 prompt lengths for 1 completion"):
        generation_flops(shape, [3, 4], [2])
    with pytest.raises(InvalidArgumentError, match="1 prompt lengths for 1 sequences: give"):
        training_flops(shape, [3], prompt_lengths=[4])


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("qwen3_next", {}),
        ("qwen3_5", {"full_attention_interval": 2}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
        ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 3}),
        ("qwen2_moe", {"use_sliding_window": False, "sliding_window": 8}),
        ("mistral", {"sliding_window": 8}),
    ],
)
def test_a_config_json_without_layer_types_gets_the_layers_transformers_builds(
    family: str, extra: dict[str, Any]
) -> None:
    """A config.json read as a dict may lack ``layer_types``: they are derived as the
    transformers config derives them (its object has them: the two shapes agree)."""
    base = _configs()[family].to_dict()
    base.pop("layer_types", None)
    config = type(_configs()[family])(**{**base, **extra})
    as_dict = {**config.to_dict(), **extra}  # (as config.json would carry them)
    as_dict.pop("layer_types", None)
    assert model_shape(as_dict) == model_shape(config)


def test_lengths_may_be_numpy_ints() -> None:
    np = pytest.importorskip("numpy")
    shape = model_shape(_configs()["llama"])
    assert forward_flops(shape, np.array([3, 5])) == forward_flops(shape, [3, 5])


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma"])
def test_the_measured_path_agrees_on_a_meta_copy(family: str) -> None:
    """twinkle.integrations.flops counts a meta-device copy: what the real model counts
    (the attention unmasked), with no weights copied."""
    from twinkle.integrations.flops import check_flops

    config = _configs()[family]
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    check = check_flops(model, model_shape(config), L)
    assert check["measured"] == _counted(config)[0]
    assert check["relative_difference"] == 0


def test_a_mixture_of_experts_cannot_be_counted_on_the_meta_device() -> None:
    from twinkle.integrations.flops import measured_forward_flops

    config = _configs()["qwen3_moe"]
    config._experts_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(InvalidArgumentError, match="cannot run on the meta device"):
        measured_forward_flops(model, L)
