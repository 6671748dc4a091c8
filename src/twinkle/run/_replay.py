"""Replay: feed a run's ``events.jsonl`` through the observers again.

The observers are deterministic functions of the events, so replaying a log with the
same plugins reproduces ``metrics_raw.jsonl``, ``metrics.jsonl`` and ``summary.json``
byte for byte. Nothing new is timed during a replay.

A replay writes into a fresh hidden sibling of its output directory and moves the files
into place only when it succeeded: a failed or interrupted replay leaves nothing behind,
and what an output directory held before is replaced only with ``force=True``.

The event log's lines carry ``seq`` (0, 1, 2, ... per file); a line whose ``seq`` is not
its place in the file (a duplicated, reordered or missing line) is refused, naming it,
rather than replayed into wrong figures. A log of an older twinkle, without ``seq``,
replays as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pluggy

from twinkle.checks import run_id as check_run_id
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    RecordError,
    ReplayError,
    ReporterError,
    TwinkleError,
)
from twinkle.events import (
    Event,
    RunFinished,
    RunResumed,
    RunStarted,
    event_from_dict,
    read_back,
)
from twinkle.hookspecs import RunContext
from twinkle.observers import EVENTS_FILE
from twinkle.observers.sinks import SEQ_KEY
from twinkle.plugins import loaded_plugins, make_plugin_manager
from twinkle.reporting import read_jsonl, real_path
from twinkle.run._checkpoint import log_unlike_checkpoint
from twinkle.run._feed import FeedProgress, LogFeeder
from twinkle.run._log_lines import BAD_LINE_FIX, seq_problem
from twinkle.run._run import Run
from twinkle.run._staging import Staging

__all__ = ["ReplayResult", "iter_events", "replay"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did: the output directory, how many events, and the summary.

    ``torn_line`` is the line number of a torn last line that was passed over (what a
    crash in the middle of a write leaves), ``torn_bytes`` its length; None and 0 when
    the log ended cleanly. ``log`` is the log file replayed (None for event values);
    ``log_changed`` why it is not what the checkpoint beside it marks (cut or edited
    since the run wrote it: the figures are the log's as it is now), else None.
    ``plugins_recorded`` and ``plugins_now``: the observer plugins the run loaded (in
    any of its segments: its ``run_started`` and each ``run_resumed``; empty in logs from
    before they were recorded) and the ones this replay loaded; ``plugins_by_segment``
    each segment's set; :attr:`plugins_differ` when a segment's set is not this
    replay's (the records of the plugins in only one set differ too).
    """

    out_dir: Path | None
    events: int
    summary: dict[str, Any]
    torn_line: int | None = None
    torn_bytes: int = 0
    log: Path | None = None
    plugins_now: tuple[str, ...] = ()
    plugins_by_segment: tuple[tuple[str, ...], ...] = ()
    log_changed: str | None = None

    @property
    def plugins_recorded(self) -> tuple[str, ...]:
        """Every observer plugin the run loaded in any segment, sorted."""
        return tuple(sorted({name for plugins in self.plugins_by_segment for name in plugins}))

    @property
    def plugins_differ(self) -> bool:
        """Whether this replay loaded other observer plugins than the run did in any
        segment (only said of the segments that recorded their set)."""
        return any(plugins and plugins != self.plugins_now for plugins in self.plugins_by_segment)


_NOTHING: Final = object()


