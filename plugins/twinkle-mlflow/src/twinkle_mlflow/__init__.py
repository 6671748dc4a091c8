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
(nothing to measure) is left out, and so are the figures of an iteration a crash or an
error cut short before its step (:func:`~twinkle.reporting.cut_short`: a second point at
the step before it would draw a false drop; they stay in ``metrics_raw.jsonl``). The
MLflow run ends
``FINISHED`` when the twinkle run ends ``ok``, else ``FAILED``.

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`MlflowBackend`), which the run calls on a thread of the backend's own
(:class:`~twinkle.reporting.IsolatedBackend`); each hand-over is one ``log_batch`` (or a
few: MLflow takes 1,000 metrics a call), so the training thread never waits on the
store. Loading the plugin imports no mlflow: the backend's :meth:`~MlflowBackend.open`,
on that thread, imports it, opens the store (creating it, with its table migrations,
when new: the run's own store is made under another name and renamed into place, so a
process killed meanwhile leaves no half-made one) and creates the MLflow run, so the
run's start waits for none of it.

A store or MLflow run that cannot be opened leaves the backend out of the run
(``summary.json`` → ``backends`` → ``mlflow`` → ``setup_error``, and the log); a call
that raises is logged, counted there (``records_failed``, ``calls_failed``) and
skipped. The run goes on, and every record stays in ``metrics_raw.jsonl``; a run that
requires the plugin (``--require-plugin mlflow``,
``RunSession(required_plugins=["mlflow"])``) fails its start instead: its start waits
for the store.

**Resume and replay.** A resumed run (segment n) logs the whole run again (the records
the run's checkpoint stands for read back from ``metrics_raw.jsonl``, the rest rebuilt
from its event log) into an MLflow run of its own, ``<run_id>-s<n>`` (tag ``twinkle.segment``),
so the newest MLflow run of a twinkle run is complete and none holds a point twice; the
earlier ones are left as they were. A resume that fails before its segment begins
deletes its MLflow run when its backend closes; one that was killed leaves its run
RUNNING (if it lived long enough to create one), and the next resume ends it as KILLED.
``twinkle replay RUN --out DIR`` logs every record into ``DIR/mlflow/`` (or
``$MLFLOW_TRACKING_URI``).

