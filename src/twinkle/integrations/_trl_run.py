"""One ``train()`` call a :class:`~twinkle.integrations.trl.TwinkleCallback` observes
(:class:`ObservedRun`): its run session, the trainer's methods it wraps, and the spans
and lengths of the step in progress."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from twinkle.errors import FinishedRunError, ResumeConfigError, TwinkleError, WorkerError
from twinkle.integrations._figures import logged_figures, scalars_name
from twinkle.integrations._trl_config import (
    SAVE_SPAN,
    fused_head,
    observer_config,
    resume_fix,
    trl_mfu,
)
from twinkle.integrations._trl_lengths import length_sums, plain_lengths, rollout_lengths
from twinkle.integrations._trl_profiling import OBSERVER_ATTRIBUTE, PROFILING, ProfilingPatch
from twinkle.integrations._trl_ranks import (
    DEAD_WAIT_S,
    GATHER_WAIT,
    RankBus,
    RankLink,
    check_alone,
    publish_merged,
    sigterm_held,
    whole_groups,
)
from twinkle.integrations._trl_resume import START, last_global_step, warn_redone
from twinkle.integrations._trl_wrapping import NO_EXC, ExcInfo, MethodWraps, StepSpans
from twinkle.perf import SpanContext, WorkerRecorder
from twinkle.run import RunSession, RunState

if TYPE_CHECKING:
    from twinkle.integrations.trl import TwinkleCallback

__all__ = ["ObservedRun"]

log = logging.getLogger("twinkle.integrations.trl")


class ObservedRun:
    """One ``train()`` call observed: its session, the trainer's wrapped methods, and the
    spans and lengths of the step in progress.

    What differs between the trainers built on TRL's is named here (a subclass changes
    it: :class:`twinkle.integrations._swift_run.SwiftRun`): the method that generates
    (:attr:`GENERATE`, wrapped by :meth:`_attach_generation`), the samples' lengths of a
    training batch (:meth:`_batch_sums`), the default configuration
    (:meth:`_default_config`), the scalars' name, the profiling wrapper, and whether
    the trainer counts its tokens (``num_input_tokens_seen``)."""

    #: the trainer's method generating the completions (a trainer without it trains only)
    GENERATE = "_generate"
    #: the scalars' name of the trainer's logged figures
    SCALARS = "trl"
    #: the library's profiling contexts that become spans
    PROFILING: ProfilingPatch = PROFILING
    #: whether ``state.num_input_tokens_seen`` counts the generated tokens (a terminal total)
    TOKENS_SEEN = True

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
        self.generates = callable(getattr(trainer, self.GENERATE, None))
        self.scored_labels = fused_head(trainer)  # (its train samples' prompts: unlabelled)
        # On several ranks rank 0 holds the run; the others report to it (_trl_ranks).
        self.rank = int(getattr(trainer.args, "process_index", 0))
        world = int(trainer.args.world_size)
        check_alone(world, owner.run_id)
        self.link = RankLink(self.rank, world) if world > 1 else None
        self.session: RunSession | None = None
        self.worker: WorkerRecorder | None = None
        try:
            lead = self._join(state)
        except BaseException:
            if self.link is not None:
                self.link.close()
            raise
        self.first_iteration = int(lead["first_iteration"])
        self.steps_before = int(lead["steps_before"])
        self.start_step = int(state.global_step)
        self._check_start()
        self.told_start = False  # (the segment's start record, at its first step)
        self.start_tokens = int(state.num_input_tokens_seen)
        self.iteration: int | None = None
        self.in_training_step = False
        self.step_spans = StepSpans()
        self.length_sums: list[Any] = []  # per micro-batch: its samples' (and prompts') lengths
        self.warned_lengths = False
        self.bad_keys: set[str] = set()  # logged keys left out (named once each)
        self._wraps = MethodWraps()
        self._profiling = False
        self._attach(owner)

    def _attach(self, owner: TwinkleCallback) -> None:
        """Wrap the trainer's methods (restored at the run's end, or here on a failure,
        which finishes the run)."""
        trainer = self.trainer
        try:
            self._wrap("training_step", self._training_step)
            self._wrap("_prepare_inputs", self._prepare_inputs)
            # Failing outside a step: loading the batches, logging, evaluating, saving.
            self._wrap("get_batch_samples", self._failing)
            self._wrap("_maybe_log_save_evaluate", self._failing)
            if callable(getattr(trainer, "_save_checkpoint", None)):  # (the checkpoint phase)
                self._wrap("_save_checkpoint", self._saving)
            if self.generates:
                self._attach_generation()
            setattr(trainer, OBSERVER_ATTRIBUTE, self)
            if owner.profiling and self.PROFILING.acquire():
                self._profiling = True
        except BaseException:
            self._restore()
            if self.session is not None:
                self.session.finish(status="error", error="attaching to the trainer failed")
            raise

    def _check_start(self) -> None:
        """Say so when this train() starts behind TRL's step at the run's last step."""
        if self.session is not None:
            last = last_global_step(self.session.pm, self.SCALARS, self.steps_before)
            if last > self.start_step:
                warn_redone(self.run_id, self.SCALARS, self.steps_before, last, self.start_step)

    def _join(self, state: Any) -> dict[str, Any]:
        """Begin this rank's part in the run: rank 0 starts the run's session (and tells
        the other ranks how it began, or why it could not); another rank records for it.
        Returns how the run began: its first iteration and its optimizer steps before."""
        if self.rank == 0:
            try:
                self.session = self._start(state)
            except BaseException as exc:
                if self.link is not None:  # (the other ranks wait to hear how it began)
                    self.link.join({"error": f"{type(exc).__name__}: {exc}"})
                raise
            resumed = self.session.resumed
            lead = {
                "first_iteration": 0 if resumed is None else resumed.next_iteration,
                "steps_before": 0 if resumed is None else resumed.optimizer_steps,
            }
            if self.link is not None:
                try:
                    self.link.join(lead)
                except BaseException as exc:
                    self.session.finish(status="error", error=f"{type(exc).__name__}: {exc}")
                    raise
            self.run_id = self.session.run_id
            self.bus: Any = self.session.bus if self.link is None else RankBus(self.session.bus)
            self.recorder = self.session.recorder
        else:
            assert self.link is not None
            lead = self.link.join({})[0]
            if "error" in lead:
                raise TwinkleError(f"rank 0 could not start twinkle's run: {lead['error']}")
            self.run_id = f"{self.owner.run_id or 'the run'} (rank {self.rank})"
            self.worker = WorkerRecorder(f"rank{self.rank}", rank=self.rank)
            self.bus = RankBus(None)
            self.recorder = self.worker.recorder
        return lead

    def _start(self, state: Any) -> RunSession:
        """The run's session (rank 0's), with the default configuration unless the
        callback was given one."""
        owner, trainer = self.owner, self.trainer
        name = type(trainer).__name__
        config = owner.config
        if config is None:
            devices = owner.devices
            if devices is None:  # processes x the GPUs each drives (DataParallel: > 1)
                devices = trainer.args.world_size * max(1, int(trainer.args.n_gpu))
            config = self._default_config(name, devices, max(0, int(state.max_steps)))
            mfu = trl_mfu(trainer, owner, generates=self.generates)
            if mfu is not None:
                config["mfu"] = mfu
        options = dict(owner._session_options)
        # A train() resumed from a checkpoint (its step restored before training begins)
        # asks to continue the run, also one that finished ok (more max_steps).
        options.setdefault("resume", True if state.global_step > 0 else None)
        if self.link is not None:  # (named as the other ranks are: rank1, ...)
            options.setdefault("source", "rank0")
        try:
            return RunSession(
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

    def _default_config(self, name: str, devices: float, total_steps: int) -> dict[str, Any]:
        """The run's configuration when the callback was given none (without MFU)."""
        config = observer_config(
            trainer=name, generates=self.generates, devices=devices, total_steps=total_steps
        )
        config["x_trl"] = {"trainer": name, "world_size": self.trainer.args.world_size}
        return config

    # -- the steps --------------------------------------------------------------------

    def step_begin(self, global_step: int) -> None:
        self.iteration = self.first_iteration + (int(global_step) - self.start_step)
        self.bus.iteration_started(self.iteration)
        if not self.told_start:  # (where a later segment's resume compares its start)
            self.told_start = True
            start = {"global_step": self.start_step, "steps_before": self.steps_before}
            self.bus.scalars(iteration=self.iteration, name=self.SCALARS + START, values=start)
        self.step_spans.enter(self.span("step"))

    def optimizer_begin(self) -> None:
        self.step_spans.enter(self.span("train.optimizer"))

    def optimizer_end(self) -> None:
        self.step_spans.leave("train.optimizer")

    def step_end(self, global_step: int) -> None:
        self.step_spans.close()
        iteration = self.iteration
        if iteration is None:
            return  # (on_step_end without on_step_begin: nothing of this run to close)
        with self.bus.own_work("trl.lengths"):
            lengths, prompts = plain_lengths(self.length_sums)
        self.length_sums = []
        if lengths:
            self.bus.samples(
                iteration=iteration, phase="train", lengths=lengths, prompt_lengths=prompts
            )
        samples = len(lengths) if self.link is None else self._exchange(iteration)
        step = self.steps_before + (int(global_step) - self.start_step)
        self.bus.optimizer_step(iteration=iteration, step=step, samples=samples)
        if self.owner.memory and self.session is not None:  # (named as its spans are)
            self.session.read_memory(iteration=iteration)

    def _exchange(self, iteration: int | None) -> int:
        """The step's samples of every rank and the other ranks' spans and memory, to
        rank 0's run (a collective of every rank); a failure finishes the run. Returns
        the ranks' training samples of ``iteration`` (rank 0's run; else 0)."""
        assert self.link is not None and isinstance(self.bus, RankBus)
        held = self.bus.take()
        unpublished: list[list[dict[str, Any]]] | None = [held]  # (a failure's to publish)
        try:
            report = None if self.worker is None else self.worker.report(memory=self.owner.memory)
            parts = self.link.exchange(held, report)
            if self.session is None or parts is None:
                return 0
            unpublished = [samples for samples, _ in parts]  # (every rank's, now rank 0's)
            for _, got in parts:
                if got is not None:
                    self.session.receive(got, iteration=iteration)
            samples, unpublished = unpublished, None
            return publish_merged(self.session.bus, samples, iteration)
        except BaseException as exc:
            if unpublished is not None:  # (rank 0's finish as failed publishes them)
                self.bus.held[:0] = [sample for part in unpublished for sample in part]
            self.fail(exc)
            raise

    def logged(self, logs: Mapping[str, Any], global_step: int) -> None:
        if self.iteration is None:
            return  # a log before the first step (e.g. eval_on_start): no iteration yet
        values = logged_figures(
            logs, left_out=self.bad_keys, run_id=self.run_id, library=self.SCALARS
        )
        if not values:
            return
        values.setdefault("global_step", int(global_step))
        name = scalars_name(logs, self.SCALARS)
        self.bus.scalars(iteration=self.iteration, name=name, values=values)

    def finish(self, state: Any) -> None:
        self.step_spans.close()
        try:
            if self.link is not None:  # (what the ranks did since the last step: evaluation)
                self._exchange(self.iteration)
        finally:
            self._restore()
        if self.session is None:
            return
        # This segment's own (a resumed train() restored TRL's counts as they stood)
        totals = {"optimizer_updates": int(state.global_step) - self.start_step}
        if self.generates and self.TOKENS_SEEN:
            totals["tokens_rollout"] = int(state.num_input_tokens_seen) - self.start_tokens
        self.session.finish(terminal_totals=totals)

    def fail(self, reason: BaseException | str) -> None:
        """Finish the run as failed (the training raised, or the run was abandoned);
        once: a failure that passes through several wrappers is one."""
        self.owner._failed(self)
        if self.session is None:  # (another rank: its error is its launcher's to report)
            self.step_spans.close()
            self._restore()
            return
        if self.session.state is not RunState.RUNNING:
            return
        exc_info: ExcInfo = NO_EXC
        if isinstance(reason, BaseException):
            exc_info = (type(reason), reason, reason.__traceback__)
            error = f"{type(reason).__qualname__}: {reason}"
        else:
            error = reason
        try:
            with sigterm_held(self.link is not None):
                if self.link is not None and not isinstance(reason, WorkerError):
                    # A collective of the training's own that failed (torch.distributed
                    # raises RuntimeErrors) is looked into a moment; any other error
                    # names only the ranks already gone.
                    wait = DEAD_WAIT_S if isinstance(reason, RuntimeError) else 0.0
                    dead = self.link.dead(wait)
                    error = f"{', '.join(dead)} died: {error}" if dead else error
                self.step_spans.close(exc_info)
                self._restore()
                try:
                    if isinstance(self.bus, RankBus):  # (the samples no exchange published)
                        publish_merged(self.session.bus, [self.bus.take()], None)
                finally:
                    self.session.finish(status="error", error=error)
        except Exception:  # the training's own error is the one to see
            log.exception("run %r: finishing after the failure failed", self.run_id)

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

    def _saving(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` (transformers' checkpoint save) inside a :data:`SAVE_SPAN` span."""

        def saving(*args: Any, **kwargs: Any) -> Any:
            with self.span(SAVE_SPAN):
                return original(*args, **kwargs)

        return saving

    def _training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        failing = self._failing(original)

        def training_step(*args: Any, **kwargs: Any) -> Any:
            self.in_training_step = True
            try:
                return failing(*args, **kwargs)
            finally:  # (after a failure: the run is finished, its spans closed)
                self.in_training_step = False
                self.step_spans.leave("train.step")

        return training_step

    def _prepare_inputs(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
            batch = original(*args, **kwargs)
            if self.in_training_step and "train.step" not in self.step_spans.open:
                with self.bus.own_work("trl.lengths"):
                    sums = self._batch_sums(batch)
                if sums is not None:
                    self.length_sums.append(sums)
                else:
                    self._unknown_lengths(batch)
                self.step_spans.enter(self.span("train.step"))
            return batch

        return prepare_inputs

    def _unknown_lengths(self, batch: Any) -> None:
        """Say once that the samples of batches like ``batch`` go unrecorded."""
        if not self.warned_lengths:
            self.warned_lengths = True
            log.warning(
                "run %r: cannot tell the samples' lengths of a %s batch (no prompt/"
                "completion masks, attention_mask or input_ids): its samples are not "
                "recorded",
                self.run_id,
                type(batch).__name__,
            )

    def _batch_sums(self, batch: Any) -> tuple[Any, Any] | None:
        """A prepared training batch's samples' (and prompts') tokens (:func:`length_sums`)."""
        return length_sums(batch, scored_labels=self.scored_labels)

    def _attach_generation(self) -> None:
        """Wrap what generates: TRL's ``_generate`` (span and rollout samples); on
        several ranks, the accelerator's ``gather`` too (:data:`GATHER_WAIT`)."""
        self._wrap(self.GENERATE, self._generate)
        if self.link is not None:
            self._wraps.wrap(self.trainer.accelerator, "gather", self._gathering)

    def _gathering(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gather(*args: Any, **kwargs: Any) -> Any:
            with self.span(GATHER_WAIT):
                return original(*args, **kwargs)

        return gather

    def _generation_span(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` inside a ``generate`` span (``eval.generate`` while evaluating)."""

        def generation(*args: Any, **kwargs: Any) -> Any:
            training = bool(self.trainer.model.training)
            attrs: dict[str, Any] = {} if self.iteration is None else {"iteration": self.iteration}
            with self.recorder.span("generate" if training else "eval.generate", **attrs):
                return original(*args, **kwargs)

        return generation

    def _generate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        spanned = self._generation_span(original)

        def generate(*args: Any, **kwargs: Any) -> Any:
            iteration = self.iteration
            training = bool(self.trainer.model.training)  # (generating may set it: TRL's does)
            out = spanned(*args, **kwargs)
            if iteration is not None:
                with self.bus.own_work("trl.lengths"):
                    lengths, prompts = rollout_lengths(type(self.trainer).__name__, out)
                self.generated(iteration, lengths, prompts, training=training)
            return out

        return generate

    def generated(
        self, iteration: int, lengths: list[int], prompts: list[int], *, training: bool
    ) -> None:
        """Completions generated in ``iteration``: ``rollout`` samples while training (in
        whole groups of the trainer's ``num_generations``), else ``eval`` samples."""
        per_group = getattr(self.trainer, "num_generations", 0) if training else 0
        # (on several ranks a group may spread over them: counted once merged)
        grouping = (
            {"per_group": per_group}
            if self.link is not None
            else {"groups": whole_groups(len(lengths), per_group)}
        )
        self.bus.samples(
            iteration=iteration,
            phase="rollout" if training else "eval",
            lengths=lengths,
            prompt_lengths=prompts,
            **grouping,
        )

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
        self._wraps.wrap(self.trainer, name, make)

    def _restore(self) -> None:
        trainer = self.trainer
        self._wraps.restore()
        if trainer.__dict__.get(OBSERVER_ATTRIBUTE) is self:
            del trainer.__dict__[OBSERVER_ATTRIBUTE]
        if self._profiling:
            self._profiling = False
            self.PROFILING.release()
        if self.link is not None:
            self.link.close()
