"""``RunSession``: one observed live run — bus, recorders, and the :class:`Run` that
holds its observers and outputs.

The session is the caller's handle::

    with RunSession(out_dir="runs", config=config) as run:
        with run.recorder.span("generate", iteration=0):
            ...
        run.bus.samples(iteration=0, phase="rollout", lengths=lengths)

It writes ``runs/<run_id>/`` (SPEC §8): ``events.jsonl``, ``metrics_raw.jsonl``,
``metrics.jsonl``, ``summary.json`` and ``trace.json`` — through the observers, so that
:func:`twinkle.run.replay` reproduces the records and the summary from the log.

One live process writes a run directory at a time. A session on a directory that
already holds a run's log (a restarted job, same run id) *resumes* it
(:mod:`twinkle.run._resume`): every output covers the whole run, and ``run_resumed``
begins the new segment on a clock that continues the run's timeline (see
:attr:`RunSession.resumed`). Its configuration may differ from the run's only in
``total_steps`` and the caller's ``x_`` keys; any other change is refused
(:class:`~twinkle.errors.ResumeConfigError`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pluggy

from twinkle.checks import run_id as check_run_id
from twinkle.errors import (
    InvalidArgumentError,
    RecordError,
    TwinkleError,
)
from twinkle.events import (
    OVERHEAD_SOURCE,
    EventBus,
    RunFinished,
    Status,
    publish_report,
    validate_event,
)
from twinkle.hookspecs import RunContext
from twinkle.perf import Clock, TimeRecorder, WorkerReport, bind_process_recorder
from twinkle.perf.stats import MemoryReading, memory_stats
from twinkle.plugins import (
    DEFAULT_SLOW_CALL_S,
    Dispatcher,
    check_slow_call_s,
    loaded_plugins,
    make_plugin_manager,
)
from twinkle.reporting import DEFAULT_BACKEND_TIMEOUT_S, MetricsReporter
from twinkle.run._after_finish import watch_after_finish
from twinkle.run._process import tie
from twinkle.run._resume import Resumed, RunDirectory
from twinkle.run._run import Run, RunState
from twinkle.run._scan import Scan
from twinkle.run._session_args import check_arguments

__all__ = ["Resumed", "RunSession", "new_run_id"]

log = logging.getLogger("twinkle.session")


def new_run_id(wall_ns: int) -> str:
    """A fresh run id: UTC time of the start plus the process id and a random suffix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(wall_ns / 1e9))
    return f"{stamp}-{os.getpid()}-{os.urandom(2).hex()}"


