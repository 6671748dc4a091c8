"""``Run``: the observer runtime of one run, shared by a live session and a replay.

A run owns its plugin manager (fixed for the run), the hook calls and the dispatcher
(complete when built), the reporter, the observers' shared state (the run's timeline,
in :attr:`RunContext.stash`) and the outputs (``runs/<run_id>/``, the summary last).
:class:`~twinkle.run.RunSession` feeds it a live bus; :func:`~twinkle.run.replay` feeds
it a log. The lifecycle of the events is checked here, once, for both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast, final

import orjson
import pluggy

from twinkle.errors import ConfigError, PluginError, RecordError, TwinkleError, WriteError
from twinkle.events import Event, EventBus, RunFinished, RunStarted, read_back
from twinkle.hookspecs import RunContext
from twinkle.observers import ObserverConfig
from twinkle.plugins import Dispatcher, HookCalls, ObserverManager, merge_summary
from twinkle.reporting import Backend, MetricsReporter

__all__ = ["SUMMARY_FILE", "Run", "RunState", "check_config"]

SUMMARY_FILE = "summary.json"


class RunState(enum.Enum):
    """Where a run is: NEW → RUNNING → FINISHED; FAILED when starting failed or the run
    was closed without finishing."""

    NEW = "new"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


def check_config(config: Mapping[str, Any], pm: pluggy.PluginManager) -> dict[str, Any]:
    """The configuration as the event log will carry it (``read_back``: NaN and
    infinities as None), after refusing, before anything starts, one the log cannot hold
    or the built-in observers cannot use (:class:`~twinkle.errors.ConfigError` naming
    the key): what the live run's observers parse is what a replay parses."""
    try:
        logged = read_back(dict(config))
    except TypeError as exc:
        raise ConfigError(
            f"config must hold only JSON values with str keys and ints within 64 bits (it "
            f"travels in events.jsonl): {exc}"
        ) from None
    if any(type(p).__module__.startswith("twinkle.observers.") for p in pm.get_plugins()):
        ObserverConfig.parse(logged)
    return cast("dict[str, Any]", logged)


