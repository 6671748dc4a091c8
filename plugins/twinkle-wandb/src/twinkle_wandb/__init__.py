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
``None`` (nothing to measure) is left out, and so are the figures of an iteration a
crash or an error cut short before its step (:func:`~twinkle.reporting.cut_short`: a
second row at the step before it would draw a false drop; they stay in
``metrics_raw.jsonl``). The W&B run finishes with exit code 0 when the twinkle run ends
``ok``, else 1.

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`WandbBackend`), which the run calls on a thread of the backend's own
(:class:`~twinkle.reporting.IsolatedBackend`): the training thread never waits on W&B.
Loading the plugin imports no wandb: the backend's :meth:`~WandbBackend.open`, on that
thread, imports it and starts the W&B run (``wandb.init`` and W&B's service), so the
run's start waits for neither. ``wandb.init`` needs no main thread (the offline and
disabled modes are tested so): with its console capture off (``console="off"``, which
also leaves the trainer's console its own) it installs no signal handler.

An unknown ``WANDB_MODE`` leaves the plugin out of the run at its start (named on stderr
and in ``summary.json``: ``plugins_left_out``); a W&B run that cannot start leaves its
backend out (``summary.json`` → ``backends`` → ``wandb`` → ``setup_error``); a call that
raises is logged, counted there (``records_failed``, ``calls_failed``) and skipped. The
run goes on, and every record stays in ``metrics_raw.jsonl``; a run that requires the
plugin (``--require-plugin wandb``, ``RunSession(required_plugins=["wandb"])``) fails
its start instead.

**Resume and replay.** A resumed run (a restarted job on the same run directory, segment
n) logs into a W&B run of its own, named ``<run_id>-s<n>``, in W&B group ``<run_id>``, that
holds the whole run: the earlier segments' records (those the run's checkpoint stands
for read back from ``metrics_raw.jsonl``, the rest rebuilt from the event log) first,
then the new segment's. So the newest W&B run of a group is complete
— including what a crash kept from reaching W&B, and the last iteration of a crashed
segment, which only the resume can finish — and none holds a record twice (appending to
the earlier W&B run could do neither: what reached it cannot be told from the log). The
earlier W&B runs are left as they were (they may be synced already). A resume that
fails before its segment begins removes its W&B run's directory when its backend
closes. ``twinkle replay RUN --out DIR`` logs every record into a W&B run in
``DIR/wandb/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from twinkle.errors import ReporterError
from twinkle.events import RunFinished, RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, cut_short, flat_key, remove_shared_write

if TYPE_CHECKING:  # (imported by open(): loading the plugin imports no wandb)
    import wandb

__all__ = ["DIR", "STEP_METRIC", "WandbBackend", "WandbSink"]

#: the directory W&B writes in the run directory
DIR = "wandb"
#: the x axis of every chart
STEP_METRIC = "optimizer_step"

Mode = Literal["offline", "online", "shared", "disabled"]
_MODES: tuple[Mode, ...] = get_args(Mode)


