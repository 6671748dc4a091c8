"""How a TRL run's token lengths are read: each training sample's (and its prompt's)
from its prepared batch, each completion's (and its prompt's) from ``_generate``'s
result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.checks import short_repr
from twinkle.errors import TwinkleError

__all__ = ["length_sums", "plain_lengths", "rollout_lengths"]


def length_sums(batch: Any, *, scored_labels: bool = False) -> tuple[Any, Any] | None:
    """Each sample's tokens in a prepared training batch and, where the batch tells them
    apart, its prompt's, not yet read off the device (``plain_lengths`` reads them at the
    step's end): prompt + completion mask tokens (TRL's GRPO and RLOO), attention-mask
    tokens, or the ``input_ids`` width; None when unknown. With ``scored_labels`` (TRL's
    fused LM head, which scores only the positions whose next label is not -100: SFT
    with a completion-only loss), a sample's tokens before those as its prompt."""
    if not isinstance(batch, Mapping):
        return None
    if "prompt_mask" in batch and "completion_mask" in batch:
        prompts = batch["prompt_mask"].sum(-1)
        return prompts + batch["completion_mask"].sum(-1), prompts
    mask = batch.get("attention_mask")
    if mask is not None and getattr(mask, "ndim", 0) == 2:
        lengths = mask.sum(-1)
        labels = batch.get("labels") if scored_labels else None
        if labels is not None and getattr(labels, "shape", None) == mask.shape:
            return lengths, lengths - (labels[:, 1:] != -100).sum(-1)
        return lengths, None
    ids = batch.get("input_ids")
    if ids is not None and getattr(ids, "ndim", 0) == 2:
        return [int(ids.shape[1])] * int(ids.shape[0]), None
    return None


def plain_lengths(sums: list[tuple[Any, Any]]) -> tuple[list[int], list[int]]:
    """The samples' lengths of a step's micro-batches (:func:`length_sums`), and their
    prompts' when every micro-batch gave them (else none)."""
    lengths: list[int] = []
    prompts: list[int] | None = []
    for part, prompt in sums:
        lengths.extend(_ints(part))
        if prompts is not None and prompt is not None:
            prompts.extend(_ints(prompt))
        else:
            prompts = None
    return lengths, prompts or []


def _ints(values: Any) -> list[int]:
    return [int(n) for n in (values.tolist() if hasattr(values, "tolist") else values)]


def rollout_lengths(trainer: str, out: Any) -> tuple[list[int], list[int]]:
    """Prompt + completion tokens per completion of ``_generate``'s result, as TRL counts
    ``num_tokens`` (with a tool mask: the model's own completion tokens), and each one's
    prompt tokens."""
    try:
        prompt_ids, completion_ids, tool_mask = out[0], out[1], out[2]
        prompts = [len(p) for p in prompt_ids]
        if tool_mask is None:
            pairs = zip(prompts, completion_ids, strict=True)
            return [p + len(c) for p, c in pairs], prompts
        return [p + int(sum(m)) for p, m in zip(prompts, tool_mask, strict=True)], prompts
    except (TypeError, IndexError, KeyError, ValueError) as exc:
        raise TwinkleError(
            f"{trainer}._generate returned {short_repr(out)}, not the (prompt_ids, "
            "completion_ids, tool_mask, ...) of trl 1.16: twinkle.integrations.trl "
            "supports trl>=1.16,<2 (pass profiling=False and a config without the "
            "rollout phase to observe other versions' training steps only)"
        ) from exc
