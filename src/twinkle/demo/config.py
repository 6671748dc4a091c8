"""Demo configuration (plain values; no torch import)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from twinkle.checks import is_integer
from twinkle.errors import ConfigError

__all__ = ["BACKENDS", "DEFAULT_LR", "ENGINES", "MAX_LAG", "DemoConfig"]

#: What generates the rollouts: ``torch`` (in-process tiny decoders, the default) or
#: ``vllm`` (real vLLM servers, a transformers Llama trainer).
ENGINES = ("torch", "vllm")
#: Where the trainer and the engines run: ``local`` (threads of this process, the
#: default) or ``ray`` (each one a Ray actor, twinkle.demo.ray_rig).
BACKENDS = ("local", "ray")
#: The learning rate each engine's demo uses when ``lr`` is not given.
DEFAULT_LR = {"torch": 2e-3, "vllm": 1e-3}

#: the most weight versions a rollout may lag the policy (``staleness``, ``--lag``)
MAX_LAG = 8
#: the largest count the demo takes (its run's steps, int64s, stay far within range)
_MOST = 2**31 - 1
#: the configuration's counts, each a positive int (checked in this order)
_COUNTS = (
    "iterations", "prompts_per_iteration", "completions_per_prompt", "micro_batch",
    "grad_accum", "engines", "train_workers", "d_model", "layers", "heads", "min_digits",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Every knob of the demo run. Same config and seed → same tokens, rewards, losses."""

    iterations: int = 60
    prompts_per_iteration: int = 16
    completions_per_prompt: int = 16
    micro_batch: int = 32
    grad_accum: int = 2
    engines: int = 2
    seed: int = 0
    overlap: bool = True
    # None: the engine's default (DEFAULT_LR, read through learning_rate). torch: 2e-3,
    # not 1e-2: larger steps learn the answer's length in a few iterations but leave the
    # digits at chance for dozens more, the one-step-stale rollouts drift far from the
    # policy being trained, and the k3 KL of tokens pushed far below the reference
    # blows up (the README's "What `make demo` does" has the figures). vllm: 1e-3, where
    # the tiny Llama learned best of 5e-4, 1e-3, 2e-3, 5e-3 and 1e-2 (the README's "The
    # demo on real vLLM engines").
    lr: float | None = None
    clip_eps: float = 0.2
    kl_coef: float = 0.005
    temperature: float = 1.0
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    min_digits: int = 3
    max_digits: int = 3
    observers: bool = True
    # torch: d_model, layers and heads shape the tiny decoder; vllm: the policy is the
    # tiny Llama of twinkle.demo.hf (its own fixed shape) and they are unused.
    engine: str = "torch"
    backend: str = "local"
    # >1: the trainer is that many torch.distributed ranks (DDP over gloo, this process
    # rank 0: twinkle.demo.ddp)
    train_workers: int = 1
    # Scenario knobs (twinkle.demo.scenario): make one side k times slower on purpose,
    # each by sleeping (k - 1) times its measured time inside its own span.
    slow_generation: float = 1.0
    slow_training: float = 1.0
    slow_publish: float = 1.0
    #: "engine1:4": that engine alone generates 4 times slower (a straggler)
    slow_engine: str | None = None
    #: the weight versions a rollout may lag the policy being trained (None: 1 with
    #: overlap, 0 without; 0 is no overlap, so it must agree with ``overlap``)
    staleness: int | None = None
    #: the simulated-device mode (twinkle.demo.sim): generation, training and weight
    #: loads take device time (they wait, as GPU work does) instead of the host's CPU
    sim_device: bool = False

    def __post_init__(self) -> None:
        self._check_where()
        self._check_scenario()
        self._check_staleness()
        if self.engine == "vllm":
            shaped = {
                k: getattr(self, k) for k in _DECODER_SHAPE if getattr(self, k) != _DEFAULTS[k]
            }
            if shaped:
                raise ConfigError(
                    f"{', '.join(f'{k}={v!r}' for k, v in shaped.items())}: d_model, layers "
                    "and heads shape the torch demo's decoder; the vLLM demo's policy is the "
                    "tiny Llama of twinkle.demo.hf (TinyLlamaSpec): leave them out"
                )
        self._check_counts()
        if self.completions_per_prompt < 2:
            raise ConfigError(
                "completions_per_prompt must be >= 2: GRPO normalises rewards within each "
                f"group, got {self.completions_per_prompt!r}"
            )
        if self.max_digits < self.min_digits or self.max_digits > 8:
            raise ConfigError(
                f"max_digits must lie in [min_digits, 8], got {self.max_digits!r} "
                f"(min_digits {self.min_digits!r})"
            )
        if self.d_model % self.heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})"
            )
        self._check_shares()
        for fname, fvalue in (("lr", self.learning_rate), ("temperature", self.temperature)):
            if (
                isinstance(fvalue, bool)
                or not isinstance(fvalue, int | float)
                or not 0 < fvalue < math.inf
            ):
                raise ConfigError(f"{fname} must be a finite number > 0, got {fvalue!r}")
        if self.learning_rate > 1:  # (Adam's step is about lr: the weights would blow up)
            raise ConfigError(f"lr must be at most 1, got {self.learning_rate!r}")
        if not 0 < self.clip_eps < 1:
            raise ConfigError(f"clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {self.kl_coef!r}")

    def _check_counts(self) -> None:
        """The counts are positive ints the run can hold; the seed an int64 >= 0."""
        for name in _COUNTS:
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
            if value > _MOST:  # (the run's counts are int64s: its steps would not fit)
                raise ConfigError(f"{name} must be at most {_MOST:,}, got {value!r}")
        seed = self.seed
        if not is_integer(seed) or not 0 <= seed < 2**63:
            raise ConfigError(f"seed must be an int in [0, 2**63 - 1], got {seed!r}")

    def _check_shares(self) -> None:
        """Each engine serves an equal share of the prompts: refused otherwise, with the
        nearest numbers of prompts that share."""
        if self.prompts_per_iteration % self.engines:
            up = -(-self.prompts_per_iteration // self.engines) * self.engines
            down = up - self.engines
            near = f"{down} or {up}" if down > 0 else f"{up}"
            raise ConfigError(
                f"prompts_per_iteration ({self.prompts_per_iteration}) must be a multiple of "
                f"engines ({self.engines}): each engine serves an equal share; give "
                f"--prompts {near}, or another number of engines"
            )

    def _check_where(self) -> None:
        """The engine, the backend and the trainer's ranks: a combination that runs."""
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.train_workers > 1 and (self.engine, self.backend) != ("torch", "local"):
            raise ConfigError(
                f"train_workers={self.train_workers!r} runs the torch demo's trainer as "
                f"torch.distributed ranks of this process; it is not available with engine "
                f"{self.engine!r} and backend {self.backend!r}: use --engine torch --backend local"
            )
        if self.backend == "ray" and self.engine != "torch":
            raise ConfigError(
                f"backend 'ray' runs the torch demo's engines and trainer as Ray actors; "
                f"engine {self.engine!r} is not available there: use --engine torch"
            )
        if self.sim_device and (self.engine, self.backend, self.train_workers) != (
            "torch",
            "local",
            1,
        ):
            raise ConfigError(
                "sim_device runs the demo's engines and trainer on simulated devices in this "
                "process: use --engine torch --backend local --train-workers 1 with it"
            )

    def _check_staleness(self) -> None:
        value = self.staleness
        if value is not None and (not is_integer(value) or not 0 <= value <= MAX_LAG):
            raise ConfigError(f"staleness must be an int in [0, {MAX_LAG}] or None, got {value!r}")
        if value is not None and (value > 0) != self.overlap:
            raise ConfigError(
                f"staleness {value} {'overlaps' if value else 'does not overlap'} generation "
                f"with training, but overlap is {self.overlap}: give --lag 0 for no overlap, "
                "--lag N > 0 with overlap"
            )

    def _check_scenario(self) -> None:
        for name in ("slow_generation", "slow_training", "slow_publish"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 1 <= value <= 1000
            ):
                raise ConfigError(
                    f"{name} must be a number in [1, 1000] (a slowdown), got {value!r}"
                )
        if self.slow_engine is not None:
            self.slow_engine_factor(f"engine{self.engines - 1}")  # (checks it)
        knobs = [f.name for f in fields(self) if f.name.startswith("slow_")]
        if self.engine == "vllm" and any(getattr(self, k) != _DEFAULTS[k] for k in knobs):
            raise ConfigError(
                "the scenario knobs (--slow-*) slow the torch demo's engines and trainer; "
                "the vLLM demo has none: use --engine torch"
            )

    def slow_engine_factor(self, engine: str) -> float:
        """How many times slower ``engine`` generates than the others (``slow_engine``)."""
        if self.slow_engine is None:
            return 1.0
        name, _, factor = self.slow_engine.rpartition(":")
        engines = [f"engine{i}" for i in range(self.engines)]
        try:
            value = float(factor)
        except ValueError:
            value = 0.0
        if name not in engines or not 1 <= value <= 1000:
            raise ConfigError(
                f"slow_engine must be NAME:FACTOR with NAME one of {', '.join(engines)} and "
                f"FACTOR in [1, 1000], got {self.slow_engine!r}; e.g. engine1:4"
            )
        return value if name == engine else 1.0

    @property
    def learning_rate(self) -> float:
        """``lr``, or the engine's default (:data:`DEFAULT_LR`) when it is None."""
        return DEFAULT_LR[self.engine] if self.lr is None else self.lr

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.completions_per_prompt

    @property
    def lag(self) -> int:
        """How many weight versions behind the rollouts may be (``staleness``, else 1
        with overlap and 0 without)."""
        if self.staleness is not None:
            return self.staleness
        return 1 if self.overlap else 0

    def to_dict(self) -> dict[str, Any]:
        """The fields as given (``lr`` None: the engine's default, see
        :attr:`learning_rate`), so ``DemoConfig(**cfg.to_dict()) == cfg``."""
        return asdict(self)


_DECODER_SHAPE = ("d_model", "layers", "heads")
_DEFAULTS = {f.name: f.default for f in fields(DemoConfig)}
