"""Observe verl's PPO and GRPO training (its v1 trainers' ``fit()``) as one twinkle run.

Turn it on with two overrides of verl's own configuration, no code change::

    python -m verl.trainer.main_ppo ... \\
        trainer.logger='[console,twinkle]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=twinkle.integrations.verl.install

Ray runs :func:`install` in every worker process it starts, among them the
``TaskRunner`` actor in which verl's trainer runs (on a cluster: every node's workers;
twinkle must be installed where they run). ``install`` makes ``twinkle`` a logger
backend verl's ``Tracking`` accepts; the trainer's ``Tracking`` then opens the run at
the start of ``fit()`` and finishes it at ``Tracking.finish`` (verl's ``TaskRunner``
calls it when ``fit()`` returns or raises: ``exit_code`` 1 finishes the run with status
``error``, naming the exception). In a driver of your own, call ``install()`` before the
trainer's ``fit()``, and finish it after (``trainer.logger.finish(exit_code=0)``, 1 when
``fit()`` raised), as verl's ``TaskRunner`` does. The run is written to
``runs/<run_id>/`` under the trainer process's working directory (``TWINKLE_OUT_DIR`` and
``TWINKLE_RUN_ID`` in that process's environment choose another place or name: on a
Ray cluster, ``+ray_kwargs.ray_init.runtime_env.env_vars.TWINKLE_OUT_DIR=...``). A named
run that did not finish resumes; one that finished ``ok`` is continued when verl's
``fit()`` loads a checkpoint (``trainer.resume_mode`` ``auto`` finding one in
``trainer.default_local_dir``, or ``resume_path``: a job given more steps) and refused,
naming the fix, when it trains from scratch; ``TWINKLE_RESUME`` (``1`` continue, ``0``
never) decides instead (:mod:`twinkle.integrations._verl_resume`, which also says when a
job redoes steps the run counted).

In every mode ``gen`` is the trainer waiting for its samples from the replay buffer:
with the ``sync`` trainer, the whole generation of the step's batch; in the asynchronous
modes (``trainer.v1.trainer_mode`` ``colocate_async``, ``separate_async``), generation
runs beside training on the rollout's own workers, and ``gen`` is only what is left to
wait. So the critical path's generation is that wait, and there is no rollout
throughput outside ``sync``. ``separate_async``'s switches of the devices between
trainer and rollout are the ``switch`` phase; its train phase counts the trainer's GPUs,
the window verl's denominator (with the rollout's).

What the run holds, on verl's own boundaries:

* **Iterations**: one per training step, begun when verl's ``step`` timer opens.
* **Spans**: one per verl timer, under its name (``step``, ``gen``, ``reward``,
  ``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``,
  ``update_weights``, ``save_checkpoint``, ``testing``, ...), each around verl's own
  timing, so it holds verl's ``timing_s/<name>``.
* **Samples**: at the step's ``_compute_metrics``, each sample of the step's batch that is
  not padding (verl's tags ``prompt_len``, ``response_len``, ``is_padding``), its
  prompt + response tokens as ``rollout`` (in groups of ``rollout.n``) and as ``train``
  (the batch the step trains on).
* An **optimizer step** per training step (a policy version: the optimizer steps of its
  PPO mini-batches run in verl's workers), a **memory reading** of the trainer's process,
  and what verl logs per step (``timing_s/*``, ``perf/*``, ``actor/*``, ...) as scalars
  named ``verl``, with its ``global_step``.

The phases (:func:`observer_config`) group the timers: ``rollout`` (``gen``), ``reward``,
``train`` (all the trainer's devices do: ``old_log_prob``, ``ref``, ``values``,
``update_critic``, ``update_actor``; the critical path's training; each timer's own
seconds are its spans), ``advantage`` (``adv``, on the driver), ``publish``
(``update_weights``), ``switch`` (``separate_async``'s ``switch_*``), ``checkpoint``
(``save_checkpoint``), ``validate`` (``testing``) and ``step``. The window and the
rollout count the devices verl's own ``perf/throughput`` divides by (the trainer's
``_get_n_gpus_for_throughput()``), the train phase the trainer's own GPUs.

The summary's ``compare`` sets verl's own figures beside twinkle's (``config.compare``,
docs/metrics.md "A framework's own figures"): each timer's ``timing_s/<name>`` against
its spans' seconds, and ``perf/throughput`` against the step's rollout tokens over the
``step`` span's seconds and those devices. twinkle's window throughput is lower than
verl's: its window also holds the time between ``step`` timers (metrics, logging,
validation), and it leaves out padding samples, whose tokens verl counts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from twinkle.checks import is_integer
from twinkle.integrations._figures import logged_figures
from twinkle.integrations._trl_ranks import whole_groups
from twinkle.integrations._verl_resume import (
    RESUME_ENV,
    RUN_ID_ENV,
    redone,
    resume_choice,
    setting,
    started,
)
from twinkle.integrations._verl_timer import TIMERS
from twinkle.run import RunSession, RunState

__all__ = [
    "BACKEND",
    "OUT_DIR_ENV",
    "RESUME_ENV",
    "RUN_ID_ENV",
    "VerlRun",
    "install",
    "observer_config",
]

log = logging.getLogger("twinkle.integrations.verl")

#: The logger backend's name in ``trainer.logger``.
BACKEND = "twinkle"
#: The environment's choice of where the run is written (default ``runs``).
OUT_DIR_ENV = "TWINKLE_OUT_DIR"

#: verl's timers by phase (docs: the module's).
PHASES: dict[str, list[str]] = {
    "rollout": ["gen"],
    "reward": ["reward"],
    # the trainer's devices at work: log-probabilities and values, then the updates
    "train": ["old_log_prob", "ref", "values", "update_critic", "update_actor"],
    "advantage": ["adv"],
    "publish": ["update_weights"],
    # separate_async: the trainer's and the rollout's devices trading places
    "switch": ["switch_to_trainer", "switch_wait", "switch_to_rollout"],
    "checkpoint": ["save_checkpoint"],
    "validate": ["testing"],
    "step": ["step"],
}


def observer_config(
    *,
    devices: float,
    total_steps: int | None,
    train_devices: float | None = None,
    mode: str = "sync",
) -> dict[str, Any]:
    """The business definitions of a verl run: :data:`PHASES`, ``rollout`` and ``train``
    throughput, the run window over the rollout samples, generation (the trainer's wait
    for its samples, ``gen``), training and publishing for the critical path, verl's own
    figures to compare (its scalars ``verl``).

    :param devices: verl's throughput denominator (its ``_get_n_gpus_for_throughput()``:
        with ``separate_async``, the rollout's GPUs too): the window's and the rollout's.
    :param train_devices: the trainer's GPUs (default ``devices``): the train phase's.
    :param mode: verl's ``trainer.v1.trainer_mode``. Outside ``sync`` the rollout runs
        beside the trainer, elsewhere, and ``gen`` only waits for its samples: there is
        no rollout throughput (it would be the samples over that wait).
    """
    throughput: dict[str, Any] = {
        "rollout": {"samples": "rollout", "devices": devices},
        "train": {"samples": "train", "devices": train_devices or devices},
    }
    if mode != "sync":
        del throughput["rollout"]
    config: dict[str, Any] = {
        "phases": {name: list(spans) for name, spans in PHASES.items()},
        "throughput": throughput,
        "window": {"samples": "rollout", "devices": devices},
        "streaming": {"generation": "rollout", "training": "train", "publish": "publish"},
        "compare": {
            "scalars": "verl",
            "seconds": {n: f"timing_s/{n}" for names in PHASES.values() for n in names},
            "throughput": {
                "key": "perf/throughput",
                "span": "step",
                "samples": "rollout",
                "devices": devices,
            },
        },
    }
    if total_steps is not None:
        config["total_steps"] = total_steps
    return config


def install() -> None:
    """Make ``twinkle`` a logger backend of verl's ``Tracking`` (``trainer.logger``) in
    this process; once (Ray's ``worker_process_setup_hook`` runs it in every worker)."""
    from verl.utils import tracking

    cls = tracking.Tracking
    if getattr(cls, "_twinkle_installed", False):
        return
    if BACKEND not in cls.supported_backend:
        cls.supported_backend.append(BACKEND)
    original_init, original_finish = cls.__init__, cls.finish

    @functools.wraps(original_init)
    def __init__(
        self: Any,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] = "console",
        config: Any = None,
    ) -> None:
        original_init(self, project_name, experiment_name, default_backend, config)
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        if BACKEND in names:
            trainer = _trainer_on_stack()
            self.logger[BACKEND] = VerlRun(project_name, experiment_name, config, trainer)

    @functools.wraps(original_finish)
    def finish(self: Any, exit_code: int = 0) -> None:
        run = getattr(self, "logger", {}).get(BACKEND)
        try:
            original_finish(self, exit_code)
        finally:
            if isinstance(run, VerlRun):
                run.finish(exit_code)

    cls.__init__ = __init__
    cls.finish = finish
    cls._twinkle_installed = True


