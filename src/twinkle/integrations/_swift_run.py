"""One ``train()`` call of an ms-swift trainer (:class:`SwiftRun`): what differs from a
TRL trainer's (:class:`~twinkle.integrations._trl_run.ObservedRun`).

ms-swift's ``GRPOTrainer`` subclasses TRL's but generates, scores and batches on its
own: it never calls TRL's ``_generate``, times with its own ``profiling_context``, and
counts no ``num_input_tokens_seen``. So a swift run

* spans ``generate`` around swift's ``_generate_completions`` (the rollout, with
  swift's ``<trainer>.generate`` profiling span inside when it runs an engine);
* reads the ``rollout`` samples from the micro-batches ``_prepare_batch_inputs``
  encodes from the generated completions — the completions trained on, after swift's
  dynamic sampling (which drops the groups whose rewards do not vary), each one's
  prompt + completion tokens as the batch's attention mask counts them, its prompt the
  tokens before its completion mask;
* reads the ``train`` samples from the same micro-batches when a training step takes
  them (``{"model_inputs", "grpo_batch"}``: :func:`encoded_sums`; padding-free batches
  too); with sequence parallelism, on the first rank of each group only (every rank of
  a group holds the group's samples);
* records swift's profiling contexts (``GRPOTrainer._compute_rewards_per_func``, ...) as
  spans, the default ``reward`` and ``publish`` phases among them;
* names its scalars ``swift`` (``swift.eval``, ``swift.train``) and its configuration's
  trainer ``x_swift``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from twinkle.integrations._trl_config import observer_config
from twinkle.integrations._trl_lengths import plain_lengths
from twinkle.integrations._trl_profiling import SWIFT_PROFILING, ProfilingPatch
from twinkle.integrations._trl_run import ObservedRun

__all__ = ["SwiftRun", "counts_samples", "encoded_sums"]


class SwiftRun(ObservedRun):
    """One ``train()`` call of an ms-swift trainer observed."""

    GENERATE = "_generate_completions"
    SCALARS = "swift"
    PROFILING: ProfilingPatch = SWIFT_PROFILING
    TOKENS_SEEN = False  # (swift's state.num_input_tokens_seen stays 0)

    def _attach_generation(self) -> None:
        self._wrap(self.GENERATE, self._generation_span)
        self._wrap("_prepare_batch_inputs", self._batched)

    def _batched(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_prepare_batch_inputs``, recording its micro-batches' samples as generated."""

        def prepare_batch_inputs(*args: Any, **kwargs: Any) -> Any:
            iteration = self.iteration
            training = bool(self.trainer.model.training)
            batches = original(*args, **kwargs)
            if iteration is not None and self.counting:
                with self.bus.own_work("swift.lengths"):
                    sums = [encoded_sums(batch) for batch in batches]
                    known = [part for part in sums if part is not None]
                    lengths, prompts = plain_lengths(known)
                if len(known) < len(sums):
                    self._unknown_lengths(batches[sums.index(None)])
                if lengths:
                    self.generated(iteration, lengths, prompts, training=training)
            return batches

        return prepare_batch_inputs

    def _batch_sums(self, batch: Any) -> tuple[Any, Any] | None:
        if not self.counting:
            return [], []
        sums = encoded_sums(batch)
        return super()._batch_sums(batch) if sums is None else sums

    @functools.cached_property
    def counting(self) -> bool:
        """Whether this rank counts its batches' samples: with sequence parallelism every
        rank of a group holds the group's samples (swift gathers them), so its first
        rank counts them (:func:`counts_samples`)."""
        template = getattr(self.trainer, "template", None)
        size = int(getattr(template, "sequence_parallel_size", 1) or 1)
        if size <= 1:
            return True
        from swift.sequence_parallel import sequence_parallel

        return counts_samples(size, sequence_parallel.sp_rank, sequence_parallel.rp_rank)

    def _default_config(self, name: str, devices: float, total_steps: int) -> dict[str, Any]:
        config = observer_config(
            trainer=name,
            generates=self.generates,
            devices=devices,
            total_steps=total_steps,
            reward=f"{name}._compute_rewards_per_func",
            publish=f"{name}._move_model_to_vllm",
        )
        config["x_swift"] = {"trainer": name, "world_size": self.trainer.args.world_size}
        return config


def counts_samples(sp_size: int, sp_rank: int, rp_rank: int) -> bool:
    """Whether a rank counts its samples: always without sequence parallelism
    (``sp_size`` 1), else only the first rank of its sequence (and ring: ``rp_rank`` -1
    without one) parallel group."""
    return sp_size <= 1 or (sp_rank == 0 and rp_rank <= 0)


def encoded_sums(batch: Any) -> tuple[Any, Any] | None:
    """Each sample's tokens in one of swift's GRPO micro-batches (``{"model_inputs",
    "grpo_batch"}``) and its prompt's: the sample's tokens less its completion mask's.
    A sample's tokens are its attention mask's, or in a padding-free batch (every sample
    packed in one row) the run of its positions from 0, as swift cuts them
    (``text_position_ids``, else ``position_ids``). None for any other batch."""
    if not isinstance(batch, Mapping):
        return None
    inputs, grpo = batch.get("model_inputs"), batch.get("grpo_batch")
    completion = getattr(grpo, "completion_mask", None)
    if completion is None or not isinstance(inputs, Mapping):
        return None
    mask = inputs.get("attention_mask")
    if mask is not None and getattr(mask, "ndim", 0) == 2:
        lengths = mask.sum(-1)
    else:
        lengths = _packed_lengths(inputs)
    if lengths is None or lengths.shape[0] != completion.shape[0]:
        return None
    return lengths, lengths - completion.sum(-1)


def _packed_lengths(inputs: Mapping[str, Any]) -> Any:
    """The lengths of the samples packed in one row: from each position 0 to the next
    (or the row's end); None without one row of positions."""
    import torch

    positions = inputs.get("text_position_ids")
    if positions is None:
        positions = inputs.get("position_ids")
    if positions is None or positions.numel() != positions.shape[-1] or positions.numel() == 0:
        return None
    flat = positions.reshape(-1)
    starts = (flat == 0).nonzero(as_tuple=True)[0]
    if starts.numel() == 0 or int(starts[0]) != 0:
        return None
    ends = torch.cat([starts[1:], torch.tensor([flat.numel()], device=flat.device)])
    return ends - starts
