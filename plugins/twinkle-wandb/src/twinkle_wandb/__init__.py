"""Weights & Biases for twinkle: every record of a run in a W&B run, offline unless asked.

Installed, this plugin is loaded by every twinkle run of the environment (it registers
the observer ``wandb`` in the entry-point group ``twinkle.observers``). Each run that
writes files starts a W&B run in ``runs/<run_id>/wandb/`` — W&B run name and group =
the twinkle run id (its id W&B's own), project ``$WANDB_PROJECT`` (else ``twinkle``), config = the
observers' configuration — in W&B's *offline* mode unless ``WANDB_MODE`` says
otherwise: nothing leaves the machine until you run ``wandb sync runs/<run_id>/wandb``.
Leave it out of one run with ``--block wandb`` (``blocked=["wandb"]``), of all with
``TWINKLE_DISABLE_PLUGIN_AUTOLOAD=1``. The W&B run is a run of its own
(``reinit="create_new"``): a W&B run the trainer already has (TRL's
``report_to="wandb"``) is neither finished nor written to, and ``wandb.log`` still goes
to it.

**History and summary.** Each record of an iteration is one history row: its values
under the names :func:`~twinkle.reporting.flat_key` gives (``rollout/tokens_per_s_per_device``,
``timing/window_idle_seconds``, ``grpo/reward_mean``: the names of ``metrics_raw.jsonl``),
with ``optimizer_step`` and ``iteration``; every chart's x axis is ``optimizer_step``
(``define_metric``). The run's and the windows' records go to the W&B summary as
``run/<kind>/<key>`` and ``window/<kind>/<key>`` (the last value where one recurs). A
``None`` (nothing to measure) is left out. The W&B run finishes with exit code 0 when
the twinkle run ends ``ok``, else 1.

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`WandbBackend`): the reporter hands it the records on its writer thread, so the
training thread never waits on W&B; a call that raises is the reporter's backend failure
(logged, counted in ``summary.json``, skipped), and every record stays in
``metrics_raw.jsonl``.

**Resume and replay.** A resumed run (a restarted job on the same run directory, segment
n) logs into a W&B run of its own, named ``<run_id>-s<n>``, in W&B group ``<run_id>``, that
holds the whole run: the earlier segments' records, which the observers rebuild from the
event log first, then the new segment's. So the newest W&B run of a group is complete
— including what a crash kept from reaching W&B, and the last iteration of a crashed
segment, which only the resume can finish — and none holds a record twice (appending to
the earlier W&B run could do neither: what reached it cannot be told from the log). The
earlier W&B runs are left as they were (they may be synced already). A resume that
fails before its segment begins removes its W&B directory. ``twinkle replay RUN --out
DIR`` logs every record into a W&B run in ``DIR/wandb/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Literal, get_args

import wandb

from twinkle.errors import ReporterError
from twinkle.events import RunFinished, RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, flat_key

__all__ = ["DIR", "STEP_METRIC", "WandbBackend", "WandbSink"]

#: the directory W&B writes in the run directory
DIR = "wandb"
#: the x axis of every chart
STEP_METRIC = "optimizer_step"


class WandbBackend:
    """A twinkle reporting backend that logs records to the W&B run ``run`` (see the
    module docstring); ``close`` finishes it with :attr:`exit_code`."""

    def __init__(self, run: wandb.Run) -> None:
        self.run = run
        self.name = f"WandbBackend({run.id!r}, {run.settings.sync_dir!r})"
        self.exit_code = 1  # until the twinkle run finished ok
        self.closed = False
        run.define_metric(STEP_METRIC)
        run.define_metric("*", step_metric=STEP_METRIC)

    def write(self, records: Sequence[MetricRecord]) -> None:
        summary: dict[str, int | float] = {}
        for record in records:
            values = {
                flat_key(record, key): value
                for key, value in record.values.items()
                if value is not None
            }
            if record.scope != "iteration":
                summary.update(values)
            elif values:
                self.run.log({STEP_METRIC: record.step, "iteration": record.iteration, **values})
        if summary:
            self.run.summary.update(summary)

    def flush(self) -> None:
        """Nothing to do: W&B's service writes what ``log`` handed it."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.run.finish(exit_code=self.exit_code)


class WandbSink:
    """The observer: a W&B run, through a :class:`WandbBackend`, for each run that writes
    files (none for a run without ``out_dir``)."""

    def __init__(self) -> None:
        self._backend: WandbBackend | None = None
        self._segment = 0  # the segment a resumed run begins; 0 once it began (or none)

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[WandbBackend] | None:
        if context.out_dir is None:
            return None
        mode = _mode()
        segment = context.segment if context.resumed_events > 0 else 0
        name = context.run_id if segment == 0 else f"{context.run_id}-s{segment}"
        try:
            run = wandb.init(  # (W&B draws the run's id: no attempt or replay reuses one)
                dir=context.out_dir,
                project=os.environ.get("WANDB_PROJECT") or "twinkle",
                name=name,
                group=context.run_id,
                mode=mode,
                config=dict(context.config),
                reinit="create_new",
                settings=wandb.Settings(console="off"),  # the trainer's console stays its own
            )
        except Exception as exc:
            raise _cannot_start(context, exc) from exc
        try:
            self._backend = WandbBackend(run)
        except Exception as exc:
            run.finish(exit_code=1)
            raise _cannot_start(context, exc) from exc
        self._segment = segment
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # (an earlier segment's run_resumed goes by again first: not this one)
        if event.segment == self._segment:
            self._segment = 0

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        if self._backend is not None and not self._segment:  # (not an earlier segment's)
            self._backend.exit_code = 0 if event.status == "ok" else 1

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        backend, self._backend = self._backend, None
        if backend is None:
            return
        try:
            backend.close()  # (the reporter closed it, unless the run's start failed first)
        finally:
            if self._segment:  # the resume failed before its segment began
                shutil.rmtree(backend.run.settings.sync_dir, ignore_errors=True)


def _cannot_start(context: RunContext, exc: Exception) -> ReporterError:
    return ReporterError(
        f"cannot start the W&B run of {context.run_id!r} in "
        f"{str(context.out_dir / DIR) if context.out_dir else None!r}: "
        f"{type(exc).__name__}: {exc}; fix what W&B says, or leave the plugin out of the "
        "run (--block wandb)"
    )


Mode = Literal["offline", "online", "shared", "disabled"]
_MODES: tuple[Mode, ...] = get_args(Mode)


def _mode() -> Mode:
    """W&B's mode: ``$WANDB_MODE`` when set, else offline (nothing is sent unasked)."""
    mode = os.environ.get("WANDB_MODE") or "offline"
    for known in _MODES:
        if mode == known:
            return known
    raise ReporterError(
        f"WANDB_MODE={mode!r} is not a W&B mode: set it to one of "
        f"{', '.join(map(repr, _MODES))}, or unset it (offline)"
    )