class RunSession:
    """One observed run. Start it (or enter it), publish, then :meth:`finish` (or exit).

    :param out_dir: where ``<run_id>/`` is created; ``None`` writes no files.
    :param run_id: a safe name (default: time, pid and a random suffix).
    :param config: the observers' business definitions (see
        :class:`twinkle.observers.ObserverConfig`); plain JSON data.
    :param clock: the run's monotonic ns clock; ``wall_clock``: unix ns.
    :param plugin_manager: a manager from :func:`~twinkle.plugins.make_plugin_manager`;
        else one is built from ``autoload``, ``builtins``, ``blocked`` and ``plugins``.
    :param background_writer: write records on a background thread.
    :param background_dispatch: run the observers on one dispatch thread (the default),
        off the publishing threads, at most a boundary behind them (the records are
        the same but for twinkle's own time, the dispatch thread's counted in it; see
        :class:`~twinkle.plugins.Dispatcher`); False: on the publishing threads.
    :param slow_call_s: an observer call taking longer is logged and counted
        (``observer_slow_calls`` in the summary); None: calls are not timed.
    :param required_plugins: plugins the run must not go without: one that cannot set
        up fails :meth:`start`. Any other plugin that cannot set up is left out, named on
        stderr and in the summary (``plugins_left_out``), and the run goes on.
    :param backend_timeout_s: a plugin's record backend runs on a thread of its own; one
        call of it (open, write, flush, close) that takes longer cuts it off (the run's
        own files never wait for it; ``backends`` in the summary says what each did).
    :param source: the name of this process's spans in the run (:attr:`recorder`'s):
        ``main``, or the worker this process is, as the placement and its memory
        readings name it (``rank0`` of a job on several ranks).
    :param resume: what to do when the run directory already holds the run's log.
        ``None`` (the default): continue it only if its last segment did not finish
        ``ok`` (it crashed, was killed, or ended in ``error``: a restarted job recovers);
        a run that finished ``ok`` is refused (:class:`~twinkle.errors.FinishedRunError`,
        before anything is written), so the same command run twice never silently makes
        one longer run. ``True``: continue it whatever its last status (a job asked for
        more steps). ``False``: never continue a run; a directory holding one is refused.

    A session publishes only between :meth:`start` and :meth:`finish` (else
    :class:`~twinkle.errors.TwinkleError`), in the process that started it: a forked
    child's copy refuses to publish or finish (the run stays its parent's).
    """

    def __init__(
        self,
        *,
        out_dir: str | os.PathLike[str] | None = "runs",
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        clock: Clock = time.perf_counter_ns,
        wall_clock: Clock = time.time_ns,
        plugin_manager: pluggy.PluginManager | None = None,
        autoload: bool | None = None,
        builtins: bool = True,
        blocked: Iterable[str] = (),
        plugins: Iterable[tuple[str, object]] = (),
        background_writer: bool = True,
        background_dispatch: bool = True,
        slow_call_s: float | None = DEFAULT_SLOW_CALL_S,
        required_plugins: Iterable[str] = (),
        backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
        resume: bool | None = None,
        source: str = "main",
    ) -> None:
        # Checked now, not when the run starts: a wrong option must not cost a run.
        check_arguments(
            resume=resume,
            out_dir=out_dir,
            clock=clock,
            wall_clock=wall_clock,
            config=config,
            autoload=autoload,
            background_writer=background_writer,
            background_dispatch=background_dispatch,
            builtins=builtins,
            source=source,
        )
        check_slow_call_s(slow_call_s)
        self._source = source
        self._resume_asked = resume
        self.run_id = check_run_id(new_run_id(wall_clock()) if run_id is None else run_id)
        self.config: dict[str, Any] = dict(config or {})
        self.out_dir = None if out_dir is None else Path(out_dir) / self.run_id
        self._directory = None if self.out_dir is None else RunDirectory(self.out_dir, self.run_id)
        #: set by start() when the run directory held a log: what it found there
        self.resumed: Resumed | None = None
        if self._directory is not None:
            # A log already here is a run to resume: this session's clock continues it.
            clock = self._directory.continuing(clock, wall_clock)
        self._clock = clock
        self.recorder = TimeRecorder(clock=clock, wall_clock=wall_clock)
        # twinkle's own time on the caller's threads: every publish, timed by the bus
        self._overhead = TimeRecorder(clock=clock, wall_clock=wall_clock)
        self.bus = self._unstarted_bus(clock, wall_clock)
        self._pid = os.getpid()
        self._unbind: Callable[[], None] | None = None
        self._wall_clock = wall_clock
        pm = plugin_manager or make_plugin_manager(
            autoload=autoload, builtins=builtins, blocked=blocked, plugins=plugins
        )
        self.context = RunContext(self.run_id, self.out_dir, self.config, replay=False)
        self.run = Run(
            pm,
            self.context,
            background=background_writer,
            background_dispatch=background_dispatch,
            slow_call_s=slow_call_s,
            required_plugins=required_plugins,
            backend_timeout_s=backend_timeout_s,
        )
        reserved = pm.hook.twinkle_reserved_scalar_names(config=self.run.context.config)
        self.bus.reserve_scalar_names(name for names in reserved for name in names)
        self.summary: dict[str, Any] | None = None
        self._untie: Callable[[], None] | None = None  # (from this process: _process)

    def _unstarted_bus(self, clock: Clock, wall_clock: Clock) -> EventBus:
        bus = EventBus(self.run_id, clock=clock, wall_clock=wall_clock, overhead=self._overhead)
        bus.refuse(
            f"run {self.run_id!r} is not started: call start() (or enter `with "
            "RunSession(...)`) before publishing"
        )
        return bus

    @property
    def pm(self) -> pluggy.PluginManager:
        """The run's plugin manager (its plugin set is fixed while the run runs)."""
        return self.run.pm

    @property
    def state(self) -> RunState:
        return self.run.state

    @property
    def reporter(self) -> MetricsReporter | None:
        """The run's reporter while it runs."""
        return self.run.reporter

    @property
    def dispatcher(self) -> Dispatcher | None:
        """The run's dispatcher while it runs."""
        return self.run.dispatcher

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> RunSession:
        """Take the run directory, configure the observers, open the outputs and publish
        ``run_started`` — or, when the directory holds the run's log, resume it (see the
        module docstring and :attr:`resumed`)."""
        if self.run.state is not RunState.NEW:
            raise TwinkleError(f"run {self.run_id!r} was already started")
        self._own_process("start")
        directory = self._directory
        scan = None if directory is None else directory.take(self.run.pm, self.run.context.config)
        try:
            if scan is not None:
                assert directory is not None
                directory.check(
                    scan,
                    asked=self._resume_asked,
                    config=self.config,
                    pm=self.run.pm,
                    clock=self._clock,
                )
                self.run.context = dataclasses.replace(
                    self.run.context,
                    resumed_events=scan.events,
                    segment=scan.segments,
                    checkpoint=directory.checkpoint,
                )
                self.context = self.run.context
            self.run.start()
            self.bus.attach(self.recorder, source=self._source)
            self.bus.attach(self._overhead, source=OVERHEAD_SOURCE)
            if scan is None:
                self.run.connect(self.bus)
                self.bus.run_started(
                    self.config,
                    plugins=loaded_plugins(self.run.pm),
                    plugins_left_out=self._left_out(),
                )
            else:
                assert directory is not None
                self._resume(directory, scan)
            # (dispatched inline so far: the event log has written the segment's first
            # event through, a kill now leaves a log to resume)
            self.run.go_live(self.bus.own_work)  # (the logged events fed: none in between)
        except BaseException:
            try:
                self.run.close()  # FAILED: it never finished
            finally:
                if directory is not None:
                    directory.give_up()
            raise
        # Module-level twinkle.perf.span()/@timed, on any thread, record into this run.
        self._unbind = bind_process_recorder(self.recorder)
        # A caller that neither exits a ``with`` block nor calls finish() (an uncaught
        # exception outside one, sys.exit) still gets its summary, marked as an error.
        self._untie = tie(self)
        return self

    def _resume(self, directory: RunDirectory, scan: Scan) -> None:
        """Feed the logged events to the observers again, close a segment that stopped
        without finishing, then begin the new segment (:mod:`twinkle.run._resume`)."""
        self.resumed = directory.resume(self.run, self.bus, scan)
        self.bus.run_resumed(
            self.resumed.segment,
            self.config,
            plugins=loaded_plugins(self.run.pm),
            plugins_left_out=self._left_out(),
        )
        directory.forget_summary()

    def _left_out(self) -> dict[str, str]:
        """The plugins the run went without because they could not set up, with why."""
        return {} if self.run.calls is None else dict(self.run.calls.left_out)

    def _running_here(self) -> bool:
        return self.run.state is RunState.RUNNING and os.getpid() == self._pid

    def _own_process(self, doing: str) -> None:
        """Refuse to ``doing`` the run from a forked child, or from inside a hook."""
        if os.getpid() != self._pid:
            raise TwinkleError(
                f"cannot {doing} run {self.run_id!r} in process {os.getpid()}: it belongs to "
                f"process {self._pid} (this is a forked child); start a RunSession of "
                "its own in the child"
            )
        if self.run.dispatcher is not None and self.run.dispatcher.dispatching_here:
            raise TwinkleError(
                f"cannot {doing} run {self.run_id!r} from inside an observer's hook: the "
                f"run waits for its hooks; {doing} it where the training runs"
            )

    def _forget_in_child(self) -> None:
        """After a fork, in the child: this copy never publishes to, finishes or writes
        the parent's run (the parent owns its files, threads and lock)."""
        self.bus.forget_in_child(
            f"run {self.run_id!r} belongs to process {self._pid}; this forked child "
            "cannot publish to it: start a RunSession of its own in the child"
        )
        if self._untie is not None:
            self._untie()
            self._untie = None

    def finish(
        self,
        *,
        status: Status = "ok",
        error: str | None = None,
        terminal_totals: Mapping[str, int | float] | None = None,
    ) -> dict[str, Any]:
        """Publish ``run_finished``, write ``summary.json`` and close every output."""
        self._own_process("finish")
        reporter = self.run.reporter
        if self.run.state is not RunState.RUNNING or reporter is None:
            raise TwinkleError(
                f"run {self.run_id!r} is not running (state: {self.run.state.value})"
            )
        # The caller's part checked before anything changes: a bad total is an error the
        # caller can fix and finish again after, never a lost run.
        validate_event(RunFinished(self.run_id, 0, 0, status, error, dict(terminal_totals or {})))
        for key, value in (terminal_totals or {}).items():  # (numbers: validated)
            if value < 0:  # (refused as written, not in a log read back: older ones hold some)
                raise RecordError(
                    f"run_finished.terminal_totals[{key!r}] = {value!r}: terminal totals "
                    "count what the producers did (samples, tokens, updates), never fewer "
                    "than none; pass the count, or leave it out"
                )
        if self._unbind is not None:
            self._unbind()
            self._unbind = None
        if self._untie is not None:
            self._untie()
            self._untie = None
        try:
            slow, interrupted = self.run.settled_slow_calls()
            try:
                self.bus.run_finished(
                    status=status,
                    error=error,
                    terminal_totals=terminal_totals,
                    records_dropped=reporter.stats.dropped,
                    process_wall_ns=self._process_wall_ns(),
                    observer_slow_calls=slow,
                )
            except BaseException:
                self.run.close()  # FAILED: it never finished
                raise
            closing = self._close_backends()  # (always: its backends_closed)
            interrupted = interrupted or closing
            self._refuse_after_finish()  # (the run unbinds the bus as it closes)
            self.summary = self.run.finish()
            _warn_unhealthy(self.run_id, self.summary)
            if interrupted is not None:
                raise interrupted
        finally:
            self._refuse_after_finish()
            watch_after_finish(self.recorder, self.run_id)
            if self._directory is not None:
                self._directory.lock.release()
        return self.summary

    def _refuse_after_finish(self) -> None:
        """What a publish is told once the run no longer takes events."""
        state = self.run.state
        how = "finishing" if state is RunState.RUNNING else state.value
        self.bus.refuse(f"run {self.run_id!r} is over ({how}): publish before finish()")

    def _close_backends(self) -> BaseException | None:
        """Close the backends and publish what they did (``backends_closed``). A Ctrl-C
        (or any error) while waiting for a plugin's backend gives up on the ones still
        open, named so, and is returned for the caller to raise once the summary is
        written: the run itself had finished."""
        interrupted: BaseException | None = None
        try:
            health = self.run.close_backends()
        except BaseException as exc:
            interrupted = exc
            health = self.run.cut_off_backends(f"closing was interrupted ({type(exc).__name__})")
        self.bus.backends_closed(health)
        return interrupted

    def _process_wall_ns(self) -> int | None:
        try:
            import psutil

            created_ns = int(psutil.Process().create_time() * 1e9)
        except Exception:  # pragma: no cover - psutil cannot read the process
            return None
        return max(0, self._wall_clock() - created_ns)

    def __enter__(self) -> RunSession:
        if self.run.state in (RunState.FINISHED, RunState.FAILED):
            raise TwinkleError(
                f"run {self.run_id!r} is over ({self.run.state.value}): a RunSession "
                "observes one run; make a new RunSession (resume=True continues the run)"
            )
        return self.start() if self.run.state is RunState.NEW else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.run.state is not RunState.RUNNING:
            return
        if os.getpid() != self._pid:
            return  # a forked child leaving the block: the run is its parent's
        if exc is None:
            self.finish()
            return
        try:
            self.finish(status="error", error=f"{type(exc).__qualname__}: {exc}")
        except Exception:
            # The caller's exception is the one to see; this one is logged.
            log.exception("run %r: finishing after %s failed", self.run_id, type(exc).__name__)

    # -- conveniences -----------------------------------------------------------------

    def read_memory(
        self,
        *,
        iteration: int | None,
        device: str | None = None,
        others: Iterable[MemoryReading] = (),
        worker_id: str | None = None,
    ) -> None:
        """Read this process's memory (:func:`~twinkle.perf.stats.memory_stats`; worker
        ``worker_id``, default this process's ``source``, the name its spans carry) and
        publish it, with ``others``: readings other workers shipped for the same
        iteration (one event: one record of them all)."""
        worker_id = self._source if worker_id is None else worker_id
        with self.bus.own_work("memory"):
            reading = memory_stats(device=device, worker_id=worker_id)
        self.bus.memory([reading, *others], iteration=iteration)

    def receive(self, report: WorkerReport, *, iteration: int | None = None) -> None:
        """Publish what a worker process measured (its
        :class:`~twinkle.perf.WorkerReport`): its spans as a batch from source
        ``report.worker`` on its own clock anchor (counting the spans it dropped; the
        timeline checks that anchor against the report's send time and its arrival now,
        docs/scale-out.md), and its memory readings as taken during ``iteration`` (None:
        outside any, or not known; its spans are placed by their own times either way).
        A report refused (a span ending before it starts, a field its checks refuse) is
        refused whole: nothing of it is published."""
        if not isinstance(report, WorkerReport):
            raise InvalidArgumentError(
                f"receive() takes a twinkle.perf.WorkerReport (from WorkerRecorder.report() "
                f"in the worker), got {type(report).__name__}: {report!r:.100}"
            )
        publish_report(self.bus, report, iteration)  # (refused whole, or published)

    @property
    def failures(self) -> dict[str, int]:
        """Observer failures so far, per plugin name."""
        calls = self.run.calls
        return {} if calls is None else dict(calls.failures)


def _warn_unhealthy(run_id: str, summary: Mapping[str, Any]) -> None:
    """Say on stderr (the log) which plugins and backends did not take every record."""
    for name, why in summary.get("plugins_left_out", {}).items():
        log.warning("run %r went without plugin %r: %s", run_id, name, why)
    for name, health in summary.get("backends", {}).items():
        missed = health["records"] - health["records_written"]
        if health["cut_off"] or (missed and not health["setup_error"]):
            log.warning(
                "run %r: backend %r missed %d of %d record(s)%s (summary.json: backends)",
                run_id,
                name,
                missed,
                health["records"],
                f"; cut off: {health['cut_off']}" if health["cut_off"] else "",
            )
