"""Whether a verl job continues a named twinkle run, and what it says when it does
(:mod:`twinkle.integrations.verl`): a run that did not finish resumes; one that finished
``ok`` is continued when verl's ``fit()`` loads a checkpoint, and refused, naming the fix,
when it trains from scratch; ``TWINKLE_RESUME`` decides instead. A job that continues a
run from a step behind the run's last (an older checkpoint, or none) is told that the
steps after it are done, and counted, again."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from twinkle.errors import ConfigError, FinishedRunError
from twinkle.integrations._figures import last_logged
from twinkle.run import RunSession

__all__ = ["RESUME_ENV", "RUN_ID_ENV", "redone", "resume_choice", "setting", "started"]

log = logging.getLogger("twinkle.integrations.verl")

#: The environment's choice of the run's name (default a fresh one).
RUN_ID_ENV = "TWINKLE_RUN_ID"
#: The environment's choice of continuing a named run that finished (``1``) or never
#: continuing one (``0``); unset: as verl's ``trainer.resume_mode`` says.
RESUME_ENV = "TWINKLE_RESUME"


def resume_choice(config: Mapping[str, Any]) -> bool | None:
    """Whether a named run that finished ``ok`` is continued: ``TWINKLE_RESUME``'s say,
    else continued when verl's ``fit()`` loads a checkpoint (:func:`_verl_resumes`), the
    session's default when it trains from scratch (a run that finished is refused)."""
    said = os.environ.get(RESUME_ENV, "").strip().lower()
    if said:
        if said not in _SAYS:
            raise ConfigError(
                f"{RESUME_ENV}={os.environ[RESUME_ENV]!r}: give 1 (continue a named run that "
                "finished) or 0 (never continue one), or leave it unset (as verl's "
                "trainer.resume_mode says)"
            )
        return _SAYS[said]
    return True if _verl_resumes(config) else None


def _verl_resumes(config: Mapping[str, Any]) -> bool:
    """Whether verl's ``fit()`` will load a checkpoint, by its ``_load_checkpoint``'s
    rule: ``trainer.resume_mode`` ``resume_path``, or ``auto`` with a latest checkpoint
    in ``trainer.default_local_dir`` (relative to the working directory; verl's
    ``find_latest_ckpt_path``). With ``auto`` and none, verl trains from scratch."""
    mode = setting(config, "trainer", "resume_mode")
    if mode == "resume_path":
        return True
    folder = setting(config, "trainer", "default_local_dir")
    if mode != "auto" or not isinstance(folder, str):
        return False
    try:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
    except ImportError:  # (not in a verl process: nothing it would load)
        return False
    return find_latest_ckpt_path(os.path.abspath(folder)) is not None


_SAYS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def started(session: RunSession) -> RunSession:
    """``session`` started; a run that finished ``ok``, refused, says the fix in verl's
    terms."""
    try:
        return session.start()
    except FinishedRunError as exc:
        raise exc.with_fix(
            f"verl trains from scratch (no checkpoint to resume from): give another "
            f"{RUN_ID_ENV} for a new run, or set {RESUME_ENV}=1 in the trainer's environment "
            "to continue it all the same"
        ) from None


def redone(session: RunSession, start_step: Any) -> None:
    """Say so when this ``fit()`` starts behind the last step the run logged: verl
    loaded an older checkpoint than the run reached (a crash between saves), or none
    (a job relaunched from scratch on a run that did not finish). The steps after its
    start are done again, and the run counts every update it sees. (Compared with
    verl's own ``global_step``, which its scalars hold every step: after steps were
    redone once, the run's count of them stays ahead of verl's.)"""
    if session.resumed is None or not isinstance(start_step, int):
        return
    last = last_logged(session.pm, "verl", "global_step")
    if last is not None and last > start_step:
        log.warning(
            "twinkle: run %r logged verl's global step %d, and this fit() starts at global "
            "step %d (its checkpoint's, or 0 without one): the steps after it, to %d, are "
            "done again, and the run counts every step it sees (each 'verl' scalar record "
            "holds verl's global_step). Resuming from the newest checkpoint "
            "(trainer.save_freq) redoes the least; a training from scratch is a new run: "
            "give it another %s",
            session.run_id,
            last,
            start_step,
            last,
            RUN_ID_ENV,
        )


def setting(config: Mapping[str, Any], *keys: str) -> Any:
    """verl's configuration at ``keys`` (``trainer``, ``resume_mode``), or None."""
    for key in keys:
        if not isinstance(config, Mapping):
            return None
        config = config.get(key)  # type: ignore[assignment]
    return config
