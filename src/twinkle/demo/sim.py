"""The demo's simulated-device mode (``twinkle demo --sim-device``): a test bed for
``twinkle whatif``.

The engines and the trainer keep the demo's schedule, spans, events and observers, but
their work takes *device time*: each one sleeps for as long as its work would take on
an accelerator (:class:`SimDevice`), as a process waiting on a GPU does, instead of
computing on the host's CPU. So a 2-core host runs many engines side by side without
their work slowing each other, which is what a prediction of another configuration
assumes (independent devices), and a prediction can be checked against a run of that
configuration.

What the device time is made of (seconds; tokens are a trajectory's prompt and
response tokens):

* an engine's ``generate``: ``generate_s + generate_token_s * tokens`` of its share;
* an engine's ``weights.load``: ``load_s``;
* the trainer: ``advantage_s``; ``old_logprobs`` and ``ref_logprobs`` each
  ``logprobs_token_s * tokens``; per micro-batch ``forward_token_s`` and
  ``backward_token_s`` times its tokens; per optimizer step ``step_s``.

The responses are drawn from a seeded generator (their length and digits): the same
config and seed give the same tokens and rewards. The policy learns nothing (the loss
and KL are 0): the mode is for timing, not for training. The scenario knobs (``--slow-*``)
slow it as they slow the torch demo (each side's span made ``k`` times longer).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutEngine, Trajectory, seed_for
from twinkle.demo.scenario import slowed, slowed_training
from twinkle.demo.task import DIGITS, EOS, max_response_tokens
from twinkle.demo.trainer import IterationResult, group_advantages
from twinkle.perf import TimeRecorder

__all__ = ["SIM_DEVICE", "SimDevice", "SimEngine", "SimTrainer"]


@dataclass(frozen=True, slots=True)
class SimDevice:
    """The device time of each piece of work, in seconds (see the module's docstring)."""

    generate_s: float = 0.010
    generate_token_s: float = 120e-6
    load_s: float = 0.008
    advantage_s: float = 0.001
    logprobs_token_s: float = 8e-6
    forward_token_s: float = 12e-6
    backward_token_s: float = 24e-6
    step_s: float = 0.004


#: the device every simulated engine and trainer runs on
SIM_DEVICE = SimDevice()


def _device_time(seconds: float) -> None:
    """Wait ``seconds`` as a host thread waits on its device (the GIL released)."""
    if seconds > 0:
        time.sleep(seconds)


class SimEngine(RolloutEngine):
    """A rollout engine on a simulated device: drawn responses, device time waited."""

    device = SIM_DEVICE

    def load_weights(self, version: int, state: object) -> str:
        """Load ``version`` once no pending rollout needs the old weights; returns the
        engine's name as the acknowledgement."""
        self.wait_until_unneeded(version)
        span = self.recorder.span("weights.load", engine=self.name, version=version)
        with self._cond, span, slowed(self.config.slow_publish):
            _device_time(self.device.load_s)
        self.loaded(version)
        return self.name

    def _generate(
        self, prompts: list[list[int]], iteration: int
    ) -> list[tuple[list[int], list[int], list[float]]]:
        cfg = self.config
        rng = random.Random(seed_for(cfg.seed, iteration, 4, self.index))
        limit = max_response_tokens(cfg.max_digits)
        out = []
        for prompt in prompts:
            for _ in range(cfg.completions_per_prompt):
                digits = [rng.randrange(DIGITS) for _ in range(rng.randint(0, limit - 1))]
                response = [*digits, EOS]
                out.append((prompt, response, [-1.0] * len(response)))
        tokens = sum(len(p) + len(r) for p, r, _ in out)
        _device_time(self.device.generate_s + self.device.generate_token_s * tokens)
        return out


class SimTrainer:
    """The demo's trainer on a simulated device: the GRPO iteration's spans and
    optimizer steps, each taking its device time; the policy does not change."""

    device = SIM_DEVICE

    def __init__(
        self,
        config: DemoConfig,
        recorder: TimeRecorder,
        on_step: Callable[[int, int, int], object] | None = None,
    ) -> None:
        self.config = config
        self.recorder = recorder
        self.on_step = on_step
        self.optimizer_steps = 0

    def state(self) -> None:
        """The weights to publish: a simulated device's hold nothing to copy."""
        return None

    def train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        return slowed_training(
            self.recorder,
            iteration,
            self.config.slow_training,
            lambda: self._train_iteration(iteration, trajs),
        )

    def _train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        cfg, rec, dev = self.config, self.recorder, self.device
        tokens = [t.tokens for t in trajs]
        with rec.span("advantage", iteration=iteration):
            group_advantages([t.reward for t in trajs], cfg.completions_per_prompt)
            _device_time(dev.advantage_s)
        for name in ("old_logprobs", "ref_logprobs"):
            with rec.span(name, iteration=iteration):
                _device_time(dev.logprobs_token_s * sum(tokens))
        order = list(range(len(trajs)))
        random.Random(seed_for(cfg.seed, iteration, 3)).shuffle(order)
        step_size = cfg.micro_batch * cfg.grad_accum
        steps = micro = 0
        for s0 in range(0, len(order), step_size):
            step_idx = order[s0 : s0 + step_size]
            for m0 in range(0, len(step_idx), cfg.micro_batch):
                n = sum(tokens[i] for i in step_idx[m0 : m0 + cfg.micro_batch])
                with rec.span("train.forward", iteration=iteration, micro=micro):
                    _device_time(dev.forward_token_s * n)
                with rec.span("train.backward", iteration=iteration, micro=micro):
                    _device_time(dev.backward_token_s * n)
                micro += 1
            step = self.optimizer_steps + 1
            with rec.span("train.optimizer_step", iteration=iteration, step=step):
                _device_time(dev.step_s)
            self.optimizer_steps = step
            steps += 1
            if self.on_step is not None:
                self.on_step(iteration, step, len(step_idx))
        return IterationResult(
            iteration=iteration,
            reward_mean=sum(t.reward for t in trajs) / len(trajs),
            loss=0.0,
            kl=0.0,
            optimizer_steps=steps,
            micro_batches=micro,
            samples=len(trajs),
            tokens=sum(tokens),
        )
