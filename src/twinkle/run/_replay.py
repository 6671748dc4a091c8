"""Replay: feed a run's ``events.jsonl`` through the observers again.

The observers are deterministic functions of the events, so replaying a log with the
same plugins reproduces ``metrics_raw.jsonl``, ``metrics.jsonl`` and ``summary.json``
byte for byte. Nothing new is timed during a replay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from twinkle.checks import run_id as check_run_id
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    RecordError,
    ReplayError,
    ReporterError,
)
from twinkle.events import Event, RunFinished, RunStarted, event_from_dict
from twinkle.hookspecs import RunContext
from twinkle.plugins import make_plugin_manager
from twinkle.reporting import read_jsonl
from twinkle.run._run import Run

__all__ = ["ReplayResult", "iter_events", "replay"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did: the output directory, how many events, and the summary.

    ``torn_line`` is the line number of a torn last line that was passed over (what a
    crash in the middle of a write leaves), ``torn_bytes`` its length; None and 0 when
    the log ended cleanly.
    """

    out_dir: Path | None
    events: int
    summary: dict[str, Any]
    torn_line: int | None = None
    torn_bytes: int = 0


class _EventLog(Iterator[Event]):
    """The events of one log file; notes a torn last line instead of failing on it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader = read_jsonl(path, allow_torn_tail=True)

    @property
    def torn_line(self) -> int | None:
        return self._reader.torn_line

    @property
    def torn_bytes(self) -> int:
        return self._reader.torn_bytes

    @property
    def lineno(self) -> int:
        """Line number of the event returned last."""
        return self._reader.lineno

    def __iter__(self) -> _EventLog:
        return self

    def __next__(self) -> Event:
        try:
            data = next(self._reader)
        except RecordError as exc:
            # A bad line before the end is corruption, not a crash: never skipped.
            lineno, why = self._reader.error or (self._reader.lineno, str(exc))
            raise ReplayError(
                f"{self.path}:{lineno}: {why}; a bad line before the end of the log is "
                "corruption, never skipped: fix or remove that line and replay again"
            ) from exc
        except ReporterError as exc:
            raise ReplayError(f"cannot read the event log: {exc}") from exc
        try:
            return event_from_dict(data)
        except RecordError as exc:
            raise ReplayError(f"{self.path}:{self._reader.lineno}: {exc}") from exc


def iter_events(path: str | os.PathLike[str]) -> Iterator[Event]:
    """The events of a log, in order; a malformed line raises :class:`ReplayError`
    naming the file and line number. A torn last line (no newline, not a JSON object:
    a crash stopped its write) is passed over and logged; see :func:`replay`."""
    p = Path(path)
    if not p.is_file():
        raise ReplayError(f"event log {str(p)!r} does not exist or is not a file")
    return _EventLog(p)


def replay(
    events: str | os.PathLike[str] | Iterable[Event],
    out_dir: str | os.PathLike[str] | None,
    *,
    plugin_manager: pluggy.PluginManager | None = None,
    autoload: bool | None = None,
    builtins: bool = True,
    blocked: Iterable[str] = (),
    plugins: Iterable[tuple[str, object]] = (),
) -> ReplayResult:
    """Replay ``events`` (a log path or event values) into ``out_dir``.

    The outputs land directly in ``out_dir`` (not in a ``<run_id>`` subfolder); it must
    not be the directory the log lives in. The log must start with ``run_started``; a
    log that ends without ``run_finished`` (a crashed run) is closed with an ``error``
    status at its last event's time. A torn last line (a crash in the middle of its
    write) is passed over, logged and reported (:attr:`ReplayResult.torn_line`, and in
    the summary's ``error``); a malformed line anywhere else raises
    :class:`ReplayError` naming it.
    """
    source_dir: Path | None = None
    log: _EventLog | None = None
    stream: Iterable[Event]
    if isinstance(events, str | os.PathLike):
        log_path = Path(events)
        if not log_path.is_file():
            raise ReplayError(f"event log {str(log_path)!r} does not exist or is not a file")
        source_dir = log_path.resolve().parent
        stream = log = _EventLog(log_path)
    else:
        stream = events
    target = None if out_dir is None else Path(out_dir)
    if target is not None:
        if source_dir is not None and target.resolve() == source_dir:
            raise ReplayError(
                f"replay output {str(target)!r} is the log's own directory; its files would "
                "be appended to: choose another --out directory"
            )
        if target.exists() and not target.is_dir():
            raise ReplayError(f"replay output {str(target)!r} exists and is not a directory")
    iterator = iter(stream)
    first = next(iterator, None)
    if not isinstance(first, RunStarted):
        torn = "" if log is None or log.torn_line is None else " (its only line is torn)"
        raise ReplayError(
            "the event log must start with a run_started event, got "
            f"{'nothing' if first is None else first.TYPE!r}{torn}"
        )
    try:
        check_run_id(first.run_id)
    except InvalidArgumentError as exc:
        raise ReplayError(f"the log's run_started event: {exc}") from exc
    pm = plugin_manager or make_plugin_manager(
        autoload=autoload, builtins=builtins, blocked=blocked, plugins=plugins
    )
    context = RunContext(first.run_id, target, dict(first.config), replay=True)
    try:
        run = Run(pm, context, background=False)
    except ConfigError as exc:
        raise ReplayError(f"the log's run_started event: {exc}") from exc
    run.start()
    count = 0
    last: Event = first
    try:
        for event in _chain(first, iterator):
            try:
                run.submit(event)
            except RecordError as exc:
                where = f"event {count + 1}" if log is None else f"{log.path}:{log.lineno}"
                raise ReplayError(f"{where}: {exc}") from exc
            count += 1
            last = event
        if run.finished is None:
            error = "event log ends without run_finished (the run did not finish)"
            if log is not None and log.torn_line is not None:
                error += (
                    f"; its torn last line {log.torn_line} ({log.torn_bytes} byte(s), cut "
                    "by a crash in the middle of a write) was passed over"
                )
            run.submit(
                RunFinished(
                    last.run_id, last.monotonic_ns, last.wall_ns, status="error", error=error
                )
            )
    except BaseException:
        run.close()
        raise
    summary = run.finish()
    if log is None or log.torn_line is None:
        return ReplayResult(target, count, summary)
    return ReplayResult(target, count, summary, log.torn_line, log.torn_bytes)


def _chain(first: Event, rest: Iterator[Event]) -> Iterator[Event]:
    yield first
    yield from rest
