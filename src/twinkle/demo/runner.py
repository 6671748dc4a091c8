"""Runs the demo: engines and trainer driven by the StreamingDriver, observed by twinkle.

The demo is the caller, so it defines the business semantics:

* effective tokens = prompt + response tokens of every trajectory (sample tag
  ``rollout``: generated; ``train``: the trainer's visits);
* phases: ``rollout`` = the engines' ``generate`` and ``reward`` spans; ``train`` =
  advantage, old/ref log-probs and every micro-batch's forward/backward and optimizer
  step; ``publish`` = writing a weight version (vLLM) and loading it on the engines;
  ``startup`` = starting the engines or workers (vLLM: ``engine.start``; Ray and DDP:
  ``workers.start``), ``shutdown`` = stopping them (vLLM: ``engine.shutdown``; Ray
  and DDP: ``workers.stop``): the
  run's ``lifecycle`` phases, busy in the set-up and tear-down windows and never in an
  iteration or the run's throughput;
* the device denominators come from the placement (``config.placement``): every
  engine and the trainer (or each rank, or each Ray actor) states the device it used,
  and all of them use this host's CPU (``host-cpu``: the demo places nothing on
  an accelerator), so each phase and the run window divide by that one device, shared
  by every worker, and the summary's ``placement`` and the report say so, whatever
  accelerators the :class:`~twinkle.cluster.LocalCluster` reports (those are recorded
  in the config as ``x_cluster``, not divided by);
* streaming: generation is ``rollout``, training is ``train`` (the share of generation
  running while training runs).

Weights are published as soon as no rollout still needs the older version: version
``v`` (trained through iteration ``v - 1``) once the rollouts of iteration ``v - 1 +
lag`` are in from every engine, so an engine never swaps weights under a generation in
flight. A version no rollout uses is not published (the last update's; with streaming
the one before too). One pending version is enough: the lag is 0 or 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from twinkle.cluster import LocalCluster
from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutBatch, TorchEngine, Trajectory
from twinkle.demo.hf import TinyLlamaSpec
from twinkle.demo.mfu import demo_mfu, logged_events
from twinkle.demo.trainer import GRPOTrainer, IterationResult
from twinkle.driver import Publisher, StreamingDriver, WeightLoader
from twinkle.engines import VllmHttpError
from twinkle.errors import TwinkleError
from twinkle.events import OptimizerStep
from twinkle.observers import EVENTS_FILE
from twinkle.perf import MemoryReading
from twinkle.reporting import DEFAULT_BACKEND_TIMEOUT_S
from twinkle.run import RunSession, iter_events

__all__ = ["DemoResult", "observer_config", "run_demo"]


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the run did: per-iteration results, the summary and where the files are."""

    config: DemoConfig
    run_dir: Path | None
    iterations: tuple[IterationResult, ...]
    summary: dict[str, Any]
    trajectories: tuple[tuple[Trajectory, ...], ...]
    wall_seconds: float


def _placement(cfg: DemoConfig, phases: Mapping[str, Any]) -> dict[str, Any]:
    """Which device each worker used and which phases it ran: every worker runs on this
    host's CPU, one device whatever the workers' number (they share its cores)."""
    # (named without the host: a run resumed on another host keeps its configuration;
    # x_cluster records the host's resources)
    cpu = {"device_type": "cpu", "devices": ["host-cpu"]}
    lifecycle = [p for p in ("startup", "shutdown") if p in phases]
    trainers = (
        ["trainer"] if cfg.train_workers == 1 else [f"rank{r}" for r in range(cfg.train_workers)]
    )
    trainer_phases = ["train", *(["publish"] if cfg.engine == "vllm" else []), *lifecycle]
    placement = {name: {**cpu, "phases": trainer_phases} for name in trainers}
    for i in range(cfg.engines):
        placement[f"engine{i}"] = {**cpu, "phases": ["rollout", "publish", *lifecycle]}
    return placement


def _cluster(cfg: DemoConfig) -> dict[str, Any]:
    resources = LocalCluster(torch=True, workers={"rollout": cfg.engines, "trainer": 1})
    return resources.resources().to_dict()


def _steps_taken(out_dir: str | os.PathLike[str] | None, run_id: str | None) -> int:
    """The optimizer steps the run ``run_id`` took already, when this demo continues it
    (0 for a new run; a log that cannot be read is the session's to refuse)."""
    if out_dir is None or run_id is None:
        return 0
    log = Path(out_dir) / run_id / EVENTS_FILE
    steps = 0
    if log.is_file():
        with contextlib.suppress(TwinkleError):
            for event in iter_events(log):
                if isinstance(event, OptimizerStep):
                    steps = max(steps, event.step)
    return steps


