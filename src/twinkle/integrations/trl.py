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
  trains on (prompt + completion mask tokens; a plain ``Trainer``: attention-mask
  tokens), read at ``on_step_end``. A generation batch serving several steps
  (``steps_per_generation`` above the gradient accumulation) counts its rollout samples
  in the step that generated it.
* **Optimizer steps** at ``on_step_end``, a **memory reading** of this process per step,
  and TRL's logged figures as **scalars** named ``trl`` (``trl.eval`` for evaluation
  logs, ``trl.train`` for the summary logged after the last step), each with
  transformers' ``global_step`` (a run's own steps count from 1, also after
  ``resume_from_checkpoint``).
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
contexts become spans. One process only: a ``world_size > 1`` run is refused.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

try:
    from transformers import Trainer, TrainerCallback
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "twinkle.integrations.trl needs transformers (and trl for GRPOTrainer): "
        "pip install 'twinkle[trl]'"
    ) from exc

from twinkle.checks import key_problem, plain_number, short_repr
from twinkle.errors import (
    FinishedRunError,
    InvalidArgumentError,
    ResumeConfigError,
    TwinkleError,
)
from twinkle.integrations._trl_config import observer_config, positive, resume_fix, trl_mfu
from twinkle.integrations._trl_lengths import length_sums, plain_lengths, rollout_lengths
from twinkle.integrations._trl_profiling import OBSERVER_ATTRIBUTE, PROFILING
from twinkle.perf import SpanContext
from twinkle.run import RunSession, RunState

__all__ = ["TwinkleCallback", "observer_config"]

