"""The demo on Ray (``twinkle demo --backend ray``): every rollout engine and the trainer
is a Ray actor, a process of its own, on a local Ray cluster bound to 127.0.0.1 (or the
cluster this process already joined).

The actors are the torch demo's own ``TorchEngine`` and ``GRPOTrainer``, unchanged. Each
actor records into a :class:`~twinkle.perf.WorkerRecorder` of its own, on its own clock.
It ships a :class:`~twinkle.perf.WorkerReport` with every result: its spans since the
last one and a memory reading of its process. So an actor never waits on the driver to
ship. The driver's proxies (:class:`RayEngine`, :class:`RayTrainer`) hand each report
to the run (``RunSession.receive``), and the spans move onto the run's timeline through
the actor's clock anchor.

Weights travel from the trainer actor to the engines as one object in Ray's store
(the trainer's ``state()`` result, stored once; every engine reads it). A failing
actor — one that raises, or whose process dies — reaches the loop as a
:class:`~twinkle.errors.WorkerError` that names it, as soon as Ray reports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutBatch, Trajectory
from twinkle.demo.trainer import IterationResult
from twinkle.demo.workers import ReportStash
from twinkle.errors import WorkerError
from twinkle.perf import MemoryReading, WorkerReport
from twinkle.run import RunSession

__all__ = ["RayEngine", "RayTrainer", "RayWorkers", "actor_name", "ray_workers"]

#: How long the driver waits for an actor to come up (its process imports torch).
START_TIMEOUT_S = 120.0


class _Actor:
    """What both actors share: one torch thread (actors share the host's cores), a
    WorkerRecorder named after the worker, and ``ready`` (its pid, once it is up)."""

    def __init__(self, worker: str) -> None:
        import torch

        from twinkle.perf import WorkerRecorder

        torch.set_num_threads(1)
        self.worker = WorkerRecorder(worker)

    def ready(self) -> int:
        import os

        return os.getpid()


class _EngineActor(_Actor):
    """A ``TorchEngine`` in an actor of its own (threaded: ``load_weights`` and
    ``close`` run while a ``rollout`` waits for its weights)."""

    def __init__(self, name: str, index: int, config: dict[str, Any], first: int) -> None:
        from twinkle.demo.engine import TorchEngine

        super().__init__(name)
        self.engine = TorchEngine(
            name, index, DemoConfig(**config), self.worker.recorder, first_iteration=first
        )

    def load_weights(self, version: int, state: dict[str, Any]) -> str:
        return self.engine.load_weights(version, state)

    def rollout(self, iteration: int) -> tuple[RolloutBatch, WorkerReport]:
        batch = self.engine.rollout(iteration)
        return batch, self.worker.report()

    def report(self) -> WorkerReport:
        return self.worker.report()

    def close(self) -> None:
        self.engine.close()


class _TrainerActor(_Actor):
    """The demo's ``GRPOTrainer`` in an actor; each optimizer step is collected and
    returned with the iteration's result, for the driver to publish."""

    def __init__(self, config: dict[str, Any]) -> None:
        from twinkle.demo.trainer import GRPOTrainer

        super().__init__("trainer")
        self.steps: list[tuple[int, int, int]] = []
        self.trainer = GRPOTrainer(
            DemoConfig(**config),
            self.worker.recorder,
            lambda it, step, n: self.steps.append((it, step, n)),
        )

    def state(self) -> dict[str, Any]:
        return self.trainer.state()

    def train_iteration(
        self, iteration: int, trajs: Sequence[Trajectory]
    ) -> tuple[IterationResult, list[tuple[int, int, int]], WorkerReport]:
        self.steps = []
        result = self.trainer.train_iteration(iteration, trajs)
        return result, self.steps, self.worker.report()


def _get(ray: Any, ref: Any, worker: str, timeout: float | None = None) -> Any:
    """``ray.get(ref)``, with an actor's failure as a WorkerError naming ``worker``."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.RayTaskError as exc:  # it raised: its own error is the cause
        cause = exc.cause if exc.cause is not None else exc
        raise WorkerError(
            f"worker {worker!r} (a Ray actor) raised {type(cause).__name__}: {cause}"
        ) from cause
    except ray.exceptions.RayActorError as exc:
        raise WorkerError(
            f"worker {worker!r} (a Ray actor) died: its process exited or was killed "
            f"({type(exc).__name__}); the run keeps every record before it"
        ) from exc
    except ray.exceptions.GetTimeoutError as exc:
        raise WorkerError(
            f"worker {worker!r} (a Ray actor) did not answer within {timeout:.0f} s"
        ) from exc
    except ray.exceptions.RayError as exc:  # an object lost, its owner gone, ...
        raise WorkerError(
            f"worker {worker!r} (a Ray actor): Ray failed to deliver its result: {exc}"
        ) from exc


class RayEngine:
    """The driver's handle on one engine actor: what the loop and the driver's publisher
    call on an engine (``rollout``, ``load_weights``, ``close``)."""

    def __init__(self, ray: Any, actor: Any, name: str, run: RunSession) -> None:
        self._ray = ray
        self._actor = actor
        self._run = run
        self.name = name

    def rollout(self, iteration: int) -> RolloutBatch:
        batch, report = _get(self._ray, self._actor.rollout.remote(iteration), self.name)
        # Its reading was taken as the rollout ended: in the window it arrives in (with
        # streaming, the one before the iteration's), so it is placed by its time.
        self._run.receive(report, iteration=None)
        return batch  # type: ignore[no-any-return]

    def load_weights(self, version: int, state: Any) -> str:
        """Load ``state`` (the trainer's weights in Ray's store); when that fails because
        the trainer failed to produce them, the error names the trainer."""
        try:
            return _get(self._ray, self._actor.load_weights.remote(version, state), self.name)  # type: ignore[no-any-return]
        except WorkerError:
            if isinstance(state, self._ray.ObjectRef):
                _get(self._ray, state, "trainer", START_TIMEOUT_S)  # raises if it failed
            raise

    def drain(self) -> None:
        """Hand the run what the actor recorded since its last rollout."""
        report = _get(self._ray, self._actor.report.remote(), self.name, START_TIMEOUT_S)
        self._run.receive(report, iteration=None)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead actor has nothing to close
            self._actor.close.remote()


class RayTrainer:
    """The driver's handle on the trainer actor (``train_iteration``, ``state``,
    ``optimizer_steps``, as the loop calls a trainer)."""

    def __init__(
        self,
        ray: Any,
        actor: Any,
        stash: ReportStash,
        on_step: Callable[[int, int, int], object],
    ) -> None:
        self._ray = ray
        self._actor = actor
        self._stash = stash
        self._on_step = on_step
        self.optimizer_steps = 0

    def train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        ray = self._ray
        result, steps, report = _get(
            ray, self._actor.train_iteration.remote(iteration, list(trajs)), "trainer"
        )
        self._stash.receive(report, iteration)
        for it, step, n in steps:
            self._on_step(it, step, n)
        self.optimizer_steps = steps[-1][1] if steps else self.optimizer_steps
        return result  # type: ignore[no-any-return]

    def state(self) -> Any:
        """The weights as one object in Ray's store: every engine reads that copy, and
        the driver never fetches it."""
        return self._actor.state.remote()


def actor_name(run_id: str, worker: str) -> str:
    """The Ray actor name of ``worker`` in run ``run_id``: ``twinkle-<run id>-<worker>``."""
    return f"twinkle-{run_id}-{worker}"


@dataclass
class RayWorkers:
    """The handles the loop drives, and each worker's process id."""

    trainer: RayTrainer
    engines: list[RayEngine]
    pids: dict[str, int]
    stash: ReportStash

    def memory(self, iteration: int) -> list[MemoryReading]:
        """The actors' memory readings of ``iteration``."""
        return self.stash.pop(iteration)


