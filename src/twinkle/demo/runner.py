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
the ``lag`` before it too). With a lag of 2 or more, several trained versions wait
their turn, oldest first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from twinkle.cluster import LocalCluster
from twinkle.demo._rigs import Engine, ray_rig, torch_rig, vllm_rig
from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutBatch, Trajectory
from twinkle.demo.hf import TinyLlamaSpec
from twinkle.demo.mfu import demo_mfu, logged_events
from twinkle.demo.trainer import IterationResult
from twinkle.driver import StreamingDriver
from twinkle.errors import TwinkleError
from twinkle.events import OptimizerStep
from twinkle.observers import EVENTS_FILE
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
    host's CPU, one device whatever the workers' number (they share its cores); with
    simulated devices, each worker its own."""
    # (named without the host: a run resumed on another host keeps its configuration;
    # x_cluster records the host's resources)
    lifecycle = [p for p in ("startup", "shutdown") if p in phases]
    trainers = _trainers(cfg)
    trainer_phases = ["train", *(["publish"] if cfg.engine == "vllm" else []), *lifecycle]
    placement = {name: {**_device(cfg, name), "phases": trainer_phases} for name in trainers}
    for i in range(cfg.engines):
        placement[f"engine{i}"] = {
            **_device(cfg, f"engine{i}"),
            "phases": ["rollout", "publish", *lifecycle],
        }
    return placement


def _trainers(cfg: DemoConfig) -> list[str]:
    """The trainer's workers, as the placement and their memory readings name them:
    ``trainer``, or ``rank0``... (rank 0 is this process)."""
    if cfg.train_workers == 1:
        return ["trainer"]
    return [f"rank{r}" for r in range(cfg.train_workers)]


def _device(cfg: DemoConfig, worker: str) -> dict[str, Any]:
    """The device ``worker`` runs on: this host's CPU, shared by every worker; with
    simulated devices, one of its own."""
    if cfg.sim_device:
        return {"device_type": "sim", "devices": [f"sim:{worker}"]}
    return {"device_type": "cpu", "devices": ["host-cpu"]}


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
            for event in iter_events(log, warn_torn=False):  # (the resume says it)
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


def _producer(
    engine: Engine, iterations: range, stopping: threading.Event
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
def _stop_engines_on_error(engines: Sequence[Engine], stopping: threading.Event) -> Iterator[None]:
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


def _demo_config(
    cfg: DemoConfig,
    out_dir: str | os.PathLike[str] | None,
    run_id: str | None,
    peak_flops: float | str | None,
) -> dict[str, Any]:
    """The observers' configuration of the demo's run (with its MFU's, unless the run
    is unobserved or its device simulated: a simulated device runs no model)."""
    config = observer_config(cfg, _steps_taken(out_dir if cfg.observers else None, run_id))
    config["x_cluster"] = _cluster(cfg)
    if cfg.observers and not cfg.sim_device:
        mfu = demo_mfu(cfg, peak_flops, logged_events(out_dir, run_id))
        if mfu is not None:
            config["mfu"] = mfu
    return config


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
    session = RunSession(
        out_dir=out_dir if cfg.observers else None,
        run_id=run_id,
        config=_demo_config(cfg, out_dir, run_id, peak_flops),
        builtins=cfg.observers,
        autoload=autoload if cfg.observers else False,
        blocked=blocked,
        required_plugins=required_plugins if cfg.observers else (),
        backend_timeout_s=backend_timeout_s,
        resume=resume,
        # (the trainer runs in this process but with Ray: its spans and memory readings,
        # named as its placement names it)
        source="main" if cfg.backend == "ray" else _trainers(cfg)[0],
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
            rig_cm = ray_rig(cfg, run, first, on_step)
        elif cfg.engine == "torch":
            rig_cm = torch_rig(cfg, run, first, on_step)
        else:
            rig_cm = vllm_rig(cfg, run, first, on_step, vllm_python)
        with rig_cm as rig:
            engines, trainer = rig.engines, rig.trainer
            stopping = threading.Event()
            producers = {e.name: _producer(e, iterations, stopping) for e in engines}
            generated = groups = visits = 0
            # Version v is published once no rollout needs an older one: when the
            # rollouts of iteration v - 1 + lag are in (oldest first).
            pending: deque[tuple[int, Any]] = deque()  # (version, the trainer's state)
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
                        while pending and pending[0][0] - 1 + cfg.lag <= rollouts_in:
                            version, state = pending.popleft()
                            driver.publish_weights(state, version=version, wait=False)

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
                            pending.append((it + 1, trainer.state()))
                            publish_due(it)
                        driver.snapshot()
                        results.append(result)
                        kept.append(trajs)
                        if progress is not None:
                            progress(result)
            finally:
                for engine in engines:
                    engine.close()
            # The engines' own totals calibrate the summary; this process's counts are
            # its segment's (a restart's engines and trainer start from nothing), which
            # the summary compares with the segment's events and adds to the others'.
            engine_totals = rig.totals() if cfg.observers else {}
        summary = run.finish(
            terminal_totals={
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
