"""MLflow for twinkle: every record of a run as MLflow metrics.

Installed, this plugin is loaded by every twinkle run of the environment (it registers
the observer ``mlflow`` in the entry-point group ``twinkle.observers``). Each run that
writes files logs into an MLflow run: in the store ``$MLFLOW_TRACKING_URI`` when set
(your tracking server or database), else in a sqlite store of the run's own,
``runs/<run_id>/mlflow/mlflow.db`` with its artifacts beside it (``mlflow ui
--backend-store-uri sqlite:///runs/<run_id>/mlflow/mlflow.db`` shows it). The experiment
is ``$MLFLOW_EXPERIMENT_NAME``, else ``twinkle``; the MLflow run is named after the
twinkle run and tagged ``twinkle.run_id``; the observers' configuration is its
``config.json`` artifact. Leave it out of one run with ``--block mlflow``
(``blocked=["mlflow"]``), of all with ``TWINKLE_DISABLE_PLUGIN_AUTOLOAD=1``. It uses an
``MlflowClient`` of its own: an active ``mlflow.start_run()`` of the trainer is left
alone.

**Metrics.** Each value of a record is the metric :func:`metric_name` names: its
:func:`~twinkle.reporting.flat_key` (``rollout/tokens_per_s_per_device``,
``timing/window_idle_seconds``, ``grpo/reward_mean``: the names of
``metrics_raw.jsonl``; the run's and the windows' figures as ``run/<kind>/<key>`` and
``window/<kind>/<key>``), with any character MLflow refuses as ``_``. Its step is the
record's optimizer step, its timestamp the record's wall time (ms); MLflow keeps the
float64, and one point of several equal ones (same step, time and value). A ``None``
(nothing to measure) is left out. The MLflow run ends ``FINISHED`` when the twinkle run
ends ``ok``, else ``FAILED``.

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`MlflowBackend`): the reporter hands it the records on its writer thread, and
each hand-over is one ``log_batch`` (or a few: MLflow takes 1,000 metrics a call), so
the training thread never waits on the store; a call that raises is the reporter's
backend failure (logged, counted in ``summary.json``, skipped), and every record stays
in ``metrics_raw.jsonl``.

**Resume and replay.** A resumed run (segment n) logs the whole run again, rebuilt from
its event log, into an MLflow run of its own, ``<run_id>-s<n>`` (tag ``twinkle.segment``),
so the newest MLflow run of a twinkle run is complete and none holds a point twice; the
earlier ones are left as they were. A resume that fails before its segment begins
deletes its MLflow run; one that was killed leaves its run RUNNING, and the next resume
ends it as KILLED. ``twinkle replay RUN --out DIR`` logs every record into
``DIR/mlflow/`` (or ``$MLFLOW_TRACKING_URI``).

**Cost** (mlflow 3.17, this project's 2-core machine): importing mlflow takes about
4 s, once per process, and a new sqlite store about 4 s more (its table migrations), at
the start of every run that has one; a ``log_batch`` of 40 metrics about 18 ms.
MLflow's own usage telemetry is MLflow's: ``MLFLOW_DISABLE_TELEMETRY=true`` (or
``DO_NOT_TRACK=true``) turns it off.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from mlflow.entities import Metric, RunStatus
from mlflow.tracking import MlflowClient

from twinkle.errors import ReporterError
from twinkle.events import RunFinished, RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, flat_key

__all__ = [
    "DIR",
    "EXPERIMENT",
    "MAX_METRICS_PER_BATCH",
    "MlflowBackend",
    "MlflowSink",
    "metric_name",
]

#: the plugin's directory in the run directory (its store, when it has its own)
DIR = "mlflow"
#: the experiment, unless ``$MLFLOW_EXPERIMENT_NAME`` names another
EXPERIMENT = "twinkle"
#: what MLflow accepts in one ``log_batch``
MAX_METRICS_PER_BATCH = 1000


class MlflowBackend:
    """A twinkle reporting backend that logs records as metrics of the MLflow run
    ``run_id`` through ``client`` (see the module docstring); ``close`` ends the run
    with :attr:`status`."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.name = f"MlflowBackend({run_id!r}, {client.tracking_uri!r})"
        self.status = RunStatus.to_string(RunStatus.FAILED)  # until the run finished ok
        self.closed = False

    def write(self, records: Sequence[MetricRecord]) -> None:
        metrics = [
            Metric(metric_name(record, key), float(value), record.wall_ns // 1_000_000, record.step)
            for record in records
            for key, value in record.values.items()
            if value is not None
        ]
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(
                self.run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH]
            )

    def flush(self) -> None:
        """Nothing to do: every ``log_batch`` is in the store when it returns."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.set_terminated(self.run_id, self.status)


class MlflowSink:
    """The observer: an MLflow run, through an :class:`MlflowBackend`, for each run that
    writes files (none for a run without ``out_dir``)."""

    def __init__(self) -> None:
        self._backend: MlflowBackend | None = None
        self._segment = 0  # the segment a resumed run begins; 0 once it began (or none)

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[MlflowBackend] | None:
        if context.out_dir is None:
            return None
        segment = context.segment if context.resumed_events > 0 else 0
        name = context.run_id if segment == 0 else f"{context.run_id}-s{segment}"
        own = context.out_dir.absolute() / DIR  # (a store URI is absolute)
        tracking = os.environ.get("MLFLOW_TRACKING_URI")  # else the run's own store
        uri = tracking or f"sqlite:///{own / 'mlflow.db'}"
        made = not tracking and not own.exists()  # (removed again if the start fails)
        backend: MlflowBackend | None = None
        try:
            if not tracking:
                own.mkdir(exist_ok=True)
            client = MlflowClient(tracking_uri=uri)
            experiment = _experiment(client, None if tracking else own)
            if segment:  # an earlier attempt at this segment, killed, never ended its run
                _end_killed_attempts(client, experiment, context.run_id)
            run = client.create_run(
                experiment,
                run_name=name,
                tags={"twinkle.run_id": context.run_id, "twinkle.segment": str(segment)},
            )
            backend = MlflowBackend(client, run.info.run_id)
            client.log_dict(run.info.run_id, dict(context.config), "config.json")
        except Exception as exc:
            if backend is not None:
                backend.close()  # (FAILED)
            if made:
                shutil.rmtree(own, ignore_errors=True)
            raise ReporterError(
                f"cannot start the MLflow run of {context.run_id!r} in {uri!r}: "
                f"{type(exc).__name__}: {exc}; fix what MLflow says (MLFLOW_TRACKING_URI, "
                "MLFLOW_EXPERIMENT_NAME), or leave the plugin out of the run (--block mlflow)"
            ) from exc
        self._backend, self._segment = backend, segment
        return [backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # (an earlier segment's run_resumed goes by again first: not this one)
        if event.segment == self._segment:
            self._segment = 0

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> None:
        if self._backend is not None and not self._segment:  # (not an earlier segment's)
            status = RunStatus.FINISHED if event.status == "ok" else RunStatus.FAILED
            self._backend.status = RunStatus.to_string(status)

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        backend, self._backend = self._backend, None
        if backend is None:
            return
        try:
            backend.close()  # (the reporter closed it, unless the run's start failed first)
        finally:
            if self._segment:  # the resume failed before its segment began
                backend.client.delete_run(backend.run_id)


def _experiment(client: MlflowClient, own: Path | None) -> str:
    """The id of the experiment, created when new: its artifacts in ``own`` (the run's
    own store), else where the tracking server puts them."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = None if own is None else (own / "artifacts").as_uri()
    return client.create_experiment(name, artifact_location=location)


def _end_killed_attempts(client: MlflowClient, experiment: str, run_id: str) -> None:
    """End as KILLED the MLflow runs of twinkle run ``run_id`` still RUNNING: their
    processes are gone (one process writes a run directory at a time)."""
    running = client.search_runs(
        [experiment],
        filter_string=f"tags.`twinkle.run_id` = '{run_id}' and attributes.status = 'RUNNING'",
    )
    for stale in running:
        client.set_terminated(stale.info.run_id, RunStatus.to_string(RunStatus.KILLED))


#: what MLflow takes in a metric's name (and how long)
_NAME_REFUSED = re.compile(r"[^\w\-. /:]")
_NAME_MAX = 250


def metric_name(record: MetricRecord, key: str) -> str:
    """The MLflow metric of value ``key`` of ``record``: its
    :func:`~twinkle.reporting.flat_key`, with each character MLflow refuses (a caller's
    scalar may hold any) as ``_`` and cut to MLflow's 250 characters: one odd name never
    costs the batch it is in."""
    return _NAME_REFUSED.sub("_", flat_key(record, key))[:_NAME_MAX]