def observer_config(cfg: DemoConfig, steps_taken: int = 0) -> dict[str, Any]:
    """The business definitions the observers apply (travels in ``run_started``);
    ``total_steps`` plans the whole run: the ``steps_taken`` by the segments before
    this one (a continued run) and this one's iterations'."""
    phases: dict[str, list[str]] = {
        "rollout": ["generate", "reward"],
        "train": ["advantage", "old_logprobs", "ref_logprobs", "train.*"],
        "publish": ["weights.load"],
    }
    model: dict[str, Any] = {}
    if cfg.engine == "vllm":
        phases["publish"] = ["weights.write", "weights.load"]
        # Starting the engines is the run's work too: busy, not idle, in the set-up (a
        # lifecycle phase: not the loop's, so not in the run window's time).
        phases["startup"] = ["engine.start"]
        phases["shutdown"] = ["engine.shutdown"]  # (the pool stops the servers)
        model = {"x_model": dataclasses.asdict(TinyLlamaSpec())}  # d_model etc. are unused
    if cfg.backend == "ray" or cfg.train_workers > 1:
        # Starting and stopping the workers is the run's work too (busy, not idle).
        phases["startup"] = ["workers.start"]
        phases["shutdown"] = ["workers.stop"]
    lifecycle = {
        role: [name]
        for role, name in (("setup", "startup"), ("teardown", "shutdown"))
        if name in phases
    }
    return {
        "phases": phases,
        **({"lifecycle": lifecycle} if lifecycle else {}),
        "placement": _placement(cfg, phases),
        "throughput": {"rollout": {"samples": "rollout"}, "train": {"samples": "train"}},
        "window": {"samples": "rollout"},
        "streaming": {"generation": "rollout", "training": "train", "publish": "publish"},
        "total_steps": steps_taken + cfg.iterations * _steps_per_iteration(cfg),
        "x_demo": {**cfg.to_dict(), "lr": cfg.learning_rate},  # the lr used
        **model,
    }


