"""``RunSession``: one observed run — bus, recorder, observers, reporter and outputs.

The session is the caller's handle::

    with RunSession(out_dir="runs", config=config) as run:
        with run.recorder.span("generate", iteration=0):
            ...
        run.bus.samples(iteration=0, phase="rollout", lengths=lengths)

It writes ``runs/<run_id>/`` (SPEC §8): ``events.jsonl``, ``metrics_raw.jsonl``,
``metrics.jsonl``, ``summary.json`` and ``trace.json`` — through the observers, so that
:func:`twinkle.replay.replay` reproduces the records and the summary from the log.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import pluggy

from twinkle.errors import ConfigError, InvalidArgumentError, TwinkleError, WriteError
from twinkle.events import EventBus, RunFinished
from twinkle.hookspecs import RunContext
from twinkle.reporting import Backend, MetricsReporter
from twinkle.observers._config import ObserverConfig
from twinkle.perf import Clock, TimeRecorder, bind_process_recorder
from twinkle.perf.stats import memory_stats
from twinkle.plugins import Dispatcher, make_plugin_manager, merge_summary

__all__ = [
    "SUMMARY_FILE",
    "RunSession",
    "check_config",
    "check_name",
    "new_run_id",
    "write_summary",
]

SUMMARY_FILE = "summary.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
OVERHEAD_SOURCE = "twinkle.observers"
log = logging.getLogger("twinkle.session")


def check_name(value: object, what: str) -> str:
    """``value`` if it is a safe single path component, else a clear error.

    Run ids and output names become directory and file names: path separators, ``..``
    and leading dots would write outside the run directory.
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise InvalidArgumentError(
            f"{what} {value!r} is not a safe name: use 1-128 characters of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit, without '..' or path "
            "separators"
        )
    return value


def new_run_id(wall_ns: int) -> str:
    """A fresh run id: UTC time of the start plus the process id and a random suffix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(wall_ns / 1e9))
    return f"{stamp}-{os.getpid()}-{os.urandom(2).hex()}"


def write_summary(
    path: Path | None,
    event: RunFinished,
    dispatcher: Dispatcher,
) -> dict[str, Any]:
    """Build ``summary.json`` from the observers' parts and write it (when ``path``)."""
    parts = dispatcher.call_named("twinkle_summary", event=event)
    summary: dict[str, Any] = {
        "run_id": event.run_id,
        "status": event.status,
        "error": event.error,
        "records_dropped": event.records_dropped,
        "process_wall_seconds": (
            None if event.process_wall_ns is None else event.process_wall_ns / 1e9
        ),
        **merge_summary([(name, part) for name, part in parts if isinstance(part, dict)]),
    }
    summary["observer_failures"] = dict(sorted(dispatcher.failures.items()))
    if path is not None:
        data = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        _write_atomically(path, data + b"\n")
    return summary


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a crash never leaves half a summary); mode
    0644 less the umask, like every file twinkle creates."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(
            exc.errno,
            f"cannot write {str(path)!r}: {exc.strerror or exc}; free disk space "
            "or fix permissions (the summary can be rebuilt: twinkle replay events.jsonl)",
        ) from exc


