"""What the demo's loop drives, built per engine kind: the trainer, the rollout engines
and where weights go (:class:`Rig`), on this host's torch (or simulated devices), on Ray
workers, or on real vLLM servers."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutBatch, TorchEngine, Trajectory
from twinkle.demo.trainer import GRPOTrainer, IterationResult
from twinkle.driver import Publisher, WeightLoader
from twinkle.engines import VllmHttpError
from twinkle.perf import MemoryReading
from twinkle.run import RunSession

__all__ = ["Engine", "Rig", "ray_rig", "torch_rig", "vllm_rig"]


class Engine(Protocol):
    """What the loop calls on an engine: a :class:`RolloutEngine` here, or the handle on
    one in another process (:class:`twinkle.demo.ray_rig.RayEngine`)."""

    name: str

    def rollout(self, iteration: int) -> RolloutBatch: ...

    def close(self) -> None: ...


class _Trainer(Protocol):
    """What the loop calls on the trainer (:class:`GRPOTrainer`, or
    :class:`twinkle.demo.ray_rig.RayTrainer`)."""

    @property
    def optimizer_steps(self) -> int: ...

    def train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult: ...

    def state(self) -> Any: ...


@dataclass
class Rig:
    """What the loop drives: the trainer, the rollout engines and where weights go;
    ``after_rollouts(iteration, batches)`` observes the engines once an iteration's
    rollouts are in, ``totals()`` gives the engines' own terminal totals, and
    ``worker_memory(iteration)`` the memory readings other processes shipped for the
    iteration (published with this process's own in one event: one reduction)."""

    trainer: _Trainer
    engines: Sequence[Engine]
    publisher: Publisher | Sequence[WeightLoader]
    after_rollouts: Callable[[int, Sequence[RolloutBatch]], None] = lambda it, batches: None
    totals: Callable[[], Mapping[str, int | float]] = dict
    worker_memory: Callable[[int], Sequence[MemoryReading]] = lambda it: ()


@contextlib.contextmanager
def torch_rig(
    cfg: DemoConfig, run: RunSession, first: int, on_step: Callable[[int, int, int], object]
) -> Iterator[Rig]:
    if cfg.sim_device:
        from twinkle.demo.sim import SimEngine, SimTrainer

        sims = [
            SimEngine(f"engine{i}", i, cfg, run.recorder, first_iteration=first)
            for i in range(cfg.engines)
        ]
        _load_initial(sims, first, None)
        yield Rig(SimTrainer(cfg, run.recorder, on_step), sims, publisher=sims)
        return
    engines = [
        TorchEngine(f"engine{i}", i, cfg, run.recorder, first_iteration=first)
        for i in range(cfg.engines)
    ]
    if cfg.train_workers > 1:
        from twinkle.demo.ddp import DDPTrainer

        with DDPTrainer(cfg, run, on_step, world=cfg.train_workers) as ddp:
            _load_initial(engines, first, ddp.state())
            yield Rig(ddp, engines, publisher=engines, worker_memory=ddp.memory)
        return
    trainer = GRPOTrainer(cfg, run.recorder, on_step)
    _load_initial(engines, first, trainer.state())
    yield Rig(trainer, engines, publisher=engines)


def _load_initial(engines: Sequence[Any], first: int, state: Any) -> None:
    """Every engine starts from the trainer's initial weights (version ``first``)."""
    for engine in engines:
        engine.load_weights(first, state)


@contextlib.contextmanager
def ray_rig(
    cfg: DemoConfig, run: RunSession, first: int, on_step: Callable[[int, int, int], object]
) -> Iterator[Rig]:
    from twinkle.demo.ray_rig import ray_workers

    with ray_workers(cfg, run, first, on_step) as workers:
        yield Rig(
            workers.trainer,
            workers.engines,
            publisher=workers.engines,
            worker_memory=workers.memory,
        )


@contextlib.contextmanager
def vllm_rig(
    cfg: DemoConfig,
    run: RunSession,
    first: int,
    on_step: Callable[[int, int, int], object],
    python: str | os.PathLike[str] | None,
) -> Iterator[Rig]:
    from twinkle.demo.vllm import vllm_rig as start_vllm

    bus = run.bus
    with start_vllm(
        cfg,
        run.recorder,
        first_iteration=first,
        on_step=on_step,
        python=python,
    ) as rig:

        def after_rollouts(iteration: int, batches: Sequence[RolloutBatch]) -> None:
            if not cfg.observers:  # a run without observers observes no engine
                return
            for batch in batches:
                bus.scalars(
                    iteration=iteration, name=f"vllm.{batch.engine}", values=batch.engine_figures
                )
            with bus.own_work("engine_memory"):
                readings = rig.engine_memory()
            # Read now, once the iteration's rollouts are in: with streaming, in the
            # window before the iteration's; the reading is placed by its time.
            bus.memory(readings, iteration=None)

        def totals() -> dict[str, int]:
            try:
                return {"tokens_rollout": rig.engine_tokens()}
            except VllmHttpError as exc:  # the run is done: its summary just lacks it
                print(
                    f"twinkle demo: no engine token total for the summary to compare: {exc}",
                    file=sys.stderr,
                )
                return {}

        yield Rig(
            rig.trainer,
            rig.engines,
            publisher=rig.publisher,
            after_rollouts=after_rollouts,
            totals=totals,
        )
