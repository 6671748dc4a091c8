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

One live process writes a run directory at a time (:class:`~twinkle.locks.RunDirLock`).
A session on a directory that already holds a run's log — a restarted job, same run id
— *resumes* it: the earlier segments' events are fed to the observers again (so every
output covers the whole run), a segment that stopped without finishing is closed with
an error status, and ``run_resumed`` begins the new segment, on a clock that continues
the run's timeline (see :attr:`RunSession.resumed`). Its configuration may differ from
the run's only in ``total_steps`` and the caller's ``x_`` keys (``run_resumed`` carries
it, and the observers rebuild every output under it); any other change is refused
(:class:`~twinkle.errors.ResumeConfigError`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import pluggy

from twinkle.checks import caller_source
from twinkle.checks import run_id as check_run_id
from twinkle.errors import (
    ConfigError,
    FinishedRunError,
    InvalidArgumentError,
    ReporterError,
    ResumeConfigError,
    TwinkleError,
)
from twinkle.events import (
    OVERHEAD_SOURCE,
    EventBus,
    RunFinished,
    RunStarted,
    Status,
    read_back,
    validate_event,
)
from twinkle.hookspecs import RunContext
from twinkle.locks import RunDirLock
from twinkle.observers import ClockSkewTolerance, ObserverConfig, ScalarsObserver
from twinkle.observers.placement import LatestTime
from twinkle.observers.sinks import EVENTS_FILE
from twinkle.perf import Clock, ClockAnchor, TimeRecorder, WorkerReport, bind_process_recorder
from twinkle.perf.stats import MemoryReading, memory_stats
from twinkle.plugins import (
    DEFAULT_SLOW_CALL_S,
    Dispatcher,
    check_slow_call_s,
    loaded_plugins,
    make_plugin_manager,
)
from twinkle.reporting import DEFAULT_BACKEND_TIMEOUT_S, MetricsReporter, make_dirs, sync_dir
from twinkle.run._checkpoint import NO_CHECKPOINT, Checkpoint, observers_of
from twinkle.run._checkpoint import load as load_checkpoint
from twinkle.run._config import (
    RESUMABLE_CONFIG,
    check_config,
    describe_config_changes,
    refused_config_keys,
)
from twinkle.run._replay import iter_events
from twinkle.run._run import Run, RunState
from twinkle.run._scan import Scan, fixed_config, logged_events, note, scan_of
from twinkle.run._summary import SUMMARY_FILE

__all__ = ["Resumed", "RunSession", "new_run_id"]

log = logging.getLogger("twinkle.session")


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a resuming session found in its run directory's log.

    ``segment`` is the segment this session writes (1 for the first resume);
    ``events`` the events already logged; ``last_iteration`` and ``optimizer_steps``
    where the earlier segments stopped — a restarted trainer continues from
    :attr:`next_iteration` and step ``optimizer_steps + 1`` (iterations and steps only
    go forward); ``previous_status`` is the previous segment's status, None when it
    stopped without finishing (it is then closed with an ``error`` status);
    ``restored_events`` the first of ``events`` that the run's checkpoint stood for
    (the observers were fed only the rest).
    """

    segment: int
    events: int
    last_iteration: int | None
    optimizer_steps: int
    previous_status: Status | None
    #: the events whose effect came back from the run's checkpoint (not fed again)
    restored_events: int = 0

    @property
    def next_iteration(self) -> int:
        return 0 if self.last_iteration is None else self.last_iteration + 1


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
    :param background_dispatch: run the observers on one dispatch thread, off the
        publishing threads (records and files are the same; see
        :class:`~twinkle.plugins.Dispatcher`).
    :param slow_call_s: an observer call taking longer is logged and counted
        (``observer_slow_calls`` in the summary); None: calls are not timed.
    :param required_plugins: plugins the run must not go without: one that cannot set
        up fails :meth:`start`. Any other plugin that cannot set up is left out, named on
        stderr and in the summary (``plugins_left_out``), and the run goes on.
    :param backend_timeout_s: a plugin's record backend runs on a thread of its own; one
        call of it (open, write, flush, close) that takes longer cuts it off (the run's
        own files never wait for it; ``backends`` in the summary says what each did).
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
        background_dispatch: bool = False,
        slow_call_s: float | None = DEFAULT_SLOW_CALL_S,
        required_plugins: Iterable[str] = (),
        backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
        resume: bool | None = None,
    ) -> None:
        if resume is not None and not isinstance(resume, bool):
            raise InvalidArgumentError(
                f"resume must be True, False or None (continue only a run that did not "
                f"finish ok), got {resume!r:.100}"
            )
        self._resume_asked = resume
        if out_dir is not None and not isinstance(out_dir, str | os.PathLike):
            raise InvalidArgumentError(
                f"out_dir must be a directory path (str or os.PathLike) or None (no files), "
                f"got {out_dir!r:.100}"
            )
        for name, fn in (("clock", clock), ("wall_clock", wall_clock)):
            if not callable(fn):
                raise InvalidArgumentError(
                    f"{name} must be a zero-argument callable returning int nanoseconds, "
                    f"got {fn!r:.100}"
                )
        # Checked now, not when the run starts: a wrong option must not cost a run.
        _check_flags(
            background_writer=background_writer,
            background_dispatch=background_dispatch,
            builtins=builtins,
            autoload=autoload,
        )
        check_slow_call_s(slow_call_s)
        self.run_id = check_run_id(new_run_id(wall_clock()) if run_id is None else run_id)
        if config is not None and not isinstance(config, Mapping):
            raise InvalidArgumentError(
                f"config must be a mapping of the observers' definitions, got {config!r:.200}"
            )
        self.config: dict[str, Any] = dict(config or {})
        self.out_dir = None if out_dir is None else Path(out_dir) / self.run_id
        self._dir_lock = None if self.out_dir is None else RunDirLock(self.out_dir)
        self._created = False  # whether start() made the run directory
        #: set by start() when the run directory held a log: what it found there
        self.resumed: Resumed | None = None
        self._checkpoint: Checkpoint | None = None  # the one a resume starts from
        self._whole_log_why: str | None = None  # why a resume cannot start from one
        # A log already here is a run to resume: this session's clock continues its
        # timeline (decided now, as the recorders read the clock from the start).
        self._shift: list[int] | None = None
        origin = self._logged_origin()
        if origin is not None:
            clock, self._shift = _continuing(clock, wall_clock, origin)
        self._clock = clock
        self.recorder = TimeRecorder(clock=clock, wall_clock=wall_clock)
        # twinkle's own time on the caller's threads: every publish, timed by the bus
        self._overhead = TimeRecorder(clock=clock, wall_clock=wall_clock)
        self.bus = EventBus(
            self.run_id, clock=clock, wall_clock=wall_clock, overhead=self._overhead
        )
        self.bus.refuse(
            f"run {self.run_id!r} is not started: call start() (or enter `with "
            "RunSession(...)`) before publishing"
        )
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
        if any(isinstance(p, ScalarsObserver) for p in pm.get_plugins()):
            # A scalar's records take its name as their kind: never one of the built-ins'.
            kinds = ObserverConfig.parse(self.run.context.config).record_kinds()
            self.bus.reserve_scalar_names(kinds)
        self.summary: dict[str, Any] | None = None
        self._atexit: Callable[[], None] | None = None

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
        scan = self._take_directory()
        try:
            if scan is not None:
                self._check_resumable(scan)
                self.run.context = dataclasses.replace(
                    self.run.context,
                    resumed_events=scan.events,
                    segment=scan.segments,
                    checkpoint=self._checkpoint,
                )
                self.context = self.run.context
            self.run.start()
            self.bus.attach(self.recorder, source="main")
            self.bus.attach(self._overhead, source=OVERHEAD_SOURCE)
            if scan is None:
                self.run.connect(self.bus)
                self.bus.run_started(
                    self.config,
                    plugins=loaded_plugins(self.run.pm),
                    plugins_left_out=self._left_out(),
                )
            else:
                self._resume(scan)
            if self.run.dispatcher is not None:
                # (background dispatch) the event log has written the segment's first
                # event through before start() returns: a kill now leaves a log to resume
                self.run.dispatcher.flush()
            self.run.arm_checkpoints()  # (the logged events fed again: none in between)
        except BaseException:
            try:
                self.run.close()  # FAILED: it never finished
            finally:
                unused = self._remove_if_unused()  # (while the directory is still ours)
                self._release_directory()
                if unused and self.out_dir is not None:
                    with contextlib.suppress(OSError):  # another process took it since
                        self.out_dir.rmdir()
            raise
        # Module-level twinkle.perf.span()/@timed, on any thread, record into this run.
        self._unbind = bind_process_recorder(self.recorder)
        # A caller that neither exits a ``with`` block nor calls finish() (an uncaught
        # exception outside one, sys.exit) still gets its summary, marked as an error.
        self._atexit = _finish_at_exit(self)
        _track(self)
        return self

    # -- the run directory and resuming -------------------------------------------------

    def _logged_origin(self) -> ClockAnchor | None:
        """The anchor of the run this directory's log holds (None: no log, or one that
        does not start with this run's run_started — start() says what is wrong)."""
        if self.out_dir is None:
            return None
        log = self.out_dir / EVENTS_FILE
        if log.is_symlink() or not log.is_file():
            return None
        # The first event as the scan will read it (blank lines and recorded fragments
        # passed over), so both agree on whether there is a run to resume.
        try:
            first = next(iter_events(log), None)  # (the reader closes with its iterator)
        except TwinkleError:
            return None
        return first.anchor if isinstance(first, RunStarted) else None

    def _take_directory(self) -> Scan | None:
        """Create and lock the run directory; scan the log it holds (None: none)."""
        out, lock = self.out_dir, self._dir_lock
        if out is None or lock is None:
            return None
        self._created = not os.path.lexists(out)
        try:
            make_dirs(out)  # (0755 less the umask at every level)
        except OSError as exc:
            raise ReporterError(
                f"cannot create the run directory {str(out)!r}: {exc.strerror or exc}; "
                "out_dir must be a writable directory (not a file, not read-only)"
            ) from exc
        if out.is_symlink() or not out.is_dir():
            raise ReporterError(
                f"run directory {str(out)!r} is a symlink or not a directory: twinkle "
                "follows no link in a run directory; remove it or choose another run id"
            )
        lock.acquire(self.run_id)
        try:
            log = out / EVENTS_FILE
            if log.is_symlink() or not log.exists():
                return None  # (a symlink is refused by the event log's writer)
            if not log.is_file():
                raise ReporterError(
                    f"{str(log)!r} is not a file: the run's event log goes there; remove "
                    "what is in its place or choose another run id"
                )
            return None if log.stat().st_size == 0 else self._scan(log)
        except BaseException:
            lock.release()
            raise

    def _scan(self, log: Path) -> Scan | None:
        """Check the log through a run without observers (the lifecycle and order checks
        the resumed run will apply, so feeding it again cannot fail half-way): the events
        after the run's checkpoint when it has one this resume can use
        (:attr:`_checkpoint`), else all of them."""
        checker = Run(
            make_plugin_manager(autoload=False, builtins=False),
            RunContext(self.run_id, None, {}, replay=True),
            background=False,
        )
        checkpoint = self._checkpoint = self._usable_checkpoint(log.parent)
        scan: Scan | None = None
        checker.start()
        try:
            if checkpoint is not None:
                scan = scan_of(checkpoint, checker)
            for event in logged_events(log, checkpoint):
                if scan is None:
                    if not isinstance(event, RunStarted) or event.run_id != self.run_id:
                        raise ConfigError(
                            f"{str(log)!r} is not the log of run {self.run_id!r} (its first "
                            f"event is {event.TYPE!r} of run {event.run_id!r}): move it "
                            "away or choose another run id"
                        )
                    skew = ClockSkewTolerance.parse(event.config)
                    scan = Scan(event, latest=LatestTime(event.anchor, skew))
                    checker.context = dataclasses.replace(checker.context, config=event.config)
                checker.submit(event)
                note(scan, event)
        except TwinkleError as exc:
            raise ConfigError(
                f"cannot resume run {self.run_id!r} from {str(log)!r}: {exc}"
            ) from exc
        finally:
            checker.close()
        return scan

    def _usable_checkpoint(self, out: Path) -> Checkpoint | None:
        """The run's checkpoint when this resume can start from it, else None (why not is
        kept in :attr:`_whole_log_why`, logged once the resume goes on: the whole log is
        fed again, as without one)."""
        names = observers_of(self.run.pm)
        found: Checkpoint | str = (
            "an observer plugin that is not twinkle's is loaded (a plugin rebuilds its "
            "outputs from every event it sees)"
            if names is None
            else load_checkpoint(out, self.run_id, names)
        )
        if isinstance(found, Checkpoint) and fixed_config(found.segment_config()) != fixed_config(
            self.run.context.config
        ):
            found = (
                "this session's configuration differs from the one the checkpoint's "
                "segment ran with (every output is rebuilt under the new one)"
            )
        if isinstance(found, str):
            self._whole_log_why = found
            return None
        return found

    def _check_resumable(self, scan: Scan) -> None:
        self._check_resume_asked(scan)
        if self._shift is None:
            raise TwinkleError(
                f"run directory {str(self.out_dir)!r} got an event log after this session "
                "was made; make the session again to resume it"
            )
        self._check_resumed_config(scan.started)
        behind = scan.latest.ns - self._clock() + 1
        if behind > 0:  # the wall clock went back between the segments
            self._shift[0] += behind

    def _check_resume_asked(self, scan: Scan) -> None:
        """:class:`~twinkle.errors.FinishedRunError` when this session may not continue
        the run the directory holds (see ``resume`` in the class docstring)."""
        asked, finished = self._resume_asked, scan.finished
        if asked is True or (asked is None and (finished is None or finished.status != "ok")):
            return
        where = str(self.out_dir)
        if asked is False:
            problem = (
                f"run {self.run_id!r} already has a log in {where!r} ({scan.segments} "
                "segment(s)) and resume=False does not continue a run"
            )
        else:
            last = "none" if scan.last_iteration is None else str(scan.last_iteration)
            problem = (
                f"run {self.run_id!r} in {where!r} finished ok (segment {scan.segments - 1}, "
                f"last iteration {last}, {scan.optimizer_steps} optimizer step(s)); "
                "running it again would silently make one longer run of both"
            )
        raise FinishedRunError(
            problem,
            "pass RunSession(resume=True) to continue it (numbering on from "
            "session.resumed), or another run_id (or out_dir) for a new run",
            run_id=self.run_id,
        )

    def _check_resumed_config(self, started: RunStarted) -> None:
        """This session's configuration may differ from the run's only where a resume may
        change it (``total_steps``, ``x_`` keys: :func:`~twinkle.run.resumable_key`);
        else :class:`~twinkle.errors.ResumeConfigError` names the keys, both values and
        the fix (a caller that builds the configuration says its own: ``with_fix``)."""
        given = check_config(self.config, self.run.pm)
        logged = cast("dict[str, Any]", read_back(dict(started.config)))
        keys = refused_config_keys(logged, given)
        if not keys:
            return
        log_path = None if self.out_dir is None else str(self.out_dir / EVENTS_FILE)
        raise ResumeConfigError(
            f"run {self.run_id!r} cannot resume with this configuration: it differs from "
            f"the one the run was started with at {list(keys)} "
            f"({describe_config_changes(keys, logged, given)}), and a resumed run may "
            f"change only {RESUMABLE_CONFIG}",
            f"pass RunSession(config=...) the run's configuration (the config of the "
            f"run_started line of {log_path!r}), or start a new run with another run_id "
            "(or out_dir)",
            run_id=self.run_id,
            keys=keys,
            logged=logged,
            given=given,
        )

    def _resume(self, scan: Scan) -> None:
        """Feed the logged events to the observers again, close a segment that stopped
        without finishing, then begin the new segment."""
        out = self.out_dir
        assert out is not None
        # What observers publish while the logged events go by again is in the log
        # already (they published it the first time): the bus drops it until the run
        # goes on, and the event log skips exactly the events fed again.
        self.bus.bind(_logged_already)
        checkpoint = self._checkpoint
        why = self._whole_log_why
        if checkpoint is None and why is not None:
            level = logging.INFO if why == NO_CHECKPOINT else logging.WARNING
            log.log(level, "run %r resumes from its whole log: %s", self.run_id, why)
        try:
            count = 0 if checkpoint is None else checkpoint.events
            for event in logged_events(out / EVENTS_FILE, checkpoint):
                if count == scan.events:
                    break  # only what the scan checked
                self.run.submit(event)
                count += 1
            if self.run.dispatcher is not None:
                self.run.dispatcher.flush()  # (background dispatch: every one dispatched)
        finally:
            self.bus.bind(None)
        if count != scan.events:
            raise TwinkleError(
                f"{str(out / EVENTS_FILE)!r} changed while run {self.run_id!r} was resuming"
            )
        self.run.connect(self.bus)
        segment = scan.segments
        if scan.finished is None:
            self.run.submit(
                RunFinished(
                    self.run_id,
                    scan.latest.ns,
                    scan.latest.wall_ns,
                    status="error",
                    error=(
                        f"segment {segment - 1} stopped without finishing (its process "
                        "died or was killed); found when the run resumed"
                    ),
                )
            )
        self.resumed = Resumed(
            segment=segment,
            events=scan.events,
            last_iteration=scan.last_iteration,
            optimizer_steps=scan.optimizer_steps,
            previous_status=None if scan.finished is None else scan.finished.status,
            restored_events=0 if checkpoint is None else checkpoint.events,
        )
        self.bus.run_resumed(
            segment,
            self.config,
            plugins=loaded_plugins(self.run.pm),
            plugins_left_out=self._left_out(),
        )
        # The summary vouched for the segments before this one: until this one finishes
        # it describes no run there is (a new run has none either); replay rebuilds it.
        _remove_durably(out / SUMMARY_FILE)

    def _left_out(self) -> dict[str, str]:
        """The plugins the run went without because they could not set up, with why."""
        return {} if self.run.calls is None else dict(self.run.calls.left_out)

    def _remove_if_unused(self) -> bool:
        """After a failed start, while the directory is still ours: remove the empty
        files the start opened when that is all this session's new run directory holds;
        True when the directory is then to be removed too (once given up)."""
        out, lock = self.out_dir, self._dir_lock
        if out is None or lock is None or not self._created:
            return False
        try:
            entries = [e for e in out.iterdir() if e != lock.path]
            if not all(
                e.is_file() and not e.is_symlink() and not e.stat().st_size for e in entries
            ):
                return False
            for entry in entries:
                entry.unlink()
        except OSError:
            return False  # left as it is: nothing of a run is lost either way
        return True

    def _release_directory(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()

    def _own_process(self, doing: str) -> None:
        if os.getpid() != self._pid:
            raise TwinkleError(
                f"cannot {doing} run {self.run_id!r} in process {os.getpid()}: it belongs to "
                f"process {self._pid} (this is a forked child); start a RunSession of "
                "its own in the child"
            )

    def _forget_in_child(self) -> None:
        """After a fork, in the child: this copy never publishes to, finishes or writes
        the parent's run (the parent owns its files, threads and lock)."""
        self.bus.forget_in_child(
            f"run {self.run_id!r} belongs to process {self._pid}; this forked child "
            "cannot publish to it: start a RunSession of its own in the child"
        )
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None

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
        if self._unbind is not None:
            self._unbind()
            self._unbind = None
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None
        _live_sessions.discard(self)
        try:
            try:
                self.bus.run_finished(
                    status=status,
                    error=error,
                    terminal_totals=terminal_totals,
                    records_dropped=reporter.stats.dropped,
                    process_wall_ns=self._process_wall_ns(),
                    observer_slow_calls=self.run.calls.slow if self.run.calls else None,
                )
            except BaseException:
                self.run.close()  # FAILED: it never finished
                raise
            interrupted = self._close_backends()
            self.summary = self.run.finish()
            _warn_unhealthy(self.run_id, self.summary)
            if interrupted is not None:
                raise interrupted
        finally:
            self.bus.refuse(
                f"run {self.run_id!r} is over ({self.run.state.value}): publish before finish()"
            )
            self._release_directory()
        return self.summary

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
    ) -> None:
        """Read this process's memory (:func:`~twinkle.perf.stats.memory_stats`) and
        publish it, with ``others``: readings other workers shipped for the same
        iteration (one event, so the iteration's memory record reduces them all)."""
        with self.bus.own_work("memory"):
            reading = memory_stats(device=device)
        self.bus.memory([reading, *others], iteration=iteration)

    def receive(self, report: WorkerReport, *, iteration: int | None = None) -> None:
        """Publish what a worker process measured (its
        :class:`~twinkle.perf.WorkerReport`): its spans as a batch from source
        ``report.worker`` on its own clock anchor (counting the spans it dropped; the
        timeline checks that anchor against the report's send time and its arrival now,
        docs/scale-out.md), and its memory readings as taken during ``iteration`` (None:
        outside any, or not known; its spans are placed by their own times either way)."""
        if not isinstance(report, WorkerReport):
            raise InvalidArgumentError(
                f"receive() takes a twinkle.perf.WorkerReport (from WorkerRecorder.report() "
                f"in the worker), got {type(report).__name__}: {report!r:.100}"
            )
        caller_source(report.worker, "report.worker")  # before any of it is published
        self.bus.publish_spans(
            report.worker,
            report.anchor,
            report.spans,
            dropped=report.spans_dropped,
            sent_anchor=report.sent_anchor,
        )
        if report.readings:
            self.bus.memory(report.readings, iteration=iteration)

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


def _remove_durably(path: Path) -> None:
    """Remove ``path`` if it is there, and make the removal durable."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    sync_dir(path.parent)


def _check_flags(*, autoload: object, **flags: object) -> None:
    """Refuse a switch that is not True or False (``autoload``: or None): a truthy
    ``'no'`` would turn it on."""
    if autoload is not None and type(autoload) is not bool:
        raise InvalidArgumentError(
            f"autoload must be True, False or None (the environment decides), got {autoload!r:.100}"
        )
    for name, flag in flags.items():
        if type(flag) is not bool:
            raise InvalidArgumentError(f"{name} must be True or False, got {flag!r:.100}")


def _logged_already(event: Any) -> None:
    """The bus's receiver while a resumed run's logged events go by again."""
    log.debug("dropped %s published while resuming: the log holds it", event.TYPE)


def _continuing(clock: Clock, wall_clock: Clock, origin: ClockAnchor) -> tuple[Clock, list[int]]:
    """``clock`` moved onto the timeline ``origin`` anchors (through the wall clock), and
    the shift it adds (a one-item list: start() pushes it on when the wall clock went
    back since the log's last event)."""
    shift = [origin.monotonic_ns + (wall_clock() - origin.wall_ns) - clock()]

    def continuing() -> int:
        return clock() + shift[0]

    return continuing, shift


_live_sessions: weakref.WeakSet[RunSession] = weakref.WeakSet()
_fork_hook: list[bool] = []  # installed with the first session started, never at import


def _track(session: RunSession) -> None:
    if not _fork_hook:
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_sessions_after_fork_in_child)
    _live_sessions.add(session)


def _sessions_after_fork_in_child() -> None:
    for session in list(_live_sessions):
        session._forget_in_child()
    _live_sessions.clear()


def _finish_at_exit(session: RunSession) -> Callable[[], None]:
    ref = weakref.ref(session)

    def finish() -> None:
        run = ref()
        if run is None or run.state is not RunState.RUNNING or os.getpid() != run._pid:
            return
        try:
            run.finish(status="error", error="the process exited without finishing the run")
        except Exception:
            log.exception("run %r: finishing at interpreter exit failed", run.run_id)

    atexit.register(finish)
    return finish
