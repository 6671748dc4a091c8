"""The GRPO trainer: group-normalised advantages, the clipped policy-gradient objective
with old log-probs, a KL penalty to a frozen reference, micro-batches with gradient
accumulation (tail micro-batches weighted by their real token counts)."""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import Trajectory, seed_for
from twinkle.demo.model import TinyDecoder
from twinkle.demo.scenario import slowed_training
from twinkle.demo.task import DIGITS, EOS, PAD, VOCAB, max_response_tokens
from twinkle.perf import TimeRecorder

__all__ = ["ANSWER_BIAS", "GRPOTrainer", "IterationResult", "group_advantages", "tiny_decoder"]

#: Additive logit bias that leaves only the answer alphabet (digits, EOS); large but
#: finite, so prompt positions (masked out of the loss) never produce NaN.
ANSWER_BIAS = torch.full((VOCAB,), -1e9)
ANSWER_BIAS[:DIGITS] = 0.0
ANSWER_BIAS[EOS] = 0.0


def group_advantages(rewards: Sequence[float], group_size: int) -> list[float]:
    """(r - mean of its group) / (std of its group + 1e-6), groups in order."""
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        g = rewards[start : start + group_size]
        mean = sum(g) / len(g)
        std = (sum((r - mean) ** 2 for r in g) / len(g)) ** 0.5
        out.extend((r - mean) / (std + 1e-6) for r in g)
    return out


@dataclass(frozen=True, slots=True)
class IterationResult:
    """What one training iteration did (plain numbers for the table and the tests)."""

    iteration: int
    reward_mean: float
    loss: float
    kl: float
    optimizer_steps: int
    micro_batches: int
    samples: int
    tokens: int


