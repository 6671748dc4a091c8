"""Observe TRL's ``GRPOTrainer`` — and any transformers ``Trainer`` — as one twinkle run.

::

    from twinkle.integrations.trl import TwinkleCallback

    trainer = GRPOTrainer(..., callbacks=[TwinkleCallback(out_dir="runs")])
    trainer.train()  # writes runs/<run_id>/ (SPEC §8)

Each ``train()`` call is one run, opened at ``on_train_begin`` and finished at
``on_train_end``. When the training raises — in a training step, loading batches, or
logging, evaluating and saving between steps — the run finishes there with status
``error`` and every record written before is kept (an error elsewhere, e.g. in
``optimizer.step()``, finishes it at the next ``train()`` or at the interpreter's exit).
What it records, on TRL's and transformers' own boundaries:

* **Iterations**: one per optimizer step, begun at ``on_step_begin`` (a fresh run's
  iteration ``i`` is the step that takes ``state.global_step`` from ``i`` to ``i + 1``).
* **Spans**, each with its ``iteration``:

  - ``step``: the whole optimizer step, ``on_step_begin`` to ``on_step_end``;
  - ``generate``: TRL's ``_generate`` (tokenising, sampling, decoding, tool calls);
    ``eval.generate`` during evaluation;
  - ``train.step``: one micro-batch's forward and backward, from its inputs being ready
    (``_prepare_inputs`` returned) to ``training_step``'s return;
  - ``train.optimizer``: ``optimizer.step()``, ``on_pre_optimizer_step`` to
    ``on_optimizer_step``;
  - TRL's profiling contexts under TRL's own names (``GRPOTrainer._calculate_rewards``,
    each reward function's, ``GRPOTrainer.transformers.generate``,
    ``GRPOTrainer.sync_weights``, ...; ``eval.<name>`` during evaluation): the timings
    TRL sends only to wandb, mlflow and trackio. ``sync_weights`` runs inside
    ``_generate``, so the ``rollout`` phase holds it and ``publish`` shows it apart.

* **Samples**: ``rollout``, one per completion generated for training, its length the
  prompt plus completion tokens exactly as TRL's ``num_tokens`` counts them (with tool
  calls: the model's own completion tokens); ``train``, one per sample a micro-batch
  trains on (prompt + completion mask tokens, with the prompt's as its prompt length; a
  plain ``Trainer``: attention-mask tokens), read at ``on_step_end``. A generation
  batch serving several steps (``steps_per_generation`` above the gradient
  accumulation) counts its rollout samples in the step that generated it.
* **Optimizer steps** at ``on_step_end``, a **memory reading** of this process per step,
  and TRL's logged figures as **scalars** named ``trl`` (``trl.eval`` for evaluation
  logs, ``trl.train`` for the summary logged after the last step), each with
  transformers' ``global_step`` (a run's own steps count from 1, also after
  ``resume_from_checkpoint``); ``trl.start`` at each ``train()``'s first step, its
  ``global_step`` at the start and the run's ``steps_before``: a later resume that
  starts behind the run's last step (steps done again) says so.
* **Terminal totals** (a fresh run): TRL's ``num_input_tokens_seen`` as
  ``tokens_rollout`` and transformers' ``global_step`` as ``optimizer_updates``, so
  ``summary.json`` says whether twinkle's counts and TRL's agree.

The business definitions are :func:`observer_config`'s unless ``config`` is given.

How it attaches: ``on_train_begin`` finds, on its call stack, the ``Trainer`` whose
callback handler holds the callback, and wraps that trainer's ``training_step``,
``_prepare_inputs``, ``get_batch_samples``, ``_maybe_log_save_evaluate`` and (TRL's
online trainers) ``_generate`` as instance attributes removed when the run ends.
TRL's ``profiling_context`` is wrapped in the ``trl`` modules that use it while any run
is open (:mod:`twinkle.integrations._trl_profiling`); only an observed trainer's
contexts become spans.

On several ranks (``torchrun``, ``accelerate launch``: ``args.world_size > 1``) each
rank's callback takes part in one run (:mod:`twinkle.integrations._trl_ranks`): rank 0
writes it; every other rank records its own spans and memory and sends them, with its
samples, to rank 0 at each step's end (one gather over ``torch.distributed``, which
every rank reaches at the same step). The run's samples are every rank's; a rank that
died is named in the run's error. Pass every rank the same options: a ``run_id``,
or none on every rank (rank 0 names the run).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Mapping
from typing import Any

try:
    from transformers import Trainer, TrainerCallback
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "twinkle.integrations.trl needs transformers (and trl for GRPOTrainer): "
        "pip install 'twinkle[trl]'"
    ) from exc

from twinkle.checks import short_repr
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.integrations._trl_config import observer_config, positive
from twinkle.integrations._trl_run import ObservedRun
from twinkle.run import RunSession

__all__ = ["TwinkleCallback", "observer_config"]

#: RunSession's options a TwinkleCallback passes through.
_SESSION_OPTIONS = frozenset(
    {
        "clock",
        "wall_clock",
        "plugin_manager",
        "autoload",
        "builtins",
        "blocked",
        "plugins",
        "background_writer",
        "background_dispatch",
        "slow_call_s",
        "required_plugins",
        "backend_timeout_s",
        "resume",
    }
)


class TwinkleCallback(TrainerCallback):
    """Observe each ``train()`` call of the trainer holding it as one twinkle run.

    :param out_dir: where ``<run_id>/`` is written (``None``: no files).
    :param run_id: the run's name; default a fresh one per ``train()`` call. A run id
        whose directory already holds a run resumes it (iterations and optimizer steps
        continue from where it stopped) when that run did not finish ok (a job killed
        or pre-empted), or when ``train(resume_from_checkpoint=...)`` restores a step
        (also a run that finished ok: more ``max_steps``), or with ``resume=True`` (a
        session option, as ``RunSession``'s); a ``train()`` from step 0 on a run that
        finished ok is refused, naming these. Its configuration may change only
        ``total_steps`` (a larger ``max_steps``) and ``x_`` keys.
    :param config: the observers' business definitions; default :func:`observer_config`
        for the trainer (plus ``x_trl``: the trainer's class and world size).
    :param devices: the device denominator of the default configuration; default the
        processes training times the GPUs each drives (``args.world_size x
        max(1, args.n_gpu)``; a CPU process is one device). A vLLM server's GPUs
        (``vllm_mode="server"``) are not the trainer's: count them in ``devices``.
    :param peak_flops: the dense peak FLOP/s per device of the default configuration's
        MFU (``config.mfu``, from the model's configuration, dtype and device); default
        the datasheet's for the device torch names (none for a CPU or an unknown
        device: MFU abstains, saying why).
    :param memory: read this process's memory at each step's end.
    :param profiling: record TRL's profiling contexts as spans (without them the
        default ``reward`` phase is empty).
    :param session_options: passed to :class:`~twinkle.run.RunSession` (``autoload``,
        ``plugins``, ``background_dispatch``, ...).

    :attr:`session` is the run of the ``train()`` call in progress, or of the last one
    (rank 0's: None on the other ranks).
    """

    #: what observes one ``train()`` call (another library's trainers: a subclass)
    run_class: type[ObservedRun] = ObservedRun

    def __init__(
        self,
        *,
        out_dir: str | None = "runs",
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        devices: float | None = None,
        peak_flops: float | None = None,
        memory: bool = True,
        profiling: bool = True,
        **session_options: Any,
    ) -> None:
        unknown = sorted(set(session_options) - _SESSION_OPTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"TwinkleCallback got unknown option(s) {unknown}; it takes out_dir, run_id, "
                f"config, devices, peak_flops, memory, profiling and RunSession's "
                f"{sorted(_SESSION_OPTIONS)}"
            )
        if config is not None and not isinstance(config, Mapping):
            raise InvalidArgumentError(
                f"config must be a mapping of the observers' definitions or None (the "
                f"default, observer_config()), got {short_repr(config)}"
            )
        devices = positive(
            "devices", devices, "number of physical devices or None (the processes training)"
        )
        peak_flops = positive("peak_flops", peak_flops, "FLOP/s per device or None")
        for name, flag in (("memory", memory), ("profiling", profiling)):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False, got {flag!r}")
        self.out_dir = out_dir
        self.run_id = run_id
        self.config = None if config is None else dict(config)
        self.devices = devices
        self.peak_flops = peak_flops
        self.memory = memory
        self.profiling = profiling
        self._session_options = session_options
        self.session: RunSession | None = None
        self._observed: ObservedRun | None = None
        #: the trainer this callback observes, from the first that holds it (weak: a
        #: callback outliving its trainer keeps no model alive)
        self._trainer: weakref.ref[Any] | None = None

    # -- transformers' callback events --------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The end of Trainer.__init__: a callback already observing another trainer is
        # refused here, before the second trainer exists.
        trainer = _trainer_on_stack(self)
        if trainer is not None:
            self._claim(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _find_trainer(self)
        self._claim(trainer)  # (before anything of the trainer it observes is touched)
        if self._observed is not None:  # the last train() raised outside a training step
            self._observed.fail("train() began again before the last call ended")
        self._observed = self.run_class(self, trainer, state)
        self.session = self._observed.session

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._observed is not None:
            self._observed.step_begin(state.global_step)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._observed is not None:
            self._observed.optimizer_begin()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._observed is not None:
            self._observed.optimizer_end()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._observed is not None:
            self._observed.step_end(state.global_step)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._observed is not None and logs:
            self._observed.logged(logs, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._observed is not None:
            observed, self._observed = self._observed, None
            observed.finish(state)

    def _claim(self, trainer: Any) -> None:
        """Observe ``trainer`` from now on, unless this callback observes another one
        (its run, its wrapped methods and its step counts are that trainer's)."""
        current = None if self._trainer is None else self._trainer()
        if current is not None and current is not trainer:
            raise TwinkleError(
                f"this TwinkleCallback already observes another trainer ({type(current).__name__} "
                f"at {id(current):#x}), so it cannot observe this {type(trainer).__name__} too: "
                "a callback observes one trainer; pass each trainer a TwinkleCallback of its own "
                "(callbacks=[TwinkleCallback(...)])"
            )
        self._trainer = weakref.ref(trainer)

    def _failed(self, observed: ObservedRun) -> None:
        if self._observed is observed:
            self._observed = None


def _trainer_on_stack(callback: TwinkleCallback) -> Any:
    """The ``Trainer`` on the call stack whose callback handler holds ``callback``, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            handler = getattr(candidate, "callback_handler", None)
            if any(cb is callback for cb in getattr(handler, "callbacks", ())):
                return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _find_trainer(callback: TwinkleCallback) -> Any:
    """The ``Trainer`` on the call stack whose callback handler holds ``callback``."""
    trainer = _trainer_on_stack(callback)
    if trainer is not None:
        return trainer
    raise TwinkleError(
        "TwinkleCallback.on_train_begin was not called by a transformers Trainer that "
        "holds the callback: pass it in Trainer(callbacks=[...]) (or trainer.add_callback) "
        "and call trainer.train()"
    )
