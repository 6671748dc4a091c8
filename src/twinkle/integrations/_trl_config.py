"""The default business definitions of a :class:`~twinkle.integrations.trl.TwinkleCallback`
run (:func:`observer_config`), its ``config.mfu`` from the trainer's model, dtype and
device (:func:`trl_mfu`), and what to do when a resume's configuration is refused
(:func:`resume_fix`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinkle.checks import plain_number, short_repr
from twinkle.errors import InvalidArgumentError, ResumeConfigError
from twinkle.metric import model_shape
from twinkle.observers import mfu_config
from twinkle.run import started_config

__all__ = ["fused_head", "observer_config", "positive", "resume_fix", "trl_mfu"]

log = logging.getLogger("twinkle.integrations.trl")


#: the span of transformers' ``_save_checkpoint`` (a checkpoint's save between steps)
SAVE_SPAN = "save_checkpoint"


def observer_config(
    *,
    trainer: str,
    generates: bool,
    devices: float,
    total_steps: int,
    reward: str | None = None,
    publish: str | None = None,
) -> dict[str, Any]:
    """The business definitions of a :class:`TwinkleCallback` run by default.

    :param trainer: the trainer's class name (TRL prefixes its profiling names with it).
    :param generates: whether the trainer generates its samples (TRL's GRPO and RLOO):
        then phases ``rollout`` (``generate``), ``reward``
        (``<trainer>._calculate_rewards``) and ``publish`` (``<trainer>.sync_weights``:
        TRL sending the weights to its vLLM engines, with ``use_vllm``) exist, and the
        ``rollout`` samples — prompt + completion tokens, TRL's ``num_tokens`` — are the
        run window's effective tokens; otherwise the ``train`` samples are.
    :param devices: the physical devices training uses, every phase's and the window's
        denominator.
    :param total_steps: the planned optimizer steps.
    :param reward: the span of the ``reward`` phase; default TRL's
        ``<trainer>._calculate_rewards``.
    :param publish: the span of the ``publish`` phase; default TRL's
        ``<trainer>.sync_weights``.

    Phases ``train`` (``train.step``, ``train.optimizer``), ``step`` (``step``: the
    whole optimizer step, so idle time is what happens between steps: logging,
    evaluation) and ``checkpoint`` (:data:`SAVE_SPAN`: transformers saving a checkpoint
    between steps, as verl's phase of that name) always exist.
    """
    phases: dict[str, list[str]] = {}
    throughput: dict[str, dict[str, Any]] = {}
    config: dict[str, Any] = {"phases": phases, "throughput": throughput}
    if generates:
        phases["rollout"] = ["generate"]
        phases["reward"] = [reward or f"{trainer}._calculate_rewards"]
        # with use_vllm: the weights sent to vLLM
        phases["publish"] = [publish or f"{trainer}.sync_weights"]
        throughput["rollout"] = {"samples": "rollout", "devices": devices}
        config["streaming"] = {"generation": "rollout", "training": "train", "publish": "publish"}
    phases["train"] = ["train.step", "train.optimizer"]
    phases["step"] = ["step"]
    phases["checkpoint"] = [SAVE_SPAN]
    throughput["train"] = {"samples": "train", "devices": devices}
    config["window"] = {"samples": "rollout" if generates else "train", "devices": devices}
    config["total_steps"] = total_steps
    return config


def fused_head(trainer: Any) -> bool:
    """Whether ``trainer`` is one of TRL's (or subclasses one): their fused LM head
    (``fused_lm_head=True``: GRPO, RLOO, SFT, DPO, KTO) scores only the positions with a
    label on a GPU (elsewhere every position: the figure is then lower than the work),
    so training's LM head is counted on the completion's tokens."""
    return any(c.__module__.startswith("trl.") for c in type(trainer).__mro__)


def trl_mfu(trainer: Any, owner: Any, *, generates: bool) -> dict[str, Any] | None:
    """``config.mfu`` for ``trainer``: its model's shape (``model.config``), the dtype
    its matrix products run in (``bf16``/``fp16`` mixed precision, else the parameters',
    tf32 when allowed), its device as torch names it, activation recomputation
    (``gradient_checkpointing``, of the arguments or the model: HFU) and the phases
    ``train`` and (generating) ``rollout``; a TRL trainer's LM head runs on the
    completion tokens only (:func:`fused_head`). None, logged, when the model has no
    FLOPs formula: the run goes on without MFU. ``owner`` (the :class:`TwinkleCallback`)
    gives the ``peak_flops`` and where the run's log is: a run that resumes keeps the
    section it began with, or none, since its MFU may not change on resume: what this
    process detects otherwise is logged. A ``peak_flops`` given that the run did not
    begin with is the caller's to change: the resume is refused, saying why."""
    peak_flops = owner.peak_flops
    detected = _detect_mfu(trainer, generates=generates, peak_flops=peak_flops)
    began = None
    if owner.out_dir is not None and owner.run_id is not None:
        began = started_config(Path(owner.out_dir) / owner.run_id)
    if began is None:
        return detected
    section = began.get("mfu")
    kept: dict[str, Any] = section if isinstance(section, dict) else {}
    if peak_flops is not None and kept.get("peak_flops") != peak_flops:
        return detected  # (the session refuses it, naming what the run began with)
    if detected is not None:
        before, now = {**_UNSAID, **kept}, {**_UNSAID, **detected}
        changed = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
        if changed:
            log.warning(
                "twinkle: the resumed run keeps the MFU settings it began with (%s); this "
                "process detects %s: start a new run (another run_id) to have them",
                ", ".join(f"{k}={short_repr(before.get(k))}" for k in changed)
                if kept
                else "no MFU",
                ", ".join(f"{k}={short_repr(now.get(k))}" for k in changed),
            )
    return kept or None


#: what mfu_config leaves out of a section when it is so
_UNSAID = {"recompute": False, "logits": "all"}


def _detect_mfu(
    trainer: Any, *, generates: bool, peak_flops: float | None
) -> dict[str, Any] | None:
    import torch

    model = getattr(trainer, "model", None)
    try:
        shape = model_shape(getattr(model, "config", None))
    except InvalidArgumentError as exc:
        log.warning("twinkle: this run has no MFU: %s", exc)
        return None
    args = trainer.args
    dtype = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    if dtype is None:
        first = next(iter(model.parameters()), None) if model is not None else None
        dtype = str(first.dtype if first is not None else torch.get_default_dtype())
        if dtype == "torch.float32" and torch.backends.cuda.matmul.allow_tf32:
            dtype = "tf32"
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return mfu_config(
        shape,
        dtype=dtype,
        device=name,
        peak_flops=peak_flops,
        recompute=bool(getattr(args, "gradient_checkpointing", False)) or _recomputes(model),
        logits="completion" if generates or fused_head(trainer) else "all",
        training="train",
        generation="rollout" if generates else None,
    )


def _recomputes(model: Any) -> bool:
    """Whether ``model`` recomputes its activations in the backward pass: transformers'
    ``is_gradient_checkpointing``. ms-swift turns it on in the model, then sets
    ``args.gradient_checkpointing`` to False so that transformers does not again."""
    return getattr(model, "is_gradient_checkpointing", False) is True


def resume_fix(owner: Any, exc: ResumeConfigError) -> str:
    """What the user of :class:`~twinkle.integrations.trl.TwinkleCallback` ``owner`` does
    about a run that cannot resume with the configuration this ``train()`` call gave it."""
    new_run = (
        f"or pass another run_id (TwinkleCallback(run_id=...) other than {exc.run_id!r}, "
        "or another out_dir) to observe this training as a new run"
    )
    if owner.config is not None:
        return (
            "pass TwinkleCallback(config=...) the configuration the run was started with "
            f"(changing only total_steps or x_ keys), {new_run}"
        )
    window = exc.logged.get("window")
    devices = window.get("devices") if isinstance(window, Mapping) else None
    if devices is not None and set(exc.keys) <= {"throughput", "window"}:
        if owner.devices is None:  # (read from the ranks: this training runs on others)
            return (
                f"the run counted {devices!r} device(s) and this training runs on another "
                f"number (its ranks): its throughput per device would mix the two, so "
                f"observe it as a new run: pass another run_id (TwinkleCallback(run_id=...) "
                f"other than {exc.run_id!r}, or another out_dir)"
            )
        return (
            f"the run counted {devices!r} device(s): pass TwinkleCallback(devices={devices!r}) "
            f"as it was started with, {new_run}"
        )
    if set(exc.keys) == {"mfu"}:
        before = exc.logged.get("mfu")
        began = (
            "without MFU (an older twinkle)"
            if before is None
            else f"with MFU for {before.get('device')!r} in {before.get('dtype')!r} "
            f"(peak {before.get('peak_flops')!r})"
        )
        return (
            f"the run began {began}, and its MFU may not change on resume (its records "
            "would mix two peaks): resume on the same device and dtype (and peak_flops), "
            "or pass TwinkleCallback(config=...) the run's configuration (the config of "
            f"its run_started line), {new_run}"
        )
    log = "its events.jsonl"
    if owner.out_dir is not None:
        log = f"{owner.out_dir}/{exc.run_id}/events.jsonl"
    if _older_phases(exc):
        return (
            "the run began with an older twinkle's default phases (this one adds "
            f"'checkpoint': {SAVE_SPAN}): pass TwinkleCallback(config=...) the run's "
            f"configuration (the config of the run_started line of {log}), {new_run}"
        )
    trl = exc.logged.get("x_trl")
    trainer = trl.get("trainer") if isinstance(trl, Mapping) else None
    started = "the trainer the run was started with"
    if trainer is not None:
        started = f"the trainer the run was started with ({trainer})"
    return (
        "TwinkleCallback's default configuration follows the trainer's class and the "
        f"devices: resume with {started} and the same devices, or pass "
        "TwinkleCallback(config=...) the run's configuration (the config of the "
        f"run_started line of {log}), {new_run}"
    )


def _older_phases(exc: ResumeConfigError) -> bool:
    """Whether the run differs in its phases alone, without the ``checkpoint`` phase
    the default configuration has had since twinkle added it."""
    phases = exc.logged.get("phases")
    alone = set(exc.keys) == {"phases"}
    return alone and isinstance(phases, Mapping) and "checkpoint" not in phases


def positive(name: str, value: Any, what: str) -> float | None:
    """``value`` (a number, numpy's or torch's too) when it is positive and finite, or
    None; else :class:`InvalidArgumentError` naming ``name``."""
    value = plain_number(value)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
    ):
        raise InvalidArgumentError(
            f"{name} must be a positive, finite {what}, got {short_repr(value)}"
        )
    return value