#: The policy's logits ``[batch, time, vocab]`` for token ids ``[batch, time]``.
Logits = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def _call(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(tokens)
    return out


def tiny_decoder(config: DemoConfig) -> TinyDecoder:
    """The torch demo's policy, initialised from the run's seed."""
    torch.manual_seed(seed_for(config.seed, 0, 0))
    max_len = config.max_digits + 2 + max_response_tokens(config.max_digits)
    return TinyDecoder(VOCAB, config.d_model, config.layers, config.heads, max_len)


class GRPOTrainer:
    """Owns the policy, the frozen reference and the optimizer.

    ``policy`` defaults to :func:`tiny_decoder`; another module (the vLLM demo's Llama)
    comes with ``logits`` (default: ``policy(tokens)`` is the logits). :meth:`state` is
    the policy's own state dict, so its names are what engines load.

    ``data_parallel``: this trainer is one rank of the initialised ``torch.distributed``
    group. Every rank gets the iteration's trajectories and takes its share of each
    optimizer step (``step[rank::world]``). The policy's gradients are averaged by
    ``DistributedDataParallel`` at each step's last micro-batch (the others run under
    ``no_sync``), so every rank steps the same weights. The losses and KL the result
    reports are summed over the ranks.
    """

    def __init__(
        self,
        config: DemoConfig,
        recorder: TimeRecorder,
        on_step: Callable[[int, int, int], object] | None = None,
        *,
        policy: torch.nn.Module | None = None,
        logits: Logits = _call,
        data_parallel: bool = False,
    ) -> None:
        self.config = config
        self.recorder = recorder
        #: called as on_step(iteration, optimizer steps so far, samples in the step)
        self.on_step = on_step
        self.policy = tiny_decoder(config) if policy is None else policy
        self._logits = logits
        self.reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=config.learning_rate, weight_decay=0.0
        )
        self.optimizer_steps = 0
        self.rank, self.world = 0, 1
        self.replica: torch.nn.Module = self.policy  # what the training forward runs
        if data_parallel:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.replica = DistributedDataParallel(self.policy)  # (broadcasts rank 0's)

    def state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the policy weights to publish."""
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    # -- tensors ------------------------------------------------------------------------

    @staticmethod
    def _pack(trajs: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded token ids and a mask of the response-token *targets*."""
        seqs = [list(t.prompt) + list(t.response) for t in trajs]
        width = max(len(s) for s in seqs)
        tokens = torch.full((len(seqs), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
        for i, (t, s) in enumerate(zip(trajs, seqs, strict=True)):
            tokens[i, : len(s)] = torch.tensor(s)
            # target at position j is token j+1: response tokens are targets
            # len(prompt)-1 .. len(s)-2
            mask[i, len(t.prompt) - 1 : len(s) - 1] = True
        return tokens, mask

    @staticmethod
    def _behaviour(trajs: Sequence[Trajectory], mask: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(mask.shape)
        for i, t in enumerate(trajs):
            start = len(t.prompt) - 1
            out[i, start : start + len(t.logprobs)] = torch.tensor(t.logprobs)
        return out

    def _logprobs(self, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        # The same answer alphabet the engines sample from (digits and EOS), so the
        # trainer's and the engines' log-probs are of one distribution.
        # At the engines' temperature: the distribution they sampled from (exact at 1.0).
        logits = self._logits(model, tokens[:, :-1]) / self.config.temperature + ANSWER_BIAS
        logp = torch.log_softmax(logits.float(), dim=-1)
        return logp.gather(2, tokens[:, 1:, None]).squeeze(2)

    # -- one iteration ------------------------------------------------------------------

    def train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        return slowed_training(  # (the scenario knob: a trainer k times slower)
            self.recorder,
            iteration,
            self.config.slow_training,
            lambda: self._train_iteration(iteration, trajs),
        )

    def _train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        cfg = self.config
        rec = self.recorder
        with rec.span("advantage", iteration=iteration):
            rewards = [t.reward for t in trajs]
            adv = torch.tensor(group_advantages(rewards, cfg.completions_per_prompt))
        tokens, mask = self._pack(trajs)
        with torch.no_grad():
            with rec.span("old_logprobs", iteration=iteration):
                old = self._logprobs(self.policy, tokens)
            behaviour = self._behaviour(trajs, mask)
            # Decoupled PPO for stale rollouts: the clip keeps the update near the
            # current (proximal) policy; the truncated importance weight corrects for
            # the engines' older behaviour policy. Without overlap the weight is ~1.
            weight = torch.exp(old - behaviour).clamp(max=2.0)
            with rec.span("ref_logprobs", iteration=iteration):
                ref = self._logprobs(self.reference, tokens)
        order = list(range(len(trajs)))
        random.Random(seed_for(cfg.seed, iteration, 3)).shuffle(order)
        step_size = cfg.micro_batch * cfg.grad_accum
        steps = micro = 0
        loss_sum = kl_sum = 0.0
        # Data parallel: this rank's share of each step, in micro-batches of its share of
        # micro_batch; the loss is scaled by the world, which DDP's mean divides again.
        per_micro = -(-cfg.micro_batch // self.world)
        for s0 in range(0, len(order), step_size):
            step_idx = order[s0 : s0 + step_size]
            # Normalise by the tokens of the whole optimizer step, so a short tail
            # micro-batch weighs exactly as much as its tokens.
            step_tokens = int(mask[step_idx].sum())
            shard = step_idx[self.rank :: self.world]
            mine = shard or step_idx[:1]  # (none: a zero-weight micro-batch, to sync)
            share = float(self.world) if shard else 0.0
            self.optimizer.zero_grad(set_to_none=True)
            starts = range(0, len(mine), per_micro)
            for m0 in starts:
                idx = torch.tensor(mine[m0 : m0 + per_micro])
                # DDP decides at the forward whether its backward syncs: no_sync spans both.
                with self._no_sync(last=m0 == starts[-1]):
                    with rec.span("train.forward", iteration=iteration, micro=micro):
                        logp = self._logprobs(self.replica, tokens[idx])
                        m = mask[idx].float()
                        ratio = torch.exp(logp - old[idx])
                        a = adv[idx][:, None]
                        surr = torch.minimum(
                            ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a
                        )
                        d = ref[idx] - logp
                        kl = torch.exp(d) - d - 1  # k3 estimator, >= 0
                        per_token = -(surr - cfg.kl_coef * kl)
                        loss = (per_token * weight[idx] * m).sum() / step_tokens
                    with rec.span("train.backward", iteration=iteration, micro=micro):
                        (loss * share).backward()  # type: ignore[no-untyped-call]
                loss_sum += float(loss.detach()) * (share / self.world)
                kl_sum += float((kl.detach() * m).sum()) * (share / self.world)
                micro += 1
            with rec.span(
                "train.optimizer_step", iteration=iteration, step=self.optimizer_steps + 1
            ):
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
                self.optimizer.step()
            self.optimizer_steps += 1
            steps += 1
            if self.on_step is not None:
                self.on_step(iteration, self.optimizer_steps, len(step_idx))
        if self.world > 1:  # every rank's share of the losses
            loss_sum, kl_sum = self._summed(loss_sum, kl_sum)
        return IterationResult(
            iteration=iteration,
            reward_mean=sum(rewards) / len(rewards),
            loss=loss_sum / max(steps, 1),
            kl=kl_sum / max(int(mask.sum()), 1),
            optimizer_steps=steps,
            micro_batches=micro,
            samples=len(trajs),
            tokens=sum(t.tokens for t in trajs),
        )

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager[object]:
        """DDP's gradient sync only at a rank's last micro-batch of a step."""
        if last or self.replica is self.policy:
            return contextlib.nullcontext()
        return self.replica.no_sync()  # type: ignore[operator, no-any-return]

    @staticmethod
    def _summed(*values: float) -> tuple[float, ...]:
        import torch.distributed as dist

        total = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(total)
        return tuple(float(v) for v in total.tolist())
