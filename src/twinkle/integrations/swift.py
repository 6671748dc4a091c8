"""Observe ms-swift's training — ``swift rlhf --rlhf_type grpo`` above all — as one
twinkle run per ``train()`` call.

From the command line, the way swift takes callbacks (``--callbacks``, registered by an
``--external_plugins`` file; ``twinkle swift-plugin`` prints twinkle's)::

    swift rlhf --rlhf_type grpo ... \\
        --external_plugins "$(twinkle swift-plugin)" --callbacks twinkle

In Python, before swift builds its trainer::

    from twinkle.integrations.swift import register

    register()  # swift's callbacks_map["twinkle"]; options: register(run_id=..., ...)
    rlhf_main(RLHFArguments(rlhf_type="grpo", ..., callbacks=["twinkle"]))

The run is written to ``<output_dir>/twinkle/<run_id>/``, beside swift's own
``logging.jsonl`` (``TWINKLE_OUT_DIR`` and ``TWINKLE_RUN_ID`` in the environment, or
``register(out_dir=..., run_id=...)``, choose another place or name; a ``run_id`` whose
run did not finish resumes it, as :class:`~twinkle.integrations.trl.TwinkleCallback`'s
does).

It is :class:`~twinkle.integrations.trl.TwinkleCallback` (steps, micro-batches,
optimizer steps, memory, several ranks under ``torchrun``: ``NPROC_PER_NODE``) with
what swift does its own way (:mod:`twinkle.integrations._swift_run`): the ``generate``
span around swift's ``_generate_completions``, ``rollout`` and ``train`` samples with
their token lengths from swift's encoded micro-batches, swift's ``profiling_context``
timings as spans (``GRPOTrainer._compute_rewards_per_func`` is the ``reward`` phase,
``GRPOTrainer._move_model_to_vllm`` the ``publish`` phase), and the figures swift logs
(those of its ``logging.jsonl``) as scalars named ``swift``. It leaves TRL's own
trainers in the same process as they were (a ``TwinkleCallback`` observes those).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.integrations import swift_plugin_file
from twinkle.integrations._swift_run import SwiftRun
from twinkle.integrations.trl import TwinkleCallback

__all__ = ["OUT_DIR_ENV", "RUN_ID_ENV", "TwinkleSwiftCallback", "register", "swift_plugin_file"]

log = logging.getLogger("twinkle.integrations.swift")

#: The environment's choice of where the run is written (default ``<output_dir>/twinkle``).
OUT_DIR_ENV = "TWINKLE_OUT_DIR"
#: The environment's choice of the run's name (default a fresh one).
RUN_ID_ENV = "TWINKLE_RUN_ID"


class TwinkleSwiftCallback(TwinkleCallback):
    """:class:`~twinkle.integrations.trl.TwinkleCallback` for ms-swift's trainers.

    swift makes its callbacks as ``callbacks_map[name](args, trainer)``: ``args`` (the
    trainer's arguments) gives the default ``out_dir``, ``<args.output_dir>/twinkle``.
    Options are :class:`TwinkleCallback`'s; ``out_dir`` and ``run_id`` default to the
    environment's :data:`OUT_DIR_ENV` and :data:`RUN_ID_ENV` when set.

    swift gives every launch a new versioned ``output_dir``, also one that resumes from a
    checkpoint (``args.resume_from_checkpoint``): such a launch continues its twinkle run
    only when given the first launch's ``out_dir`` and ``run_id``; without them it says
    so (a warning) and observes the training as a new run.
    """

    run_class = SwiftRun

    def __init__(self, args: Any = None, trainer: Any = None, **options: Any) -> None:
        out_dir = os.environ.get(OUT_DIR_ENV)
        if out_dir:
            options.setdefault("out_dir", out_dir)
        elif args is not None and "out_dir" not in options:
            options["out_dir"] = os.path.join(str(args.output_dir), "twinkle")
            _warn_if_resumed(args, "out_dir", OUT_DIR_ENV)
        run_id = os.environ.get(RUN_ID_ENV)
        if run_id:
            options.setdefault("run_id", run_id)
        elif args is not None and options.get("run_id") is None:
            _warn_if_resumed(args, "run_id", RUN_ID_ENV)
        super().__init__(**options)


def _warn_if_resumed(args: Any, option: str, variable: str) -> None:
    checkpoint = getattr(args, "resume_from_checkpoint", None)
    if checkpoint:
        log.warning(
            "twinkle: swift resumes from %s, but twinkle was given no %s: this launch is "
            "observed as a new run. To continue the first launch's run, set %s (and %s) "
            "to its values",
            checkpoint,
            option,
            variable,
            RUN_ID_ENV if variable == OUT_DIR_ENV else OUT_DIR_ENV,
        )


def register(name: str = "twinkle", **options: Any) -> None:
    """Make ``--callbacks <name>`` (``RLHFArguments(callbacks=[name])``) observe swift's
    training with a :class:`TwinkleSwiftCallback` made with ``options`` (the
    callback's: ``out_dir``, ``run_id``, ``devices``, ...)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"name must be a non-empty string, got {name!r}")
    try:
        from swift.callbacks import callbacks_map
    except ImportError as exc:
        raise ImportError(
            "twinkle.integrations.swift.register needs ms-swift: pip install ms-swift"
        ) from exc
    TwinkleSwiftCallback(**options)  # (a bad option is refused here, not in swift's trainer)
    callbacks_map[name] = functools.partial(TwinkleSwiftCallback, **options)
