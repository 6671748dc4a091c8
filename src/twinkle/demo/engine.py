"""Rollout engines: separate workers, each holding its own copy of the policy weights.

An engine generates the completions of its share of an iteration's prompts with the
weight version that iteration is due (``iteration - lag``), and loads new weights only
when every generation that still needs the old version is done — so a run with the same
seed yields the same tokens whatever the thread timing.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from twinkle.demo.config import DemoConfig
from twinkle.demo.model import TinyDecoder
from twinkle.demo.scenario import slowed
from twinkle.demo.task import DIGITS, EOS, PAD, VOCAB, make_prompts, max_response_tokens, reward
from twinkle.perf import TimeRecorder

__all__ = ["RolloutBatch", "RolloutEngine", "TorchEngine", "Trajectory", "seed_for"]


def seed_for(*parts: int) -> int:
    """A stable seed from integers (same parts, same seed, any process)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One completion: the prompt and response token ids and its reward."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]  # up to and including EOS (or cut at the limit)
    reward: float
    group: int  # index of the prompt within the iteration
    logprobs: tuple[float, ...] = ()  # the engine's log-prob of each response token

    @property
    def tokens(self) -> int:
        """Effective tokens: prompt + response."""
        return len(self.prompt) + len(self.response)


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    """One engine's share of an iteration: whole groups of completions, and what the
    engine itself said about generating them (``engine_figures``; empty when it says
    nothing)."""

    iteration: int
    engine: str
    version: int
    trajectories: tuple[Trajectory, ...]
    engine_figures: Mapping[str, float] = field(default_factory=dict)


class RolloutEngine:
    """A rollout worker's schedule, whatever generates: thread-safe ``rollout`` of its
    share of an iteration with exactly the weight version that iteration is due.

    Subclasses generate (``_generate``) and load weights; they call :meth:`loaded` once
    the engine holds a new version. ``first_iteration``: the run's first iteration in
    this process (a resumed run continues after its last one), whose weights are
    version ``first_iteration``.
    """

    def __init__(
        self,
        name: str,
        index: int,
        config: DemoConfig,
        recorder: TimeRecorder,
        *,
        first_iteration: int = 0,
    ) -> None:
        self.name = name
        self.first_iteration = first_iteration
        self.index = index
        self.config = config
        self.recorder = recorder
        self.version = -1  # nothing loaded yet
        self.generated_through = first_iteration - 1  # last iteration whose rollouts are done
        self._cond = threading.Condition()
        self._closed = False

    def _required_version(self, iteration: int) -> int:
        return max(self.first_iteration, iteration - self.config.lag)

    def wait_until_unneeded(self, version: int) -> None:
        """Block until no pending rollout needs a version older than ``version``."""
        first = self.first_iteration
        last_needing_older = version - 1 + self.config.lag if version > first else first - 1
        with self._cond:
            while self.generated_through < last_needing_older and not self._closed:
                self._cond.wait(0.05)

    def loaded(self, version: int) -> None:
        """The engine now holds ``version``: rollouts due that version may start."""
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _per_engine(self) -> int:
        return self.config.prompts_per_iteration // self.config.engines

    def prompts(self, iteration: int) -> list[list[int]]:
        """This engine's share of ``iteration``'s prompts (token ids)."""
        cfg = self.config
        per_engine = self._per_engine()
        prompt_rng = random.Random(seed_for(cfg.seed, iteration, 1))
        return make_prompts(prompt_rng, cfg.prompts_per_iteration, cfg.min_digits, cfg.max_digits)[
            self.index * per_engine : (self.index + 1) * per_engine
        ]

    def rollout(self, iteration: int) -> RolloutBatch:
        """Generate this engine's groups for ``iteration`` with the version it is due."""
        cfg = self.config
        need = self._required_version(iteration)
        with self._cond:
            if self.version < need and not self._closed:  # the staleness bound holds it
                with self.recorder.span("wait.weights", engine=self.name, version=need):
                    while self.version < need and not self._closed:
                        self._cond.wait(0.05)
            if self._closed:
                raise RuntimeError(f"engine {self.name} closed")
            if self.version != need:
                raise RuntimeError(
                    f"engine {self.name} holds version {self.version} but iteration "
                    f"{iteration} is due version {need}: the schedule broke"
                )
            version = self.version
        prompts = self.prompts(iteration)
        span = self.recorder.span(
            "generate", iteration=iteration, engine=self.name, version=version
        )
        slowdown = cfg.slow_generation * cfg.slow_engine_factor(self.name)
        with span, slowed(slowdown):
            responses = self._generate(prompts, iteration)
            # what it generated, for its seconds per token against its peers'
            span.set(tokens=sum(len(p) + len(r) for p, r, _ in responses), samples=len(responses))
        figures = self._engine_figures(iteration)
        first_group = self.index * self._per_engine()
        with self.recorder.span("reward", iteration=iteration, engine=self.name):
            trajectories = tuple(
                Trajectory(
                    tuple(p),
                    tuple(r),
                    reward(p, r),
                    first_group + i // cfg.completions_per_prompt,
                    tuple(lp),
                )
                for i, (p, r, lp) in enumerate(responses)
            )
        with self._cond:
            self.generated_through = max(self.generated_through, iteration)
            self._cond.notify_all()
        return RolloutBatch(iteration, self.name, version, trajectories, figures)

    def _engine_figures(self, iteration: int) -> Mapping[str, float]:
        """What the engine says about generating ``iteration`` (none by default)."""
        return {}

    def _generate(
        self, prompts: list[list[int]], iteration: int
    ) -> list[tuple[list[int], list[int], list[float]]]:
        """``completions_per_prompt`` completions of each prompt, grouped by prompt in the
        prompts' order: (prompt, response ids up to and including EOS, their logprobs)."""
        raise NotImplementedError