class _EventLog(Iterator[Event]):
    """The events of one log file; notes a torn last line instead of failing on it, and
    checks each line's ``seq`` against its place in the file: as it reads the line, or,
    with ``defer_seq``, when :meth:`check_seq` is called (a replay calls it once the
    run accepted the event, so that what is wrong with an event itself, a second
    ``run_started`` say, is said first)."""

    def __init__(
        self,
        path: Path,
        *,
        defer_seq: bool = False,
        after: tuple[int, int] | None = None,
        warn_torn: bool = True,
    ) -> None:
        self.path = path
        offset, events = after or (0, 0)
        # (after a checkpoint: its lines are numbered as its events, seq'd by the writer)
        start = (offset, events)
        self._reader = read_jsonl(path, allow_torn_tail=True, start=start, warn_torn=warn_torn)
        self._defer_seq = defer_seq
        self._seq: object = _NOTHING  # the seq of the line read last, until checked
        self._seq_line = 0
        self._count = events  # events checked so far: the next line's seq
        # line number of the first line with a seq
        self._numbered_at: int | None = 1 if after else None

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

    @property
    def offset(self) -> int:
        """Bytes of the log read up to the end of the event returned last."""
        return self._reader.offset

    def __iter__(self) -> _EventLog:
        return self

    def __next__(self) -> Event:
        try:
            data = next(self._reader)
        except RecordError as exc:
            # A bad line before the end is corruption, not a crash: never skipped.
            lineno, why = self._reader.error or (self._reader.lineno, str(exc))
            raise ReplayError(
                f"{self.path}:{lineno}: {why}; {self._not_an_event_log()}a bad line (other "
                f"than a torn last line) is corruption, never skipped: {BAD_LINE_FIX}"
            ) from exc
        except ReporterError as exc:
            raise ReplayError(f"cannot read the event log: {exc}") from exc
        except MemoryError:
            # A reader that bounds its lines never gets here; this one ran out reading.
            raise ReplayError(
                f"{self.path}:{self._reader.lineno + 1}: the line after line "
                f"{self._reader.lineno} is too long to read into memory: it is not a line "
                "twinkle wrote; restore the original log"
            ) from None
        self._seq, self._seq_line = data.pop(SEQ_KEY, None), self._reader.lineno
        if not self._defer_seq:
            self.check_seq()
        try:
            return event_from_dict(data)
        except RecordError as exc:
            raise ReplayError(
                f"{self.path}:{self._reader.lineno}: {exc}; {self._not_an_event_log()}"
                f"{BAD_LINE_FIX}"
            ) from exc

    def _not_an_event_log(self) -> str:
        """What to say when the file's first line is no event: it may be another file."""
        if self._count or self._reader.lineno > 1:
            return ""
        return (
            f"{self.path.name} does not begin with a twinkle event: if it is not a run's "
            "event log, give the run's directory (runs/<run_id>) or its events.jsonl; if "
            "it is, "
        )

    def check_seq(self) -> None:
        """Check the ``seq`` of the line read last (once): it must be the line's 0-based
        place among the file's events, and every line after the first that has one must
        have one (an older twinkle wrote none)."""
        seq, lineno, expected = self._seq, self._seq_line, self._count
        if seq is _NOTHING:
            return
        self._seq = _NOTHING
        self._count += 1
        if seq is None:
            if self._numbered_at is not None:
                raise ReplayError(
                    f"{self.path}:{lineno}: the line has no {SEQ_KEY!r} although the lines "
                    f"from line {self._numbered_at} on have one: it was put in from another "
                    "log; restore the original file"
                )
            return
        if self._numbered_at is None:
            self._numbered_at = lineno
        if type(seq) is not int or seq != expected:
            why = seq_problem(seq, expected, after_numbered=self._numbered_at < lineno)
            raise ReplayError(f"{self.path}:{lineno}: {why}")


def _log_path(events: str | os.PathLike[str]) -> Path:
    """The log file of ``events``: the path itself, or ``events.jsonl`` in a run directory."""
    path = Path(events)
    if path.is_dir():
        log = path / EVENTS_FILE
        if not log.is_file():
            raise ReplayError(
                f"run directory {str(path)!r} holds no {EVENTS_FILE}: give a run's "
                f"directory (runs/<run_id>) or its {EVENTS_FILE}"
            )
        return log
    if not path.is_file():
        raise ReplayError(
            f"{str(path)!r} does not exist or is not a file: give a run's directory "
            f"(runs/<run_id>) or its {EVENTS_FILE}"
        )
    return path


def iter_events(
    path: str | os.PathLike[str],
    *,
    after: tuple[int, int] | None = None,
    warn_torn: bool = True,
) -> Iterator[Event]:
    """The events of a log (a path to ``events.jsonl`` or its run directory), in order; a
    malformed line, or one whose ``seq`` is not its place in the file, raises
    :class:`ReplayError` naming the file and line number. A torn last line (no newline,
    not a JSON object: a crash stopped its write) is passed over and logged (not logged
    with ``warn_torn=False``: a resume, whose event log moves it aside and says so); see
    :func:`replay`. ``after`` = (byte offset, events before it): only the events from
    that line on (a checkpoint's tail)."""
    return _EventLog(_log_path(path), after=after, warn_torn=warn_torn)