class RunSession:
    """One observed run. Start it (or enter it), publish, then :meth:`finish` (or exit).

    :param out_dir: where ``<run_id>/`` is created; ``None`` writes no files.
    :param run_id: a safe name (default: time, pid and a random suffix).
    :param config: the observers' business definitions (see
        :class:`twinkle.observers.ObserverConfig`); plain JSON data.
    :param clock: the run's monotonic ns clock; ``wall_clock``: unix ns.
    :param plugin_manager: a ready manager; else one is built from ``autoload``,
        ``builtins``, ``blocked`` and ``plugins`` (see :func:`make_plugin_manager`).
    :param background_writer: write records on a background thread.
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
    ) -> None:
        self.run_id = check_name(new_run_id(wall_clock()) if run_id is None else run_id, "run_id")
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
        self.pm = plugin_manager or make_plugin_manager(
            autoload=autoload, builtins=builtins, blocked=blocked, plugins=plugins
        )
        self._background = background_writer
        check_config(self.config, self.pm)
        self.context = RunContext(self.run_id, self.out_dir, self.config, replay=False)
        self.reporter: MetricsReporter | None = None
        self.dispatcher: Dispatcher | None = None
        self.summary: dict[str, Any] | None = None
        self._atexit: Callable[[], None] | None = None
        self._state = "new"

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> RunSession:
        """Configure the observers, open the outputs and publish ``run_started``."""
        if self._state != "new":
            raise TwinkleError(f"run {self.run_id!r} was already started")
        self._state = "running"
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.reporter, self.dispatcher = open_observers(
            self.pm, self.context, background=self._background
        )
        try:
            self.bus.attach(self.recorder, source="main")
            self.bus.attach(self._overhead, source=OVERHEAD_SOURCE)
            self.dispatcher.connect(self.bus)
            self.bus.run_started(self.config)
        except BaseException:
            self._state = "failed"
            close_observers(self.reporter, self.dispatcher, self.context)
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
        status: str = "ok",
        error: str | None = None,
        terminal_totals: Mapping[str, int | float] | None = None,
    ) -> dict[str, Any]:
        """Publish ``run_finished``, write ``summary.json`` and close every output."""
        if self._state != "running" or self.reporter is None or self.dispatcher is None:
            raise TwinkleError(f"run {self.run_id!r} is not running (state: {self._state})")
        self._state = "finished"
        if self._unbind is not None:
            self._unbind()
            self._unbind = None
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None
        try:
            event = self.bus.run_finished(
                status=status,
                error=error,
                terminal_totals=terminal_totals,
                records_dropped=self.reporter.stats.dropped,
                process_wall_ns=self._process_wall_ns(),
            )
            path = None if self.out_dir is None else self.out_dir / SUMMARY_FILE
            self.summary = write_summary(path, event, self.dispatcher)
        finally:
            close_observers(self.reporter, self.dispatcher, self.context)
        return self.summary

    def _process_wall_ns(self) -> int | None:
        try:
            import psutil

            created_ns = int(psutil.Process().create_time() * 1e9)
        except Exception:  # pragma: no cover - psutil cannot read the process
            return None
        return max(0, self._wall_clock() - created_ns)

    def __enter__(self) -> RunSession:
        return self.start() if self._state == "new" else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state != "running":
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
        return {} if self.dispatcher is None else dict(self.dispatcher.failures)


def check_config(config: Mapping[str, Any], pm: pluggy.PluginManager) -> None:
    """Refuse, before anything starts, a configuration the built-in observers cannot use
    (:class:`~twinkle.errors.ConfigError` naming the key) or the log cannot hold."""
    if any(type(p).__module__.startswith("twinkle.observers.") for p in pm.get_plugins()):
        ObserverConfig.parse(config)
    try:
        orjson.dumps(config, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise ConfigError(
            f"config must hold only JSON values (it travels in events.jsonl): {exc}"
        ) from None


def _finish_at_exit(session: RunSession) -> Callable[[], None]:
    ref = weakref.ref(session)

    def finish() -> None:
        run = ref()
        if run is None or run._state != "running":
            return
        try:
            run.finish(status="error", error="the process exited without finishing the run")
        except Exception:
            log.exception("run %r: finishing at interpreter exit failed", run.run_id)

    atexit.register(finish)
    return finish


def open_observers(
    pm: pluggy.PluginManager,
    context: RunContext,
    *,
    background: bool,
) -> tuple[MetricsReporter, Dispatcher]:
    """Configure the plugins of ``pm`` for ``context``: the reporter and the dispatcher."""
    dispatcher = Dispatcher(pm)
    dispatcher.call("twinkle_configure", context=context)
    backends: list[Backend] = []
    for result in dispatcher.call("twinkle_make_backends", context=context):
        backends.extend(result)
    reporter = MetricsReporter(backends, run_id=context.run_id, background=background)
    dispatcher.report = reporter.report
    return reporter, dispatcher


def close_observers(reporter: MetricsReporter, dispatcher: Dispatcher, context: RunContext) -> None:
    """Flush and close the reporter, then let every plugin close its files."""
    try:
        reporter.close()
    finally:
        dispatcher.call("twinkle_unconfigure", context=context)
        dispatcher.disconnect()