log = logging.getLogger("twinkle.integrations.trl")

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
_ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
_NO_EXC: _ExcInfo = (None, None, None)


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

    :attr:`session` is the run of the ``train()`` call in progress, or of the last one.
    """

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
        self._observed: _ObservedRun | None = None
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
        if args.world_size > 1:
            raise TwinkleError(
                f"TwinkleCallback observes one training process; this run has "
                f"world_size={args.world_size}: train on one process, or remove the callback"
            )
        trainer = _find_trainer(self)
        self._claim(trainer)  # (before anything of the trainer it observes is touched)
        if self._observed is not None:  # the last train() raised outside a training step
            self._observed.fail("train() began again before the last call ended")
        self._observed = _ObservedRun(self, trainer, state)
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

    def _failed(self, observed: _ObservedRun) -> None:
        if self._observed is observed:
            self._observed = None


class _ObservedRun:
    """One ``train()`` call observed: its session, the trainer's wrapped methods, and the
    spans and lengths of the step in progress."""

    def __init__(self, owner: TwinkleCallback, trainer: Any, state: Any) -> None:
        name = type(trainer).__name__
        other = vars(trainer).get(OBSERVER_ATTRIBUTE)
        if other is not None:
            if any(cb is other.owner for cb in trainer.callback_handler.callbacks):
                error = (
                    f"this {name} is already observed by another TwinkleCallback: pass "
                    "one TwinkleCallback per trainer"
                )
                other.fail(error)  # (its run ends here: training does not go on)
                raise TwinkleError(error)
            # its callback was removed after a train() that raised outside a step
            other.fail("train() began again without the callback observing this run")
        self.owner = owner
        self.trainer = trainer
        self.generates = callable(getattr(trainer, "_generate", None))
        config = owner.config
        if config is None:
            devices = owner.devices
            if devices is None:  # processes x the GPUs each drives (DataParallel: > 1)
                devices = trainer.args.world_size * max(1, int(trainer.args.n_gpu))
            config = observer_config(
                trainer=name,
                generates=self.generates,
                devices=devices,
                total_steps=max(0, int(state.max_steps)),
            )
            config["x_trl"] = {"trainer": name, "world_size": trainer.args.world_size}
            mfu = trl_mfu(trainer, generates=self.generates, peak_flops=owner.peak_flops)
            if mfu is not None:
                config["mfu"] = mfu
        options = dict(owner._session_options)
        # A train() resumed from a checkpoint (its step restored before training begins)
        # asks to continue the run, also one that finished ok (more max_steps).
        options.setdefault("resume", True if state.global_step > 0 else None)
        try:
            self.session = RunSession(
                out_dir=owner.out_dir, run_id=owner.run_id, config=config, **options
            ).start()
        except ResumeConfigError as exc:
            raise exc.with_fix(resume_fix(owner, exc)) from exc
        except FinishedRunError as exc:
            raise exc.with_fix(
                "train(resume_from_checkpoint=...) continues it (or pass "
                "TwinkleCallback(resume=True)); pass another run_id (TwinkleCallback(run_id="
                f"...) other than {exc.run_id!r}, or another out_dir) to observe this "
                "training as a new run"
            ) from exc
        self.bus = self.session.bus
        self.recorder = self.session.recorder
        resumed = self.session.resumed
        self.resumed = resumed is not None
        self.first_iteration = 0 if resumed is None else resumed.next_iteration
        self.steps_before = 0 if resumed is None else resumed.optimizer_steps
        self.start_step = int(state.global_step)
        self.start_tokens = int(state.num_input_tokens_seen)
        self.iteration: int | None = None
        self.in_training_step = False
        self.open: dict[str, SpanContext] = {}  # the spans of the step in progress, by name
        self.length_sums: list[Any] = []  # per micro-batch: its samples' lengths
        self.warned_lengths = False
        self.bad_keys: set[str] = set()  # logged keys left out (named once each)
        self._saved: dict[str, Any] = {}
        self._profiling = False
        try:
            self._wrap("training_step", self._training_step)
            self._wrap("_prepare_inputs", self._prepare_inputs)
            # Failing outside a step: loading the batches, logging, evaluating, saving.
            self._wrap("get_batch_samples", self._failing)
            self._wrap("_maybe_log_save_evaluate", self._failing)
            if self.generates:
                self._wrap("_generate", self._generate)
            setattr(trainer, OBSERVER_ATTRIBUTE, self)
            if owner.profiling and PROFILING.acquire():
                self._profiling = True
        except BaseException:
            self._restore()
            self.session.finish(status="error", error="attaching to the trainer failed")
            raise

    # -- the steps --------------------------------------------------------------------

    def step_begin(self, global_step: int) -> None:
        self.iteration = self.first_iteration + (int(global_step) - self.start_step)
        self.bus.iteration_started(self.iteration)
        self._enter("step")

    def optimizer_begin(self) -> None:
        self._enter("train.optimizer")

    def optimizer_end(self) -> None:
        self._leave("train.optimizer")

    def step_end(self, global_step: int) -> None:
        self._close_spans(_NO_EXC)
        iteration = self.iteration
        if iteration is None:
            return  # (on_step_end without on_step_begin: nothing of this run to close)
        with self.bus.own_work("trl.lengths"):
            lengths = plain_lengths(self.length_sums)
        self.length_sums = []
        if lengths:
            self.bus.samples(iteration=iteration, phase="train", lengths=lengths)
        step = self.steps_before + (int(global_step) - self.start_step)
        self.bus.optimizer_step(iteration=iteration, step=step, samples=len(lengths))
        if self.owner.memory:
            self.session.read_memory(iteration=iteration)

    def logged(self, logs: Mapping[str, Any], global_step: int) -> None:
        if self.iteration is None:
            return  # a log before the first step (e.g. eval_on_start): no iteration yet
        values: dict[str, int | float] = {}
        for key, raw in logs.items():
            value = plain_number(raw)
            if value is None:  # TRL logs None for a figure with no valid value
                value = math.nan
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[str(key)] = value
        self._leave_out_bad_keys(values)
        if not values:
            return
        values.setdefault("global_step", int(global_step))
        if any(str(key).startswith("eval_") for key in logs):
            name = "trl.eval"
        elif "train_runtime" in logs:
            name = "trl.train"
        else:
            name = "trl"
        self.bus.scalars(iteration=self.iteration, name=name, values=values)

    def _leave_out_bad_keys(self, values: dict[str, int | float]) -> None:
        """Drop the figures whose key cannot name them (the bus would refuse the whole
        log, raising into the trainer's logging); each such key is named once."""
        for key in [k for k in values if key_problem(k) is not None]:
            del values[key]
            if key not in self.bad_keys:
                self.bad_keys.add(key)
                log.warning(
                    "run %r: TRL logged %r, whose key %s; that figure is left out",
                    self.session.run_id,
                    key,
                    key_problem(key),
                )

    def finish(self, state: Any) -> None:
        self._close_spans(_NO_EXC)
        self._restore()
        totals: dict[str, int] | None = None
        if not self.resumed:  # a resumed run's totals cover every segment: TRL's do not
            totals = {"optimizer_updates": int(state.global_step) - self.start_step}
            if self.generates:
                totals["tokens_rollout"] = int(state.num_input_tokens_seen) - self.start_tokens
        self.session.finish(terminal_totals=totals)

    def fail(self, reason: BaseException | str) -> None:
        """Finish the run as failed (the training raised, or the run was abandoned);
        once: a failure that passes through several wrappers is one."""
        self.owner._failed(self)
        if self.session.state is not RunState.RUNNING:
            return
        exc_info: _ExcInfo = _NO_EXC
        if isinstance(reason, BaseException):
            exc_info = (type(reason), reason, reason.__traceback__)
            error = f"{type(reason).__qualname__}: {reason}"
        else:
            error = reason
        try:
            self._close_spans(exc_info)
            self._restore()
            self.session.finish(status="error", error=error)
        except Exception:  # the training's own error is the one to see
            log.exception("run %r: finishing after the failure failed", self.session.run_id)

    # -- the trainer's wrapped methods ---------------------------------------------------

    def _failing(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original``, finishing the run as failed when it raises."""

        def failing(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                self.fail(exc)
                raise

        return failing

    def _training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        failing = self._failing(original)

        def training_step(*args: Any, **kwargs: Any) -> Any:
            self.in_training_step = True
            try:
                return failing(*args, **kwargs)
            finally:  # (after a failure: the run is finished, its spans closed)
                self.in_training_step = False
                self._leave("train.step")

        return training_step

    def _prepare_inputs(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
            batch = original(*args, **kwargs)
            if self.in_training_step and "train.step" not in self.open:
                with self.bus.own_work("trl.lengths"):
                    sums = length_sums(batch)
                if sums is not None:
                    self.length_sums.append(sums)
                elif not self.warned_lengths:
                    self.warned_lengths = True
                    log.warning(
                        "run %r: cannot tell the samples' lengths of a %s batch (no "
                        "prompt/completion masks, attention_mask or input_ids): no train "
                        "samples are recorded",
                        self.session.run_id,
                        type(batch).__name__,
                    )
                self._enter("train.step")
            return batch

        return prepare_inputs

    def _generate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            training = bool(self.trainer.model.training)
            iteration = self.iteration
            attrs: dict[str, Any] = {} if iteration is None else {"iteration": iteration}
            with self.recorder.span("generate" if training else "eval.generate", **attrs):
                out = original(*args, **kwargs)
            if iteration is not None:
                with self.bus.own_work("trl.lengths"):
                    lengths, prompts = rollout_lengths(type(self.trainer).__name__, out)
                per_group = getattr(self.trainer, "num_generations", 0) if training else 0
                groups = len(lengths) // per_group if per_group else 0
                self.bus.samples(
                    iteration=iteration,
                    phase="rollout" if training else "eval",
                    lengths=lengths,
                    groups=groups if groups * per_group == len(lengths) else 0,
                    prompt_lengths=prompts,
                )
            return out

        return generate

    def span(self, name: str) -> SpanContext:
        """A span of the step in progress (with its iteration once one began)."""
        attrs: dict[str, Any] = {} if self.iteration is None else {"iteration": self.iteration}
        return self.recorder.span(name, **attrs)

    def profiling_span(self, name: str) -> SpanContext:
        """The span of TRL's profiling context ``name``; ``eval.<name>`` while the model
        evaluates (so evaluation's reward scoring stays out of the ``reward`` phase)."""
        return self.span(name if self.trainer.model.training else f"eval.{name}")

    # -- attaching and detaching ----------------------------------------------------------

    def _wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        trainer = self.trainer
        original = getattr(trainer, name)
        self._saved[name] = trainer.__dict__.get(name, _MISSING)
        setattr(trainer, name, functools.wraps(original)(make(original)))

    def _restore(self) -> None:
        trainer = self.trainer
        for name, saved in self._saved.items():
            if saved is _MISSING:
                trainer.__dict__.pop(name, None)
            else:
                setattr(trainer, name, saved)
        self._saved.clear()
        if trainer.__dict__.get(OBSERVER_ATTRIBUTE) is self:
            del trainer.__dict__[OBSERVER_ATTRIBUTE]
        if self._profiling:
            self._profiling = False
            PROFILING.release()

    def _enter(self, name: str) -> None:
        span = self.span(name)
        span.__enter__()
        self.open[name] = span

    def _leave(self, name: str, exc_info: _ExcInfo = _NO_EXC) -> None:
        span = self.open.pop(name, None)
        if span is not None:
            span.__exit__(*exc_info)

    def _close_spans(self, exc_info: _ExcInfo) -> None:
        for name in ("train.step", "train.optimizer", "step"):  # innermost first
            self._leave(name, exc_info)


_MISSING = object()


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