class TorchEngine(RolloutEngine):
    """A rollout worker with its own torch model copy, in this process."""

    def __init__(
        self,
        name: str,
        index: int,
        config: DemoConfig,
        recorder: TimeRecorder,
        *,
        first_iteration: int = 0,
    ) -> None:
        super().__init__(name, index, config, recorder, first_iteration=first_iteration)
        self.max_len = config.max_digits + 2 + max_response_tokens(config.max_digits)
        self.model = TinyDecoder(VOCAB, config.d_model, config.layers, config.heads, self.max_len)
        self.model.requires_grad_(False)
        self.model.eval()

    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> str:
        """Copy ``state`` into this engine's model once no pending rollout needs the old
        weights; returns the engine's name as the acknowledgement."""
        self.wait_until_unneeded(version)
        span = self.recorder.span("weights.load", engine=self.name, version=version)
        with self._cond, span, slowed(self.config.slow_publish):
            self.model.load_state_dict(state)  # a real copy into our own tensors
        self.loaded(version)
        return self.name

    @torch.no_grad()
    def _generate(
        self, prompts: list[list[int]], iteration: int
    ) -> list[tuple[list[int], list[int], list[float]]]:
        cfg = self.config
        gen = torch.Generator().manual_seed(seed_for(cfg.seed, iteration, 2, self.index))
        g = cfg.completions_per_prompt
        limit = max_response_tokens(cfg.max_digits)
        out: list[tuple[list[int], list[int], list[float]] | None] = [None] * (len(prompts) * g)
        # Batch prompts of equal length together: no padding inside generation.
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(i)
        allowed = torch.full((VOCAB,), float("-inf"))
        allowed[:DIGITS] = 0.0
        allowed[EOS] = 0.0
        for _, idxs in sorted(by_len.items()):
            rows = [prompts[i] for i in idxs for _ in range(g)]
            x = torch.tensor(rows, dtype=torch.long)
            done = torch.zeros(len(rows), dtype=torch.bool)
            steps = []
            logps = []
            for _ in range(limit):
                logits = self.model(x)[:, -1] / cfg.temperature + allowed
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
                logps.append(torch.log_softmax(logits, -1).gather(1, nxt[:, None]).squeeze(1))
                nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
                steps.append(nxt)
                done = done | (nxt == EOS)
                x = torch.cat([x, nxt[:, None]], dim=1)
                if bool(done.all()):
                    break
            resp = torch.stack(steps, dim=1).tolist()
            lps = torch.stack(logps, dim=1).tolist()
            for j, i in enumerate(idxs):
                for c in range(g):
                    r = [t for t in resp[j * g + c] if t != PAD]
                    out[i * g + c] = (prompts[i], r, lps[j * g + c][: len(r)])
        return [o for o in out if o is not None]