def started_config(path: str | os.PathLike[str]) -> Mapping[str, Any] | None:
    """The configuration the run whose log is at ``path`` (``events.jsonl`` or its run
    directory) began with, as its ``run_started`` carries it; None when there is no log
    or its first line is no ``run_started`` (a resume of it says what is wrong)."""
    with contextlib.suppress(TwinkleError):  # (no log there, or not one to read)
        for event in iter_events(path):
            return read_back(event.config) if isinstance(event, RunStarted) else None
    return None


def replay(
    events: str | os.PathLike[str] | Iterable[Event],
    out_dir: str | os.PathLike[str] | None,
    *,
    plugin_manager: pluggy.PluginManager | None = None,
    autoload: bool | None = None,
    builtins: bool = True,
    blocked: Iterable[str] = (),
    plugins: Iterable[tuple[str, object]] = (),
    force: bool = False,
) -> ReplayResult:
    """Replay ``events`` (a log path, its run directory, or event values) into ``out_dir``.

    The outputs land directly in ``out_dir`` (not in a ``<run_id>`` subfolder); it must
    not be the directory the log lives in, and must be new or empty unless ``force`` (then
    its files of the names the replay writes are replaced, others kept). They are written
    into a hidden sibling directory first and moved into ``out_dir`` only once the replay
    succeeded: on any error (or Ctrl-C) nothing is left behind. The log must start with
    ``run_started``; a log that ends without ``run_finished`` (a crashed run) is closed
    with an ``error`` status at its last event's time. The observers are configured with
    the newest segment's configuration (the last ``run_resumed``'s, else
    ``run_started``'s), as the live session that wrote it was. A torn last line (a crash in the
    middle of its write) is passed over, logged and reported
    (:attr:`ReplayResult.torn_line`, and in the summary's ``error``); a malformed line
    anywhere else, or one whose ``seq`` is out of place, raises :class:`ReplayError`
    naming it.
    """
    if not isinstance(force, bool):
        raise InvalidArgumentError(f"replay: force must be True or False, got {force!r}")
    stream, log, latest = _source(events)
    target = None if out_dir is None else Path(out_dir)
    if target is not None and log is not None and real_path(target) == real_path(log.path).parent:
        raise ReplayError(
            f"replay output {str(target)!r} is the log's own directory; its files would "
            "be appended to: choose another --out directory"
        )
    iterator = iter(stream)
    first = _first_event(iterator, log)
    pm = plugin_manager or make_plugin_manager(
        autoload=autoload, builtins=builtins, blocked=blocked, plugins=plugins
    )
    source = None if log is None else log.path
    staging = None if target is None else Staging(target, force=force, log=source)
    try:
        count, summary, segments = _feed(pm, first, iterator, log, staging, latest=latest)
    except BaseException:
        if staging is not None:
            staging.discard()
        raise
    if staging is not None:
        staging.commit()
    torn = None if log is None else log.torn_line
    return ReplayResult(
        target, count, summary, torn, 0 if log is None or torn is None else log.torn_bytes,
        None if log is None else log.path, plugins_now=loaded_plugins(pm),
        plugins_by_segment=segments,
        log_changed=_changed(log),
    )  # fmt: skip


def _source(
    events: str | os.PathLike[str] | Iterable[Event],
) -> tuple[Iterable[Event], _EventLog | None, Mapping[str, Any] | None]:
    """The events to replay, the log they are read from (None for event values) and
    the newest segment's configuration (needed before the first event is fed)."""
    if isinstance(events, str | os.PathLike):
        log_path = _log_path(events)
        log = _EventLog(log_path, defer_seq=True)
        return log, log, _latest_logged_config(log_path)
    stream = list(events)  # (read whole: the newest segment's configuration is needed first)
    return stream, None, _latest_config(stream)


def _first_event(iterator: Iterator[Event], log: _EventLog | None) -> RunStarted:
    """The log's first event, a ``run_started`` with a valid run id (else ReplayError);
    the log's sequence numbers checked from then on."""
    first = next(iterator, None)
    if not isinstance(first, RunStarted):
        torn = "" if log is None or log.torn_line is None else " (its only line is torn)"
        where = "the event log" if log is None else str(log.path)
        got = "no event" if first is None else f"{first.TYPE!r}"
        why = (
            ": a run killed as it started wrote none, and there is nothing to replay"
            if first is None
            else ""
        )
        raise ReplayError(f"{where} must start with a run_started event, got {got}{torn}{why}")
    try:
        check_run_id(first.run_id)
    except InvalidArgumentError as exc:
        raise ReplayError(f"the log's run_started event: {exc}") from exc
    if log is not None:
        log.check_seq()
    return first


