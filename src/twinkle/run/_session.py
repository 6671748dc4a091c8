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
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pluggy

from twinkle.checks import run_id as check_run_id
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.events import EventBus, RunFinished, Status, validate_event
from twinkle.hookspecs import RunContext
from twinkle.perf import Clock, TimeRecorder, bind_process_recorder
from twinkle.perf.stats import memory_stats
from twinkle.plugins import Dispatcher, make_plugin_manager
from twinkle.reporting import MetricsReporter
from twinkle.run._run import Run, RunState

__all__ = ["RunSession", "new_run_id"]

OVERHEAD_SOURCE = "twinkle.observers"
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
    :param background_dispatch: run the observers on one dispatch thread, off the
        publishing threads (records and files are the same; see
        :class:`~twinkle.plugins.Dispatcher`).
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
    ) -> None:
        self.run_id = check_run_id(new_run_id(wall_clock()) if run_id is None else run_id)
        if config is not None and not isinstance(config, Mapping):
            raise InvalidArgumentError(
                f"config must be a mapping of the observers' definitions, got {config!r:.200}"
            )
        self.config: dict[str, Any] = dict(config or {})
        self.out_dir = None if out_dir is None else Path(out_dir) / self.run_id
        self.recorder = TimeRecorder(clock=clock, wall_clock=wall_clock)
        # twinkle's own time on the caller's threads: every publish, timed by the bus
        self._overhead = TimeRecorder(clock=clock, wall_clock=wall_clock)
        self.bus = EventBus(
            self.run_id, clock=clock, wall_clock=wall_clock, overhead=self._overhead
        )
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
        )
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
        """Configure the observers, open the outputs and publish ``run_started``."""
        if self.run.state is not RunState.NEW:
            raise TwinkleError(f"run {self.run_id!r} was already started")
        self.run.start()
        try:
            self.bus.attach(self.recorder, source="main")
            self.bus.attach(self._overhead, source=OVERHEAD_SOURCE)
            self.run.connect(self.bus)
            self.bus.run_started(self.config)
        except BaseException:
            self.run.close()  # FAILED: it never finished
            raise
        # Module-level twinkle.perf.span()/@timed, on any thread, record into this run.
        self._unbind = bind_process_recorder(self.recorder)
        # A caller that neither exits a ``with`` block nor calls finish() (an uncaught
        # exception outside one, sys.exit) still gets its summary, marked as an error.
        self._atexit = _finish_at_exit(self)
        return self

    def finish(
        self,
        *,
        status: Status = "ok",
        error: str | None = None,
        terminal_totals: Mapping[str, int | float] | None = None,
    ) -> dict[str, Any]:
        """Publish ``run_finished``, write ``summary.json`` and close every output."""
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
        try:
            self.bus.run_finished(
                status=status,
                error=error,
                terminal_totals=terminal_totals,
                records_dropped=reporter.stats.dropped,
                process_wall_ns=self._process_wall_ns(),
            )
        except BaseException:
            self.run.close()  # FAILED: it never finished
            raise
        self.summary = self.run.finish()
        return self.summary

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
        if exc is None:
            self.finish()
            return
        try:
            self.finish(status="error", error=f"{type(exc).__qualname__}: {exc}")
        except Exception:
            # The caller's exception is the one to see; this one is logged.
            log.exception("run %r: finishing after %s failed", self.run_id, type(exc).__name__)

    # -- conveniences -----------------------------------------------------------------

    def read_memory(self, *, iteration: int | None, device: str | None = None) -> None:
        """Read this process's memory (:func:`~twinkle.perf.stats.memory_stats`) and
        publish it; other workers' readings go through ``bus.memory``."""
        with self.bus.own_work("memory"):
            reading = memory_stats(device=device)
        self.bus.memory([reading], iteration=iteration)

    @property
    def failures(self) -> dict[str, int]:
        """Observer failures so far, per plugin name."""
        calls = self.run.calls
        return {} if calls is None else dict(calls.failures)


def _finish_at_exit(session: RunSession) -> Callable[[], None]:
    ref = weakref.ref(session)

    def finish() -> None:
        run = ref()
        if run is None or run.state is not RunState.RUNNING:
            return
        try:
            run.finish(status="error", error="the process exited without finishing the run")
        except Exception:
            log.exception("run %r: finishing at interpreter exit failed", run.run_id)

    atexit.register(finish)
    return finish
