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

from twinkle.errors import RecordError, ReplayError
from twinkle.events import Event, RunFinished, RunStarted, event_from_dict
from twinkle.hookspecs import RunContext
from twinkle.metric.reporting import read_jsonl
from twinkle.plugins import make_plugin_manager
from twinkle.session import (
    SUMMARY_FILE,
    check_name,
    close_observers,
    open_observers,
    write_summary,
)

__all__ = ["ReplayResult", "iter_events", "replay"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did: the output directory, how many events, and the summary."""

    out_dir: Path | None
    events: int
    summary: dict[str, Any]


def iter_events(path: str | os.PathLike[str]) -> Iterator[Event]:
    """The events of a log, in order; a malformed line raises :class:`ReplayError`
    naming the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise ReplayError(f"event log {str(p)!r} does not exist or is not a file")
    try:
        for lineno, data in enumerate(read_jsonl(p), start=1):
            try:
                yield event_from_dict(data)
            except RecordError as exc:
                raise ReplayError(f"{p}:{lineno}: {exc}") from exc
    except RecordError as exc:
        raise ReplayError(f"{p}: {exc}") from exc


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
    status at its last event's time.
    """
    source_dir: Path | None = None
    if isinstance(events, str | os.PathLike):
        source_dir = Path(events).resolve().parent
        stream: Iterable[Event] = iter_events(events)
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
        raise ReplayError(
            "the event log must start with a run_started event, got "
            f"{'nothing' if first is None else first.TYPE!r}"
        )
    check_name(first.run_id, "run_id")
    if target is not None:
        target.mkdir(parents=True, exist_ok=True, mode=0o755)
    pm = plugin_manager or make_plugin_manager(
        autoload=autoload, builtins=builtins, blocked=blocked, plugins=plugins
    )
    context = RunContext(first.run_id, target, dict(first.config), replay=True)
    reporter, dispatcher = open_observers(pm, context, background=False, overhead=None)
    count = 0
    last: Event = first
    try:
        for event in _chain(first, iterator):
            if count and isinstance(event, RunStarted):
                raise ReplayError(
                    f"event {count + 1} starts a second run ({event.run_id!r}); replay one "
                    "run's log at a time"
                )
            if event.run_id != first.run_id:
                raise ReplayError(
                    f"event {count + 1} belongs to run {event.run_id!r}, not {first.run_id!r}"
                )
            dispatcher.submit(event)
            count += 1
            last = event
            if isinstance(event, RunFinished):
                break
        if not isinstance(last, RunFinished):
            last = RunFinished(
                last.run_id,
                last.monotonic_ns,
                last.wall_ns,
                status="error",
                error="event log ends without run_finished (the run did not finish)",
            )
            dispatcher.submit(last)
        path = None if target is None else target / SUMMARY_FILE
        summary = write_summary(path, last, dispatcher)
    finally:
        close_observers(reporter, dispatcher, context)
    return ReplayResult(target, count, summary)


def _chain(first: Event, rest: Iterator[Event]) -> Iterator[Event]:
    yield first
    yield from rest