@contextlib.contextmanager
def ray_workers(
    cfg: DemoConfig,
    run: RunSession,
    first_iteration: int,
    on_step: Callable[[int, int, int], object],
) -> Iterator[RayWorkers]:
    """Start the trainer and engine actors (Ray started on loopback unless this process
    already joined a cluster), load the initial weights, and stop every actor at the
    end."""
    from twinkle.cluster import import_ray, init_ray

    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        init_ray(include_dashboard=False, log_to_driver=False)
    names = ["trainer", *(f"engine{i}" for i in range(cfg.engines))]
    actors: list[Any] = []
    stash = ReportStash(run)
    try:
        config = dataclasses.asdict(cfg)
        engine_cls = ray.remote(num_cpus=0, max_concurrency=4)(_EngineActor)
        trainer_cls = ray.remote(num_cpus=0)(_TrainerActor)
        with run.recorder.span("workers.start", workers=len(names)):
            # Named after the run, so that a person (or a test) can find one: ray.get_actor.
            actors.append(
                trainer_cls.options(name=actor_name(run.run_id, "trainer")).remote(config)
            )
            actors += [
                engine_cls.options(name=actor_name(run.run_id, name)).remote(
                    name, i, config, first_iteration
                )
                for i, name in enumerate(names[1:])
            ]
            pids = {
                name: _get(ray, actor.ready.remote(), name, START_TIMEOUT_S)
                for name, actor in zip(names, actors, strict=True)
            }
            trainer = RayTrainer(ray, actors[0], stash, on_step)
            engines = [
                RayEngine(ray, actor, name, run)
                for name, actor in zip(names[1:], actors[1:], strict=True)
            ]
            initial = trainer.state()
            for engine in engines:
                engine.load_weights(first_iteration, initial)
        yield RayWorkers(trainer, engines, pids, stash)
        # What the engines recorded after their last rollout (its weights' load).
        for engine in engines:
            engine.drain()
    finally:
        with run.recorder.span("workers.stop", workers=len(actors)):
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if started:
                ray.shutdown()