**Cost** (mlflow 3.17, this project's 2-core machine): importing mlflow takes about
2 to 4 s, once per process, and a new sqlite store about 4 s more (its table
migrations), in the backend's :meth:`~MlflowBackend.open`, off the run's start; a
``log_batch`` of 40 metrics about 18 ms. MLflow's own usage telemetry is MLflow's:
``MLFLOW_DISABLE_TELEMETRY=true`` (or ``DO_NOT_TRACK=true``) turns it off.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinkle.errors import ReporterError
from twinkle.events import RunFinished, RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, cut_short, flat_key, remove_shared_write

if TYPE_CHECKING:  # (imported by open(): loading the plugin imports no mlflow)
    from mlflow.tracking import MlflowClient

__all__ = [
    "DIR",
    "EXPERIMENT",
    "MAX_METRICS_PER_BATCH",
    "MlflowBackend",
    "MlflowSink",
    "STORE",
    "metric_name",
]

#: the plugin's directory in the run directory (its store, when it has its own)
DIR = "mlflow"
#: the run's own store in it (sqlite)
STORE = "mlflow.db"
#: the experiment, unless ``$MLFLOW_EXPERIMENT_NAME`` names another
EXPERIMENT = "twinkle"
#: what MLflow accepts in one ``log_batch``
MAX_METRICS_PER_BATCH = 1000
#: the ends of an MLflow run (MLflow's ``RunStatus`` names)
_FINISHED, _FAILED, _KILLED = "FINISHED", "FAILED", "KILLED"


class MlflowBackend:
    """A twinkle reporting backend that logs records as metrics of a new MLflow run of
    twinkle run ``twinkle_run_id`` (see the module docstring): :meth:`open` opens the
    store and creates the run, before the first write; ``close`` ends the run with
    :attr:`status`.

    The store is ``tracking_uri``, else a sqlite store of the run's own in ``own`` (the
    run directory's ``mlflow/``); the experiment is ``experiment``. A resumed run's
    ``segment`` (> 0) first ends as KILLED the twinkle run's MLflow runs that a killed
    attempt left RUNNING. ``keep``: false for a resumed run's MLflow run until its
    segment began (the sink sets it): closed before, the MLflow run is deleted.
    """

    def __init__(
        self,
        own: Path,
        *,
        twinkle_run_id: str,
        tracking_uri: str | None = None,
        experiment: str = EXPERIMENT,
        segment: int = 0,
        config: Mapping[str, Any] | None = None,
        keep: bool = True,
    ) -> None:
        self.own = own.absolute()  # (a store URI is absolute)
        self.tracking_uri = tracking_uri or f"sqlite:///{self.own / STORE}"
        self.twinkle_run_id = twinkle_run_id
        self.run_name = twinkle_run_id if segment == 0 else f"{twinkle_run_id}-s{segment}"
        self.experiment = experiment
        self.segment = segment
        self.keep = keep
        self.status = _FAILED  # until the twinkle run finished ok
        self.closed = False
        self.name = f"MlflowBackend({self.run_name!r}, {self.tracking_uri!r})"  # (id: open)
        #: the store's client and the MLflow run's id, once open
        self.client: MlflowClient | None = None
        self.run_id: str | None = None
        self._own_store = tracking_uri is None
        self._config = dict(config or {})

    def open(self) -> None:
        """Import mlflow, open the store (created when new: its table migrations) and
        create the MLflow run. A twinkle run calls it on the backend's own thread, so
        the run's start waits for none of it."""
        if self.client is not None or self.closed:
            return
        from mlflow.tracking import MlflowClient

        own = self.own if self._own_store else None
        made = own is not None and not own.exists()  # (removed again if opening fails)
        client: MlflowClient | None = None
        run_id: str | None = None
        try:
            if own is not None:
                own.mkdir(mode=0o755, exist_ok=True)  # (twinkle's modes, less the umask)
                _make_store(own / STORE)
            client = MlflowClient(tracking_uri=self.tracking_uri)
            experiment = _experiment(client, self.experiment, own)
            if self.segment:  # an earlier attempt at this segment, killed, never ended its run
                _end_killed_attempts(client, experiment, self.twinkle_run_id)
            run_id = client.create_run(
                experiment,
                run_name=self.run_name,
                tags={"twinkle.run_id": self.twinkle_run_id, "twinkle.segment": str(self.segment)},
            ).info.run_id
            client.log_dict(run_id, self._config, "config.json")
            if own is not None:  # MLflow makes its artifacts' directories 0777, files 0666
                remove_shared_write(own)
        except Exception as exc:
            if client is not None and run_id is not None:
                client.set_terminated(run_id, _FAILED)
            if made and own is not None:
                shutil.rmtree(own, ignore_errors=True)
            fix = (
                f"move {str(own / STORE)!r} away if MLflow cannot read it (the next "
                "resume makes a new one and logs the whole run into it)"
                if own is not None and not made
                else "fix what MLflow says (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME)"
            )
            raise ReporterError(
                f"cannot start the MLflow run of {self.twinkle_run_id!r} in "
                f"{self.tracking_uri!r}: {type(exc).__name__}: {exc}; {fix}, or leave the "
                "plugin out of the run (--block mlflow)"
            ) from exc
        self.name = f"MlflowBackend({run_id!r}, {self.tracking_uri!r})"
        self.client, self.run_id = client, run_id

    def write(self, records: Sequence[MetricRecord]) -> None:
        from mlflow.entities import Metric  # (imported by open(): a look-up)

        client, run_id = self.client, self.run_id
        if client is None or run_id is None:
            raise ReporterError(
                f"{self.name} is not open: call its open() before writing (a twinkle run "
                "does, on the backend's own thread)"
            )
        metrics = [
            Metric(metric_name(record, key), float(value), record.wall_ns // 1_000_000, record.step)
            for record in records
            if not cut_short(record)
            for key, value in record.values.items()
            if value is not None
        ]
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])

    def flush(self) -> None:
        """Nothing to do: every ``log_batch`` is in the store when it returns."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        client, run_id = self.client, self.run_id
        if client is None or run_id is None:
            return  # never opened: no MLflow run
        try:
            client.set_terminated(run_id, self.status)
        finally:
            if not self.keep:  # the resume failed before its segment began
                client.delete_run(run_id)


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
        self._backend = MlflowBackend(
            context.out_dir / DIR,
            twinkle_run_id=context.run_id,
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,  # else the run's own
            experiment=os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT,
            segment=segment,
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
            self._backend.status = _FINISHED if event.status == "ok" else _FAILED

    @hookimpl
    def twinkle_checkpoint_state(self) -> None:
        """Nothing to keep: the resumed run's backend is made for its segment, and a
        resume from the run's checkpoint hands it the earlier records from
        ``metrics_raw.jsonl`` (a restart need not feed the whole log again)."""
        return None

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        # The run's reporter closed the backend, which ended its MLflow run (and deleted
        # it when the resume failed before its segment began): nothing left to close.
        self._backend = None


_ATTEMPTS = itertools.count()


def _make_store(store: Path) -> None:
    """Make the run's own sqlite store whole, when new: MLflow makes its tables (its
    migrations, seconds) in a file of another name, which then takes the store's, so a
    process killed meanwhile leaves no half-made store for every later resume to fail
    on (what a killed attempt left under that name is made again)."""
    if store.exists():
        return
    from mlflow.tracking import MlflowClient

    for stale in store.parent.glob(f"{store.name}.making*"):  # (with its -journal, -wal)
        stale.unlink(missing_ok=True)
    # A name of this attempt's own: MLflow keeps a store (and its connection) per URI for
    # the process, and would take an earlier attempt's for this one's.
    making = store.with_name(f"{store.name}.making-{os.getpid()}-{next(_ATTEMPTS)}")
    MlflowClient(tracking_uri=f"sqlite:///{making}").search_experiments(max_results=1)
    os.replace(making, store)


def _experiment(client: MlflowClient, name: str, own: Path | None) -> str:
    """The id of experiment ``name``, created when new: its artifacts in ``own`` (the
    run's own store), else where the tracking server puts them."""
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
        client.set_terminated(stale.info.run_id, _KILLED)


#: what MLflow takes in a metric's name (and how long)
_NAME_REFUSED = re.compile(r"[^\w\-. /:]")
_NAME_MAX = 250


def metric_name(record: MetricRecord, key: str) -> str:
    """The MLflow metric of value ``key`` of ``record``: its
    :func:`~twinkle.reporting.flat_key`, with each character MLflow refuses (a caller's
    scalar may hold any) as ``_`` and cut to MLflow's 250 characters: one odd name never
    costs the batch it is in."""
    return _NAME_REFUSED.sub("_", flat_key(record, key))[:_NAME_MAX]
