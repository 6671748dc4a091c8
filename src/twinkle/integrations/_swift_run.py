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
  them (``{"model_inputs", "grpo_batch"}``: :func:`encoded_sums`);
* records swift's profiling contexts (``GRPOTrainer._compute_rewards_per_func``, ...) as
  spans, the default ``reward`` and ``publish`` phases among them;
* names its scalars ``swift`` (``swift.eval``, ``swift.train``) and its configuration's
  trainer ``x_swift``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twinkle.integrations._trl_config import observer_config
from twinkle.integrations._trl_lengths import plain_lengths
from twinkle.integrations._trl_profiling import SWIFT_PROFILING, ProfilingPatch
from twinkle.integrations._trl_run import ObservedRun

__all__ = ["SwiftRun", "encoded_sums"]


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
            if iteration is not None:
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
        sums = encoded_sums(batch)
        return super()._batch_sums(batch) if sums is None else sums

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


def encoded_sums(batch: Any) -> tuple[Any, Any] | None:
    """Each sample's tokens in one of swift's GRPO micro-batches (``{"model_inputs",
    "grpo_batch"}``) and its prompt's: the attention mask's tokens, less the completion
    mask's; None for any other batch, or a padding-free one (its samples packed in one
    row: no attention mask per sample)."""
    if not isinstance(batch, Mapping):
        return None
    inputs, grpo = batch.get("model_inputs"), batch.get("grpo_batch")
    completion = getattr(grpo, "completion_mask", None)
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if completion is None or mask is None or getattr(mask, "ndim", 0) != 2:
        return None
    if mask.shape[0] != completion.shape[0]:
        return None
    lengths = mask.sum(-1)
    return lengths, lengths - completion.sum(-1)