class WandbBackend:
    """A twinkle reporting backend that logs records into a new W&B run in
    ``<out_dir>/wandb/`` (see the module docstring): :meth:`open` starts it
    (``wandb.init`` with these arguments), before the first write; ``close`` finishes
    it with :attr:`exit_code`.

    ``keep``: false for a resumed run's W&B run until its segment began (the sink sets
    it): closed before, the W&B run is finished and its directory removed.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        name: str,
        group: str,
        project: str,
        mode: Mode,
        config: Mapping[str, Any],
        keep: bool = True,
    ) -> None:
        self.out_dir = out_dir
        self.keep = keep
        self.exit_code = 1  # until the twinkle run finished ok
        self.closed = False
        self.name = f"WandbBackend({name!r}, {str(out_dir / DIR)!r})"  # (W&B's id: open)
        self.run: wandb.Run | None = None
        self._init: dict[str, Any] = {
            "name": name,
            "group": group,
            "project": project,
            "mode": mode,
            "config": dict(config),
        }

    def open(self) -> None:
        """Import wandb and start the W&B run. A twinkle run calls it on the backend's
        own thread, so the run's start waits for neither."""
        if self.run is not None or self.closed:
            return
        import wandb

        try:
            run = wandb.init(  # (W&B draws the run's id: no attempt or replay reuses one)
                dir=self.out_dir,
                reinit="create_new",
                settings=wandb.Settings(console="off"),  # the trainer's console stays its own
                **self._init,
            )
        except Exception as exc:
            raise self._cannot_start(exc) from exc
        try:
            # W&B creates its files 0666 and directories 0777 (less the umask); twinkle's
            # are never writable by others: made so now, and again once the run finished.
            remove_shared_write(Path(run.settings.sync_dir).parent)
            run.define_metric(STEP_METRIC)
            run.define_metric("*", step_metric=STEP_METRIC)
        except Exception as exc:
            run.finish(exit_code=1)
            raise self._cannot_start(exc) from exc
        self.name = f"WandbBackend({run.id!r}, {run.settings.sync_dir!r})"
        self.run = run

    def _cannot_start(self, exc: Exception) -> ReporterError:
        return ReporterError(
            f"cannot start the W&B run of {self._init['group']!r} in "
            f"{str(self.out_dir / DIR)!r}: {type(exc).__name__}: {exc}; fix what W&B "
            "says (WANDB_MODE, WANDB_PROJECT, W&B's settings), or leave the plugin out of "
            "the run (--block wandb)"
        )

    def write(self, records: Sequence[MetricRecord]) -> None:
        run = self.run
        if run is None:
            raise ReporterError(
                f"{self.name} is not open: call its open() before writing (a twinkle run "
                "does, on the backend's own thread)"
            )
        summary: dict[str, int | float] = {}
        for record in records:
            if cut_short(record):
                continue
            values = {
                flat_key(record, key): value
                for key, value in record.values.items()
                if value is not None
            }
            if record.scope != "iteration":
                summary.update(values)
            elif values:
                run.log({STEP_METRIC: record.step, "iteration": record.iteration, **values})
        if summary:
            run.summary.update(summary)

    def flush(self) -> None:
        """Nothing to do: W&B's service writes what ``log`` handed it."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        run = self.run
        if run is None:
            return  # never opened: no W&B run
        sync_dir = Path(run.settings.sync_dir)
        try:
            run.finish(exit_code=self.exit_code)
        finally:
            if self.keep:
                remove_shared_write(sync_dir.parent)
            else:  # the resume failed before its segment began
                shutil.rmtree(sync_dir, ignore_errors=True)


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
        segment = context.segment if context.resumed_events > 0 else 0
        self._backend = WandbBackend(
            context.out_dir,
            name=context.run_id if segment == 0 else f"{context.run_id}-s{segment}",
            group=context.run_id,
            project=os.environ.get("WANDB_PROJECT") or "twinkle",
            mode=_mode(),  # (a mode W&B does not know: named now, at the start)
            config=context.config,
            keep=segment == 0,
        )
        self._segment = segment
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # (an earlier segment's run_resumed goes by again first: not this one)
        if event.segment == self._segment:
            self._segment = 0
            if self._backend is not None:
                self._backend.keep = True

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        if self._backend is not None and not self._segment:  # (not an earlier segment's)
            self._backend.exit_code = 0 if event.status == "ok" else 1

    @hookimpl
    def twinkle_checkpoint_state(self) -> None:
        """Nothing to keep: the resumed run's backend is made for its segment, and a
        resume from the run's checkpoint hands it the earlier records from
        ``metrics_raw.jsonl`` (a restart need not feed the whole log again)."""
        return None

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        # The run's reporter closed the backend, which finished its W&B run (and removed
        # it when the resume failed before its segment began): nothing left to close.
        self._backend = None


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