def _feed(
    pm: pluggy.PluginManager,
    first: RunStarted,
    iterator: Iterator[Event],
    log: _EventLog | None,
    staging: Staging | None,
    *,
    latest: Mapping[str, Any] | None,
) -> tuple[int, dict[str, Any], tuple[tuple[str, ...], ...]]:
    """Run the observers over the events, configured with ``latest`` (the last
    ``run_resumed``'s configuration, None: the run never resumed, ``first``'s);
    returns how many, the summary and each segment's observer plugins."""
    out = None if staging is None else staging.dir
    config = first.config if latest is None else latest
    context = RunContext(first.run_id, out, dict(config), replay=True)
    try:
        run = Run(pm, context, background=False)
    except ConfigError as exc:
        which = "run_started" if latest is None else "last run_resumed"
        raise ReplayError(f"the log's {which} event: {exc}") from exc
    run.start()
    feeder = LogFeeder(run)
    segments = [first.plugins]

    fed: list[Event] = [first]  # (the newest event handed to the run)

    def events() -> Iterator[Event]:
        for event in _chain(first, iterator):
            if isinstance(event, RunResumed):
                segments.append(event.plugins)
            fed[-1] = event
            yield event

    try:
        try:
            progress = None
            if log is not None:
                what = f"replay of run {first.run_id!r} ({log.path})"
                progress = FeedProgress(what, log, log.path.stat().st_size)
            feeder.feed(
                events(),
                after_each=None if log is None else log.check_seq,
                progress=progress,
            )
        except RecordError as exc:
            raise _refused(exc, fed[-1], log, feeder.count) from exc
        last = feeder.last or first
        feeder.close_unfinished(_unfinished(log), ns=last.monotonic_ns, wall_ns=last.wall_ns)
    except BaseException:
        run.close()
        raise
    return feeder.count, run.finish(), tuple(segments)


def _refused(exc: RecordError, event: Event, log: _EventLog | None, count: int) -> ReplayError:
    """The run's refusal of ``event`` (the ``count``-th fed, 0-based), named by its line;
    as a duplicated or moved line when it is one (the likelier cause), unless it starts
    or ends a segment (a log put after another is said as such)."""
    if log is None:
        return ReplayError(f"event {count + 1}: {exc}")
    if not isinstance(event, RunStarted | RunResumed | RunFinished):
        log.check_seq()  # (raises when the line's seq is not its place)
    return ReplayError(f"{log.path}:{log.lineno}: {exc}")


def _changed(log: _EventLog | None) -> str | None:
    """Why the replayed log is not what the checkpoint of its run directory marks (None:
    it is, or it is no run directory's log: another file's name, event values)."""
    if log is None or log.path.name != EVENTS_FILE:
        return None
    return log_unlike_checkpoint(log.path.parent)


def _unfinished(log: _EventLog | None) -> str:
    """The error of a replayed run whose log ends without ``run_finished``."""
    error = "event log ends without run_finished (the run did not finish)"
    if log is not None and log.torn_line is not None:
        error += (
            f"; its torn last line {log.torn_line} ({log.torn_bytes} byte(s), cut "
            "by a crash in the middle of a write) was passed over"
        )
    return error


def _latest_logged_config(path: Path) -> Mapping[str, Any] | None:
    """The configuration of the last ``run_resumed`` in the log at ``path`` (None: the
    run never resumed), read before the replay.

    A resumed live run configures its observers with the new segment's configuration
    and rebuilds every output of the run under it (a resume may change only
    ``total_steps`` and ``x_`` keys), so a replay configures them with the newest
    segment's too. Nothing is checked here: the replay names whatever is wrong."""
    found: Mapping[str, Any] | None = None
    try:
        for data in read_jsonl(path, on_error="skip"):
            config = data.get("config")
            if data.get("type") == RunResumed.TYPE and isinstance(config, dict):
                found = config
    except TwinkleError:
        return None  # (the replay reads the file again and says what is wrong)
    return found


def _latest_config(events: list[Event]) -> Mapping[str, Any] | None:
    """The configuration of the last ``run_resumed`` of ``events`` (None: none)."""
    for event in reversed(events):
        if isinstance(event, RunResumed):
            return event.config
    return None


def _chain(first: Event, rest: Iterator[Event]) -> Iterator[Event]:
    yield first
    yield from rest