def _steps_per_iteration(cfg: DemoConfig) -> int:
    per_step = cfg.micro_batch * cfg.grad_accum
    return -(-cfg.samples_per_iteration // per_step)


class _Engine(Protocol):
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


def _producer(
    engine: _Engine, iterations: range, stopping: threading.Event
) -> Callable[[int], RolloutBatch]:
    """One engine's producer: its share of each of ``iterations``, then exhausted; also
    exhausted when the run stops early (``stopping``) and closing the engine cut its
    rollout short, which is no failure."""
    counter = iter(iterations)

    def produce(version: int) -> RolloutBatch:
        iteration = next(counter)  # StopIteration ends the producer
        try:
            return engine.rollout(iteration)
        except Exception:  # a closed engine, a stopped server's refused request
            if stopping.is_set():
                raise StopIteration from None
            raise

    return produce


@contextlib.contextmanager
def _stop_engines_on_error(engines: Sequence[_Engine], stopping: threading.Event) -> Iterator[None]:
    """On an exception (Ctrl-C, a signal, a failure) close the engines *before* the driver
    joins its producers: a producer waiting for weights that will never be published
    would otherwise hold the driver's close for its whole timeout."""
    try:
        yield
    except BaseException:
        stopping.set()
        for engine in engines:
            engine.close()
        raise


@dataclass
class _Rig:
    """What the loop drives: the trainer, the rollout engines and where weights go;
    ``after_rollouts(iteration, batches)`` observes the engines once an iteration's
    rollouts are in, ``totals()`` gives the engines' own terminal totals, and
    ``worker_memory(iteration)`` the memory readings other processes shipped for the
    iteration (published with this process's own in one event: one reduction)."""

    trainer: _Trainer
    engines: Sequence[_Engine]
    publisher: Publisher | Sequence[WeightLoader]
    after_rollouts: Callable[[int, Sequence[RolloutBatch]], None] = lambda it, batches: None
    totals: Callable[[], Mapping[str, int | float]] = dict
    worker_memory: Callable[[int], Sequence[MemoryReading]] = lambda it: ()


@contextlib.contextmanager
def _torch_rig(
    cfg: DemoConfig, run: RunSession, first: int, on_step: Callable[[int, int, int], object]
) -> Iterator[_Rig]:
    engines = [
        TorchEngine(f"engine{i}", i, cfg, run.recorder, first_iteration=first)
        for i in range(cfg.engines)
    ]
    if cfg.train_workers > 1:
        from twinkle.demo.ddp import DDPTrainer

        with DDPTrainer(cfg, run, on_step, world=cfg.train_workers) as ddp:
            _load_initial(engines, first, ddp.state())
            yield _Rig(ddp, engines, publisher=engines, worker_memory=ddp.memory)
        return
    trainer = GRPOTrainer(cfg, run.recorder, on_step)
    _load_initial(engines, first, trainer.state())
    yield _Rig(trainer, engines, publisher=engines)


def _load_initial(engines: Sequence[TorchEngine], first: int, state: Any) -> None:
    """Every engine starts from the trainer's initial weights (version ``first``)."""
    for engine in engines:
        engine.load_weights(first, state)


@contextlib.contextmanager
def _ray_rig(
    cfg: DemoConfig, run: RunSession, first: int, on_step: Callable[[int, int, int], object]
) -> Iterator[_Rig]:
    from twinkle.demo.ray_rig import ray_workers

    with ray_workers(cfg, run, first, on_step) as workers:
        yield _Rig(
            workers.trainer,
            workers.engines,
            publisher=workers.engines,
            worker_memory=workers.memory,
        )


@contextlib.contextmanager
def _vllm_rig(
    cfg: DemoConfig,
    run: RunSession,
    first: int,
    on_step: Callable[[int, int, int], object],
    python: str | os.PathLike[str] | None,
) -> Iterator[_Rig]:
    from twinkle.demo.vllm import vllm_rig

    bus = run.bus
    with vllm_rig(
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

        yield _Rig(
            rig.trainer,
            rig.engines,
            publisher=rig.publisher,
            after_rollouts=after_rollouts,
            totals=totals,
        )


def run_demo(
    cfg: DemoConfig,
    *,
    out_dir: str | os.PathLike[str] | None = "runs",
    run_id: str | None = None,
    progress: Callable[[IterationResult], None] | None = None,
    autoload: bool | None = None,
    blocked: Iterable[str] = (),
    required_plugins: Iterable[str] = (),
    backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
    resume: bool | None = None,
    vllm_python: str | os.PathLike[str] | None = None,
    peak_flops: float | str | None = None,
) -> DemoResult:
    """Run the tiny GRPO training, fully observed unless ``cfg.observers`` is false.

    ``peak_flops``: the CPU's peak FLOP/s for the run's MFU, or ``"measured"`` (a timed
    matrix product, labelled so); None: MFU abstains (no datasheet covers a CPU), the
    FLOPs are still reported.

    ``vllm_python``: the interpreter of the vLLM engines (``cfg.engine == "vllm"``;
    default :func:`twinkle.demo.hf.default_vllm_python`). ``resume``: as
    :class:`~twinkle.run.RunSession`'s (a run ``run_id`` that finished ok is continued
    only with ``True``)."""
    t0 = time.perf_counter()
    torch.set_num_threads(1)  # several workers share 2 cores: no intra-op oversubscription
    config = observer_config(cfg, _steps_taken(out_dir if cfg.observers else None, run_id))
    config["x_cluster"] = _cluster(cfg)
    if cfg.observers:
        mfu = demo_mfu(cfg, peak_flops, logged_events(out_dir, run_id))
        if mfu is not None:
            config["mfu"] = mfu
    session = RunSession(
        out_dir=out_dir if cfg.observers else None,
        run_id=run_id,
        config=config,
        builtins=cfg.observers,
        autoload=autoload if cfg.observers else False,
        blocked=blocked,
        required_plugins=required_plugins if cfg.observers else (),
        backend_timeout_s=backend_timeout_s,
        resume=resume,
    )
    results: list[IterationResult] = []
    kept: list[tuple[Trajectory, ...]] = []
    with session as run:
        rec, bus = run.recorder, run.bus
        # A run id whose directory holds the run already: this process is a restart and
        # continues its numbering (the tiny model itself starts afresh: no checkpoint).
        resumed = run.resumed
        first = 0 if resumed is None else resumed.next_iteration
        steps_before = 0 if resumed is None else resumed.optimizer_steps
        iterations = range(first, first + cfg.iterations)

        def on_step(it: int, step: int, n: int) -> None:
            bus.optimizer_step(iteration=it, step=steps_before + step, samples=n)

        if cfg.backend == "ray":
            rig_cm = _ray_rig(cfg, run, first, on_step)
        elif cfg.engine == "torch":
            rig_cm = _torch_rig(cfg, run, first, on_step)
        else:
            rig_cm = _vllm_rig(cfg, run, first, on_step, vllm_python)
        with rig_cm as rig:
            engines, trainer = rig.engines, rig.trainer
            stopping = threading.Event()
            producers = {e.name: _producer(e, iterations, stopping) for e in engines}
            generated = groups = visits = 0
            # Version v is published once no rollout needs an older one: when the
            # rollouts of iteration v - 1 + lag are in.
            pending: tuple[int, Any] | None = None  # (version, the trainer's state)
            try:
                with (
                    StreamingDriver(
                        producers,
                        bus=bus,
                        publisher=rig.publisher,
                        buffer_size=2 * cfg.engines,
                        # The driver tags an item with its version when it *calls* the
                        # producer; the engine then waits for exactly the version the
                        # iteration is due (iteration - lag), so a tag can trail the real
                        # version by up to two publishes. The engine's schedule is the
                        # real bound; this is the net.
                        max_staleness=cfg.lag + 2,
                        auto_iterations=False,
                        initial_version=first,
                        first_iteration=first,
                    ) as driver,
                    _stop_engines_on_error(engines, stopping),
                ):

                    def publish_due(rollouts_in: int) -> None:
                        nonlocal pending
                        if pending is not None and pending[0] - 1 + cfg.lag <= rollouts_in:
                            driver.publish_weights(pending[1], version=pending[0], wait=False)
                            pending = None

                    # An engine may finish its share of the next iteration before a
                    # slower engine finishes this one: stash by iteration, take whole ones.
                    stash: dict[int, list[RolloutBatch]] = {}
                    for it in iterations:
                        driver.begin_iteration()
                        with rec.span("wait.rollout", iteration=it):
                            while len(stash.get(it, ())) < cfg.engines:
                                (item,) = driver.next_batch(1)
                                stash.setdefault(item.payload.iteration, []).append(item.payload)
                        batches = sorted(stash.pop(it), key=lambda b: b.engine)
                        if [b.engine for b in batches] != sorted(e.name for e in engines):
                            raise RuntimeError(
                                f"iteration {it} got rollouts from "
                                f"{[b.engine for b in batches]}, expected one batch per engine"
                            )
                        # Engines load the new weights while the trainer goes on.
                        publish_due(it)
                        rig.after_rollouts(it, batches)
                        trajs = tuple(t for b in batches for t in b.trajectories)
                        lengths = [t.tokens for t in trajs]
                        bus.samples(
                            iteration=it,
                            phase="rollout",
                            lengths=lengths,
                            groups=cfg.prompts_per_iteration,
                            prompt_lengths=[len(t.prompt) for t in trajs],
                        )
                        generated += len(trajs)
                        groups += cfg.prompts_per_iteration
                        result = trainer.train_iteration(it, trajs)
                        bus.samples(iteration=it, phase="train", lengths=lengths)
                        visits += len(trajs)
                        bus.scalars(
                            iteration=it,
                            name="grpo",
                            values={
                                "reward_mean": result.reward_mean,
                                "loss": result.loss,
                                "kl": result.kl,
                            },
                        )
                        run.read_memory(iteration=it, others=rig.worker_memory(it))
                        if it + 1 + cfg.lag < iterations.stop:  # a version some rollout uses
                            pending = (it + 1, trainer.state())
                            publish_due(it)
                        driver.snapshot()
                        results.append(result)
                        kept.append(trajs)
                        if progress is not None:
                            progress(result)
            finally:
                for engine in engines:
                    engine.close()
            # The engines' own totals calibrate the summary; a restart knows only its
            # own segment's, so it gives none (the summary counts every segment's events).
            engine_totals = rig.totals() if resumed is None and cfg.observers else {}
        summary = run.finish(
            terminal_totals=None
            if resumed is not None
            else {
                "samples_rollout": generated,
                "groups_rollout": groups,
                "samples_train": visits,
                "optimizer_updates": trainer.optimizer_steps,
                **engine_totals,
            }
        )
    return DemoResult(
        config=cfg,
        run_dir=run.out_dir,
        iterations=tuple(results),
        summary=summary,
        trajectories=tuple(kept),
        wall_seconds=time.perf_counter() - t0,
    )