def _trainer_on_stack() -> Any:
    """The verl trainer whose ``fit()`` makes the ``Tracking`` (one with
    ``_compute_metrics`` and ``global_steps``), or None."""
    frame = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "_compute_metrics") and hasattr(candidate, "global_steps"):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


class VerlRun:
    """One ``fit()`` observed: verl's ``Tracking`` backend ``twinkle``."""

    def __init__(self, project: str, experiment: str, config: Any, trainer: Any) -> None:
        config = config if isinstance(config, Mapping) else {}
        self.trainer = trainer
        self.per_group = int(setting(config, "actor_rollout_ref", "rollout", "n") or 0)
        steps = _steps(getattr(trainer, "total_training_steps", None), config)
        mode = getattr(trainer, "trainer_mode", None) or setting(
            config, "trainer", "v1", "trainer_mode"
        )
        devices = _devices(trainer, config)
        run_config = observer_config(
            devices=devices,
            total_steps=steps,
            train_devices=_trainer_devices(trainer) or devices,
            mode=str(mode or "sync"),
        )
        run_config["x_verl"] = {
            "project": str(project),
            "experiment": str(experiment),
            "trainer": None if trainer is None else type(trainer).__name__,
            "mode": str(mode or "sync"),
        }
        self.session = started(
            RunSession(
                out_dir=os.environ.get(OUT_DIR_ENV, "runs"),
                run_id=os.environ.get(RUN_ID_ENV) or None,
                config=run_config,
                resume=resume_choice(config),
            )
        )
        # (verl's v1 fit() loaded its checkpoint before it made its loggers)
        redone(self.session, getattr(trainer, "global_steps", None))
        resumed = self.session.resumed
        self.next_iteration = 0 if resumed is None else resumed.next_iteration
        self.steps = 0 if resumed is None else resumed.optimizer_steps
        self.iteration: int | None = None
        self.stepped: int | None = None  # the last iteration given its optimizer step
        self.samples = 0  # the iteration's train samples
        self.failure: BaseException | None = None  # an exception that left a timer
        self.left_out: set[str] = set()
        self.warned_tags = self.warned_padding = False
        self.padding: tuple[int, int] | None = None  # the step's padding: samples, tokens
        self._restore: dict[str, Any] = {}
        if trainer is not None:
            original = trainer._compute_metrics
            self._restore["_compute_metrics"] = vars(trainer).get("_compute_metrics", _MISSING)
            trainer._compute_metrics = functools.wraps(original)(self._metrics(original))
        TIMERS.acquire(self)

    # -- verl's timers and metric calls -------------------------------------------------

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """The span of verl's timer ``name``; ``step`` begins an iteration. Nothing once
        the run is over (a timer must never raise into verl's training)."""
        if self.session.state is not RunState.RUNNING:
            yield
            return
        if name == "step":
            self.iteration, self.next_iteration = self.next_iteration, self.next_iteration + 1
            self.samples, self.padding = 0, None
            self.session.bus.iteration_started(self.iteration)
        attrs: dict[str, Any] = {} if self.iteration is None else {"iteration": self.iteration}
        with self.session.recorder.span(name, **attrs):
            try:
                yield
            except GeneratorExit:  # (the timer abandoned, not failed)
                raise
            except BaseException as exc:
                self.failure = exc
                raise

    def _metrics(self, original: Any) -> Any:
        def compute_metrics(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if self.iteration is not None and self.session.state is RunState.RUNNING:
                self._samples(getattr(batch, "tags", None))
            return original(batch, *args, **kwargs)

        return compute_metrics

    def _samples(self, tags: Any) -> None:
        """The step's samples from its batch's tags (padding left out)."""
        try:
            real = [t for t in tags if not t.get("is_padding", False)]
            prompts = [int(t["prompt_len"]) for t in real]
            lengths = [p + int(t["response_len"]) for p, t in zip(prompts, real, strict=True)]
            pads = [
                int(t["prompt_len"]) + int(t["response_len"])
                for t in tags
                if t.get("is_padding", False)
            ]
        except (TypeError, KeyError, ValueError, AttributeError):
            if not self.warned_tags:
                self.warned_tags = True
                log.warning(
                    "run %r: the step's batch has no prompt_len/response_len tags (verl's v1 "
                    "agent loop, AgentLoopWorkerTQ, writes them for each sample it returns; "
                    "a custom agent loop must too): its samples are not recorded, so the run "
                    "counts no tokens and its throughput reads 0 (the report names the "
                    "missing samples)",
                    self.session.run_id,
                )
            return
        assert self.iteration is not None
        self._padded(len(pads), sum(pads))
        bus = self.session.bus
        groups = whole_groups(len(lengths), self.per_group)
        bus.samples(
            iteration=self.iteration,
            phase="rollout",
            lengths=lengths,
            prompt_lengths=prompts,
            groups=groups,
        )
        bus.samples(
            iteration=self.iteration, phase="train", lengths=lengths, prompt_lengths=prompts
        )
        self.samples += len(lengths)

    def _padded(self, samples: int, tokens: int) -> None:
        """The step's padding, kept for its scalars; said once, when verl first pads."""
        self.padding = (samples, tokens)
        if samples and not self.warned_padding:
            self.warned_padding = True
            log.warning(
                "run %r: verl padded iteration %d's batch with %d no-op sample(s) of %d tokens "
                "(to divide it among its workers): verl's perf/total_num_tokens and "
                "perf/throughput count them, twinkle's tokens leave them out (they train "
                "nothing), so summary.json compare.throughput differs by their share; each "
                "'verl' scalar record holds the step's padding_samples and padding_tokens",
                self.session.run_id,
                self.iteration,
                samples,
                tokens,
            )

    # -- verl's Tracking backend ----------------------------------------------------------

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """verl's figures of a step (``Tracking.log``): the step's scalars, its optimizer
        step and a memory reading; a log before the first step (validation before
        training) has no iteration and is left out."""
        iteration = self.iteration
        if iteration is None or self.session.state is not RunState.RUNNING:
            return
        values = logged_figures(
            data, left_out=self.left_out, run_id=self.session.run_id, library="verl"
        )
        if values:
            values.setdefault("global_step", int(step))
            if self.padding is not None:
                values.setdefault("padding_samples", self.padding[0])
                values.setdefault("padding_tokens", self.padding[1])
            self.session.bus.scalars(iteration=iteration, name="verl", values=values)
        if self.stepped != iteration:
            self.stepped = iteration
            self.steps += 1
            bus = self.session.bus
            bus.optimizer_step(iteration=iteration, step=self.steps, samples=self.samples)
            self.session.read_memory(iteration=iteration)

    def finish(self, exit_code: int = 0) -> None:
        """The run's end (``Tracking.finish``): status ``error`` for a non-zero
        ``exit_code``, naming the exception being raised (or the last one that left one
        of verl's timers)."""
        if self._restore:
            trainer, saved = self.trainer, self._restore.pop("_compute_metrics")
            if saved is _MISSING:
                vars(trainer).pop("_compute_metrics", None)
            else:
                trainer._compute_metrics = saved
        TIMERS.release(self)
        if self.session.state is not RunState.RUNNING:
            return
        if not exit_code:
            self.session.finish()
            return
        exc = sys.exc_info()[1] or self.failure
        error = (
            f"verl's training ended with exit code {exit_code}"
            if exc is None
            else f"{type(exc).__qualname__}: {exc}"
        )
        self.session.finish(status="error", error=error)


def _devices(trainer: Any, config: Mapping[str, Any]) -> float:
    """verl's own throughput denominator: the trainer's, else the configuration's GPUs."""
    counted = _gpus(getattr(trainer, "_get_n_gpus_for_throughput", None))
    if counted is not None:
        return counted
    per_node = setting(config, "trainer", "n_gpus_per_node") or 1
    nodes = setting(config, "trainer", "nnodes") or 1
    return int(per_node) * int(nodes)


def _trainer_devices(trainer: Any) -> int | None:
    """The trainer's own GPUs (its resource pools'), or None."""
    return _gpus(getattr(getattr(trainer, "resource_pool_manager", None), "get_n_gpus", None))


def _gpus(count: Any) -> int | None:
    """``count()``'s GPUs when it is a method that tells them (a positive int), else
    None (also when it raises: the trainer's resource pool may not be made yet)."""
    if callable(count):
        with contextlib.suppress(Exception):
            n = count()
            if isinstance(n, int) and n > 0:
                return n
    return None


def _steps(counted: Any, config: Mapping[str, Any]) -> int | None:
    """The planned steps: the trainer's (it works them out from the data when the
    configuration leaves ``trainer.total_training_steps`` null), else the configuration's."""
    for steps in (counted, setting(config, "trainer", "total_training_steps")):
        if is_integer(steps) and steps >= 0:
            return steps
    return None


_MISSING = object()
