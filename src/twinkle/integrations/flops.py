"""A model's FLOPs measured rather than worked out: torch's ``FlopCounterMode`` over one
forward pass of a meta-device copy (no weights copied, no memory for activations), to
cross-check :mod:`twinkle.metric.flops` on a model, or to count one it has no formula
for (docs/metrics.md, "Model FLOPs").

The counter sees matrix products: attention is run with the math kernel of
``scaled_dot_product_attention`` (on a CPU the fused kernel counts nothing), which
multiplies every query by every key and masks afterwards, so the count holds the
unmasked ``L x L`` attention where the formulas count the causal keys.
:func:`check_flops` puts the two side by side. A forward whose control flow depends on
values (a mixture of experts' routing) cannot run on the meta device: refused by name.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.metric import ModelShape, forward_flops

__all__ = ["check_flops", "measured_forward_flops", "meta_copy"]


def meta_copy(module: Any) -> Any:
    """A deep copy of the torch ``module`` whose parameters and buffers are empty
    tensors of the same shapes on the meta device (tied weights stay tied); the module
    itself is left as it was."""
    import torch

    memo: dict[int, Any] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            empty = torch.nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    return copy.deepcopy(module, memo)


def _call(module: Any, ids: Any) -> Any:
    """A transformers model takes ``input_ids=``; any other module its tokens."""
    return module(input_ids=ids) if hasattr(module, "config") else module(ids)


def measured_forward_flops(
    module: Any, length: int, *, call: Callable[[Any, Any], Any] = _call
) -> int:
    """The FLOPs torch counts in one forward pass of ``module`` over one sequence of
    ``length`` tokens, on a meta-device copy (``call(copy, token_ids)`` runs it)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    if type(length) is not int or length < 1:
        raise InvalidArgumentError(f"length must be an int >= 1, got {length!r}")
    ghost = meta_copy(module)
    ids = torch.zeros(1, length, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    try:
        with sdpa_kernel(SDPBackend.MATH), counter, torch.no_grad():
            call(ghost, ids)
    except (NotImplementedError, RuntimeError) as exc:
        raise InvalidArgumentError(
            f"{type(module).__name__}'s forward cannot run on the meta device ({exc}): "
            "its control flow depends on values (a mixture of experts' routing?); count "
            "its FLOPs on a real forward pass, or use twinkle.metric's formulas"
        ) from exc
    return int(counter.get_total_flops())


def check_flops(module: Any, shape: ModelShape, length: int) -> dict[str, Any]:
    """The measured count of one forward pass over ``length`` tokens beside the
    formulas' (``analytic``), and the formulas' with the attention the counter sees
    (every query by every key in the full and sliding layers: ``analytic_unmasked``);
    ``relative_difference`` = measured / analytic_unmasked - 1 (0 for the families
    the formulas cover but the hybrids, whose convolution and recurrence differ)."""
    measured = measured_forward_flops(module, length)
    analytic = forward_flops(shape, [length])
    attending = sum(kind != "linear_attention" for kind in shape.layer_types)
    unmasked = attending * 4 * shape.heads * shape.head_dim * length * length
    seen = analytic - shape.attention_flops(length) + unmasked
    return {
        "length": length,
        "measured": measured,
        "analytic": analytic,
        "analytic_unmasked": seen,
        "relative_difference": measured / seen - 1,
    }