@final
class Run:
    """One run's observers and outputs. :meth:`start`, :meth:`submit` events (or
    :meth:`connect` a bus), then :meth:`finish` with the ``run_finished`` event.

    :param pm: a manager from :func:`~twinkle.plugins.make_plugin_manager`; its plugin
        set is fixed from :meth:`start` until the run is closed.
    :param context: the run's id, output directory (``None``: no files), configuration
        and whether the events come from a log.
    :param background: write records on a background thread.
    :param background_dispatch: run the observers on one dispatch thread instead of the
        publishing threads (:class:`~twinkle.plugins.Dispatcher`).
    """

    __slots__ = (
        "_background",
        "_background_dispatch",
        "_closed",
        "_receivers",
        "calls",
        "context",
        "dispatcher",
        "finished",
        "pm",
        "reporter",
        "started",
        "state",
    )

    def __init__(
        self,
        pm: pluggy.PluginManager,
        context: RunContext,
        *,
        background: bool,
        background_dispatch: bool = False,
    ) -> None:
        if not isinstance(pm, ObserverManager):
            raise PluginError(
                f"plugin_manager must come from twinkle.plugins.make_plugin_manager(), got "
                f"{type(pm).__qualname__}: twinkle's manager keeps the observers fixed while "
                "a run uses them; pass plugins=[(name, plugin)] to add your own"
            )
        logged = check_config(context.config, pm)
        self.pm = pm
        # Every observer configures from the config as the log carries it.
        self.context = dataclasses.replace(context, config=logged)
        self._background = background
        self._background_dispatch = background_dispatch
        self.state = RunState.NEW
        self.calls: HookCalls | None = None
        self.dispatcher: Dispatcher | None = None
        self.reporter: MetricsReporter | None = None
        self.started = False
        self.finished: RunFinished | None = None
        self._receivers: list[EventBus] = []
        self._closed = False

    @property
    def run_id(self) -> str:
        return self.context.run_id

    def start(self) -> None:
        """Fix the plugin set, configure the observers, open the reporter's backends."""
        if self.state is not RunState.NEW:
            raise TwinkleError(f"run {self.run_id!r} was already started ({self.state.value})")
        self.pm.acquire(self.run_id)
        self.state = RunState.RUNNING
        try:
            if self.context.out_dir is not None:
                self.context.out_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            self.calls = calls = HookCalls(self.pm)
            calls.configure(self.context)
            backends: list[Backend] = []
            for result in calls.call("twinkle_make_backends", context=self.context):
                backends.extend(result)
            self.reporter = MetricsReporter(
                backends, run_id=self.run_id, background=self._background
            )
            self.dispatcher = Dispatcher(
                calls, self.reporter.report, background=self._background_dispatch
            )
        except BaseException:
            self.state = RunState.FAILED
            self.close()
            raise

    def connect(self, bus: EventBus) -> None:
        """Receive every event ``bus`` publishes (the bus calls :meth:`submit` directly,
        before its signal's receivers)."""
        if self.dispatcher is None:
            raise TwinkleError(f"run {self.run_id!r} is not started")
        bus.bind(self.submit)
        self._receivers.append(bus)

    def submit(self, event: Event) -> None:
        """Dispatch ``event`` to the observers, after checking it fits the run: its
        ``run_id``, ``run_started`` once and first, ``run_finished`` once (events after
        it — published by an observer while the run finished — still go out)."""
        dispatcher = self.dispatcher
        if dispatcher is None or self.state is not RunState.RUNNING:
            raise TwinkleError(f"run {self.run_id!r} is not running ({self.state.value})")
        if event.run_id != self.context.run_id:
            raise RecordError(
                f"event {event.TYPE!r} belongs to run {event.run_id!r}, not {self.run_id!r}"
            )
        kind = type(event)
        if not self.started:
            if kind is not RunStarted:
                raise RecordError(
                    f"the first event of run {self.run_id!r} must be run_started, got "
                    f"{event.TYPE!r}"
                )
            self.started = True
        elif kind is RunStarted:
            raise RecordError(
                f"event run_started starts run {event.run_id!r} a second time; replay one "
                "run's log at a time"
            )
        elif kind is RunFinished:
            if self.finished is not None:
                raise RecordError(f"event run_finished finishes run {self.run_id!r} a second time")
            self.finished = cast(RunFinished, event)
        dispatcher.submit(event)

    def finish(self) -> dict[str, Any]:
        """Close the run (after ``run_finished`` was submitted), then write
        ``summary.json``: the observers' parts are taken while they still run, the
        failures once every output is closed (a sink failing to close its file is in the
        summary); the summary is written even when closing raised, then that error is."""
        try:
            if self.finished is None or self.calls is None:
                raise TwinkleError(f"run {self.run_id!r} has not seen run_finished")
            if self.dispatcher is not None:
                self.dispatcher.flush()  # every observer has seen run_finished
            summary = build_summary(self.finished, self.calls)
            self.state = RunState.FINISHED
        except BaseException:
            self.close()
            raise
        calls = self.calls
        try:
            self.close()
        finally:
            summary["observer_failures"] = dict(sorted(calls.failures.items()))
            out = self.context.out_dir
            if out is not None:
                write_summary(out / SUMMARY_FILE, summary)
        return summary

    def close(self) -> None:
        """Flush and close the reporter, let every plugin close its files, free the
        plugin manager; a run still running is FAILED (it never finished). Idempotent;
        raises the reporter's error after closing everything."""
        if self.state is RunState.RUNNING:
            self.state = RunState.FAILED
        for bus in self._receivers:
            bus.bind(None)
        self._receivers.clear()
        if self._closed or self.state is RunState.NEW:
            return  # closed already, or never started
        self._closed = True
        calls = self.calls
        try:
            try:
                if self.dispatcher is not None:
                    self.dispatcher.close()  # the observers see every event submitted
            finally:
                if self.reporter is not None:
                    self.reporter.close()
        finally:
            try:
                if calls is not None:
                    calls.call("twinkle_unconfigure", context=self.context)
            finally:
                self.pm.release()  # also when the start failed before configuring


def build_summary(event: RunFinished, calls: HookCalls) -> dict[str, Any]:
    """``summary.json``'s content: the run's frame and the observers' parts."""
    parts = calls.call_named("twinkle_summary", event=event)
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
    summary["observer_failures"] = dict(sorted(calls.failures.items()))
    return summary


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """Write ``summary.json`` (sorted keys, indented), whole or not at all."""
    data = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    _write_atomically(path, data + b"\n")


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
