"""Model FLOPs from a model's configuration: what a forward pass, a training step and a
generation cost in floating-point operations (docs/metrics.md, "Model FLOPs").

Pure arithmetic on the configuration's numbers (a transformers config object or its
``to_dict()``); nothing here imports torch. A matrix product of ``m x k`` by ``k x n``
is ``2·m·k·n`` FLOPs (a multiply and an add per term). Counted, per layer and token:

* the linear layers: attention's projections (Qwen3-Next and Qwen3.5 gate their
  attention output: their query projection is twice as wide), the MLP's three matrices
  (gate, up, down: SwiGLU and GeGLU alike), a mixture of experts' router, its
  ``num_experts_per_tok`` active experts and its shared expert with its gate;
* the attention scores and their use on the values, ``4·heads·head_dim`` per key a
  query sees: a causal sequence's token at position ``i`` (from 1) sees ``i`` keys, a
  sliding-window layer's at most its window;
* a linear-attention layer (the gated delta rule of Qwen3-Next and Qwen3.5): its
  projections, its depthwise convolution (``2·channels·kernel``) and its recurrence in
  the recurrent form, ``6·head_k_dim·head_v_dim`` per value head (read the state with
  the key, write the correction, read it with the query);
* the LM head, ``2·hidden·vocab`` for each token whose logits are computed.

Not counted: the embedding lookup (a gather, no arithmetic), norms, activations,
rotary embeddings, softmax and residual adds (elementwise: under 1 % of a layer).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.errors import InvalidArgumentError

__all__ = [
    "FAMILIES",
    "FORMULA",
    "ModelShape",
    "forward_flops",
    "generation_flops",
    "model_shape",
    "training_flops",
]

#: the name of the formulas here, carried by every figure made with them
FORMULA = "twinkle-analytic-1"

#: the model types read, by family
FAMILIES: dict[str, tuple[str, ...]] = {
    "llama": ("llama", "mistral", "qwen2", "qwen3", "gemma"),
    "moe": ("qwen2_moe", "qwen3_moe"),
    "hybrid": ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
}
_GATED_ATTENTION = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
_WRAPPERS = {"qwen3_5": "text_config", "qwen3_5_moe": "text_config"}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers of a decoder-only model that its FLOPs depend on."""

    model_type: str
    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    #: per layer: "full_attention", "sliding_attention" or "linear_attention"
    layer_types: tuple[str, ...]
    #: per layer: the MLP's per-token FLOPs
    mlp: tuple[int, ...]
    sliding_window: int | None = None
    gated_attention: bool = False
    #: the linear-attention layers' (key heads, value heads, head k dim, head v dim, kernel)
    linear: tuple[int, int, int, int, int] | None = None

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    def linear_per_token(self) -> dict[str, int]:
        """Each counted term that every token pays (no attention scores), in FLOPs."""
        d, hd = self.hidden, self.head_dim
        q_out = self.heads * hd * (2 if self.gated_attention else 1)
        attention = 2 * d * (q_out + 2 * self.kv_heads * hd) + 2 * self.heads * hd * d
        full = sum(t != "linear_attention" for t in self.layer_types)
        terms = {"attention_projections": full * attention, "mlp": sum(self.mlp)}
        if self.linear is not None:
            k_heads, v_heads, k_dim, v_dim, kernel = self.linear
            key, value = k_heads * k_dim, v_heads * v_dim
            # in: q, k, v and the output gate z; b and a (one each per value head); out
            projections = 2 * d * (2 * key + 2 * value + 2 * v_heads) + 2 * value * d
            convolution = 2 * (2 * key + value) * kernel
            recurrence = 6 * v_heads * k_dim * v_dim
            count = self.layers - full
            terms["linear_attention_projections"] = count * projections
            terms["linear_attention_convolution"] = count * convolution
            terms["linear_attention_recurrence"] = count * recurrence
        return terms

    def attention_flops(self, length: int) -> int:
        """The attention scores and their values of one causal sequence of ``length``."""
        full = length * (length + 1) // 2  # keys seen, added over the positions
        per_key = 4 * self.heads * self.head_dim
        total = 0
        for kind in self.layer_types:
            if kind == "full_attention":
                total += per_key * full
            elif kind == "sliding_attention":
                window = self.sliding_window or length
                capped = min(window, length)
                # positions 1..w see themselves and those before, the rest w keys each
                total += per_key * (capped * (capped + 1) // 2 + (length - capped) * window)
        return total

    @property
    def lm_head(self) -> int:
        """The LM head's FLOPs per token whose logits are computed."""
        return 2 * self.hidden * self.vocab

    def to_dict(self) -> dict[str, Any]:
        """The shape as plain JSON data (a run's ``config.mfu.model``)."""
        return {
            "model_type": self.model_type,
            "hidden": self.hidden,
            "vocab": self.vocab,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "layer_types": list(self.layer_types),
            "mlp": list(self.mlp),
            "sliding_window": self.sliding_window,
            "gated_attention": self.gated_attention,
            "linear": None if self.linear is None else list(self.linear),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "model") -> ModelShape:
        """The shape :meth:`to_dict` gave, checked; :class:`InvalidArgumentError` names
        ``where`` and the key that is wrong."""
        if not isinstance(data, Mapping) or set(data) != set(_SHAPE_KEYS):
            raise InvalidArgumentError(
                f"{where} must be an object with keys {', '.join(_SHAPE_KEYS)} (a model "
                f"shape: twinkle.metric.model_shape(config).to_dict()), got {data!r:.200}"
            )

        def count(key: str, value: Any) -> int:
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(f"{where}.{key} must be an int >= 0, got {value!r:.100}")
            return value

        types = data["layer_types"]
        if not isinstance(types, list | tuple) or any(t not in _LAYER_TYPES for t in types):
            raise InvalidArgumentError(
                f"{where}.layer_types must be a list of {', '.join(_LAYER_TYPES)}, "
                f"got {types!r:.200}"
            )
        mlp, linear, window = data["mlp"], data["linear"], data["sliding_window"]
        if not isinstance(mlp, list | tuple) or len(mlp) != len(types):
            raise InvalidArgumentError(
                f"{where}.mlp must list one int per layer ({len(types)}), got {mlp!r:.200}"
            )
        if ("linear_attention" in types) != (linear is not None) or (
            linear is not None and (not isinstance(linear, list | tuple) or len(linear) != 5)
        ):
            raise InvalidArgumentError(
                f"{where}.linear must be the linear-attention layers' [key heads, value "
                "heads, head k dim, head v dim, kernel] when there are such layers, else "
                f"null; got {linear!r:.200}"
            )
        if type(data["gated_attention"]) is not bool or not isinstance(data["model_type"], str):
            raise InvalidArgumentError(
                f"{where}.gated_attention must be true or false and {where}.model_type a string"
            )
        return cls(
            model_type=data["model_type"],
            **{key: count(key, data[key]) for key in ("hidden", "vocab", "heads", "kv_heads")},
            head_dim=count("head_dim", data["head_dim"]),
            layer_types=tuple(types),
            mlp=tuple(count("mlp", n) for n in mlp),
            sliding_window=None if window is None else count("sliding_window", window),
            gated_attention=data["gated_attention"],
            linear=None if linear is None else tuple(count("linear", n) for n in linear),  # type: ignore[arg-type]
        )


_SHAPE_KEYS = (
    "model_type",
    "hidden",
    "vocab",
    "heads",
    "kv_heads",
    "head_dim",
    "layer_types",
    "mlp",
    "sliding_window",
    "gated_attention",
    "linear",
)
_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def model_shape(config: Any) -> ModelShape:
    """The :class:`ModelShape` of a transformers configuration (object or dict); a model
    type it does not know is refused by name (pass measured FLOPs instead)."""
    model_type = _get(config, "model_type")
    if model_type in _WRAPPERS:
        config = _get(config, _WRAPPERS[model_type])
        model_type = _get(config, "model_type")
    known = [t for types in FAMILIES.values() for t in types]
    if model_type not in known:
        raise InvalidArgumentError(
            f"no FLOPs formula for model type {model_type!r} (known: {', '.join(known)}); "
            "count its FLOPs per token another way (torch.utils.flop_counter."
            "FlopCounterMode on one forward pass) and pass that figure"
        )
    d = int(_get(config, "hidden_size"))
    heads = int(_get(config, "num_attention_heads"))
    layers = int(_get(config, "num_hidden_layers"))
    head_dim = _get(config, "head_dim") or d // heads
    types, window = _layer_types(config, model_type, layers)
    linear = None
    if "linear_attention" in types:
        linear = tuple(
            int(_get(config, f"linear_{key}"))
            for key in (
                "num_key_heads",
                "num_value_heads",
                "key_head_dim",
                "value_head_dim",
                "conv_kernel_dim",
            )
        )
    return ModelShape(
        model_type=model_type,
        hidden=d,
        vocab=int(_get(config, "vocab_size")),
        heads=heads,
        kv_heads=int(_get(config, "num_key_value_heads") or heads),
        head_dim=int(head_dim),
        layer_types=tuple(types),
        mlp=tuple(_mlp_flops(config, d, layer) for layer in range(layers)),
        sliding_window=int(window) if window else None,
        gated_attention=model_type in _GATED_ATTENTION,  # (transformers always gates them)
        linear=linear,  # type: ignore[arg-type]
    )


def _layer_types(config: Any, model_type: str, layers: int) -> tuple[list[str], int | None]:
    """Each layer's attention and the sliding window: ``layer_types`` when the
    configuration has them, else as transformers derives them for the model type."""
    window = _get(config, "sliding_window") or None  # (Qwen2-MoE's "none" is 0)
    if model_type.startswith("qwen") and not _get(config, "use_sliding_window", False):
        window = None
    types = _get(config, "layer_types")
    if types is not None:
        return list(types), window
    if model_type in FAMILIES["hybrid"]:
        interval = int(_get(config, "full_attention_interval", 4))
        every = ["linear_attention"] * (interval - 1) + ["full_attention"]
        return [every[i % interval] for i in range(layers)], window
    below = int(_get(config, "max_window_layers", 28))
    sliding: list[bool]
    if window is None:
        sliding = [False] * layers
    elif model_type in ("qwen2", "qwen3"):
        sliding = [i >= below for i in range(layers)]
    elif model_type == "qwen2_moe":
        sliding = [bool((i + 1) % 2) and i < below for i in range(layers)]
    else:  # Mistral, Qwen3-MoE: every layer
        sliding = [True] * layers
    return ["sliding_attention" if s else "full_attention" for s in sliding], window


def _mlp_flops(config: Any, d: int, layer: int) -> int:
    """One token's MLP FLOPs in ``layer``: dense, or the router, the active experts and
    the shared expert (with its one-output gate) of a mixture of experts."""
    experts = int(_get(config, "num_experts", 0) or 0)
    step = int(_get(config, "decoder_sparse_step", 1) or 1)
    sparse = experts > 0 and (
        _get(config, "model_type") == "qwen3_5_moe_text"  # (every layer: no other keys)
        or (layer not in (_get(config, "mlp_only_layers") or ()) and (layer + 1) % step == 0)
    )
    if not sparse:
        return 2 * 3 * d * int(_get(config, "intermediate_size"))
    active = int(_get(config, "num_experts_per_tok"))
    flops = 2 * d * experts + active * 2 * 3 * d * int(_get(config, "moe_intermediate_size"))
    shared = int(_get(config, "shared_expert_intermediate_size", 0) or 0)
    if shared:
        flops += 2 * 3 * d * shared + 2 * d
    return flops


def _lengths(name: str, lengths: Sequence[int]) -> list[int]:
    try:
        out = [operator.index(n) for n in lengths]  # (numpy's and torch's ints too)
    except TypeError:
        out = [-1]
    if any(n < 0 for n in out):
        raise InvalidArgumentError(f"{name} must be non-negative ints, got {list(lengths)[:5]!r}")
    return out


def forward_flops(shape: ModelShape, lengths: Sequence[int], *, logits: str = "all") -> int:
    """One forward pass over sequences of ``lengths`` (each causal, on its own), with the
    LM head on every token (``logits="all"``, as training computes them) or none."""
    tokens = _lengths("lengths", lengths)
    per_token = sum(shape.linear_per_token().values())
    head = shape.lm_head if logits == "all" else 0
    return sum(n * (per_token + head) + shape.attention_flops(n) for n in tokens)


def training_flops(
    shape: ModelShape,
    lengths: Sequence[int],
    *,
    recompute: bool = False,
    prompt_lengths: Sequence[int] | None = None,
) -> int:
    """A training step over sequences of ``lengths``: the forward pass and the backward
    pass (twice the forward: the gradients of the inputs and of the weights). With
    activation recomputation the decoder layers' forward runs twice (the LM head's
    once): the figure is then hardware FLOPs (HFU), not model FLOPs. The LM head runs
    on every token, or with ``prompt_lengths`` on each sequence's tokens after its
    prompt (as GRPO trainers compute the policy's log-probabilities)."""
    tokens = _lengths("lengths", lengths)
    logits = sum(tokens)
    if prompt_lengths is not None:
        prompts = _prompts(prompt_lengths, tokens)
        logits -= sum(prompts)
    body = forward_flops(shape, tokens, logits="none")
    return (4 if recompute else 3) * body + 3 * logits * shape.lm_head


def _prompts(prompt_lengths: Sequence[int], lengths: list[int]) -> list[int]:
    prompts = _lengths("prompt_lengths", prompt_lengths)
    if len(prompts) != len(lengths) or any(p > n for p, n in zip(prompts, lengths, strict=True)):
        raise InvalidArgumentError(
            f"{len(prompts)} prompt lengths for {len(lengths)} sequences: give one per "
            "sequence, none longer than its sequence"
        )
    return prompts


def generation_flops(
    shape: ModelShape, prompt_lengths: Sequence[int], completion_lengths: Sequence[int]
) -> int:
    """Generating completions: each sequence's prefill of its prompt and its decode, one
    token at a time against the growing KV cache. A completion's last token is never
    fed back: a prompt of ``P`` and a completion of ``C >= 1`` feed ``P + C - 1``
    positions, each position ``i`` seeing ``i`` keys; the LM head runs once per
    completion token (a prompt's last position makes the first). A prefix cache's
    savings are not taken off."""
    prompts = _lengths("prompt_lengths", prompt_lengths)
    completions = _lengths("completion_lengths", completion_lengths)
    if len(prompts) != len(completions):
        raise InvalidArgumentError(
            f"{len(prompts)} prompt lengths for {len(completions)} completion lengths: "
            "give one prompt length per completion"
        )
    per_token = sum(shape.linear_per_token().values())
    total = 0
    for p, c in zip(prompts, completions, strict=True):
        fed = p + c - 1 if c else p
        total += fed * per_token + shape.attention_flops(fed) + c * shape.lm_head
    return total
