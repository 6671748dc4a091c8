"""Following a run while another process writes it: :class:`Follower` reads the growing
``events.jsonl`` incrementally through the run's own observers, and
:meth:`Follower.snapshot` gives the figures so far (docs/metrics.md, "A run in
progress").

The log is the source of truth: nothing is locked and nothing is written into the run
directory. Only complete lines are read (a line still being written, or torn by a
crash, waits until its newline arrives). The observers run in this process, with the
run's configuration; a resumed segment whose configuration differs (``total_steps``,
``x_`` keys) starts them again from the first line with the new one, as a resumed
session does. They start from the run's checkpoint when it can serve (as a resume's
does: the same twinkle, observers all twinkle's own, the files as it marks them): only
the log after it is read, and the records before it are the ``metrics_raw.jsonl``
lines it covers, so following a run of days starts in seconds. A snapshot copies
their state (as a checkpoint does), closes the copy at the last event read and takes
its summary and its last records: the running observers go on from where they were.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from twinkle.errors import RecordError, ReplayError, TwinkleError
from twinkle.events import Event, RunFinished, RunResumed, RunStarted, event_from_dict
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.locks import RUN_LOCK_FILE
from twinkle.observers import EVENTS_FILE
from twinkle.observers.sinks import SEQ_KEY
from twinkle.plugins import make_plugin_manager
from twinkle.reporting import (
    MAX_LINE_BYTES,
    MetricRecord,
    check_record_line,
    line_ending_at,
    open_regular,
    record_to_dict,
)
from twinkle.run._checkpoint import Checkpoint, FileMark, load
from twinkle.run._log_lines import BAD_LINE_FIX, seq_problem
from twinkle.run._observer_state import observers_of, snapshot_observers
from twinkle.run._run import Run

__all__ = ["Follower", "Snapshot", "Writer", "writer_of"]

#: the built-in sinks: a follower writes no file
_SINKS = ("events", "metrics_raw", "webui", "trace")
#: the most bytes read per poll (a long log is taken in several polls)
_READ_BYTES = 16 << 20
#: the record file whose lines a checkpoint covers are the records before it
_RECORDS_FILE = "metrics_raw.jsonl"


@dataclass(frozen=True, slots=True)
class Writer:
    """Who writes the run directory, as its lock file says: ``pid`` on ``host``;
    ``alive`` is None when the host is another one (this process cannot tell)."""

    pid: int | None
    host: str | None
    alive: bool | None

    def describe(self) -> str:
        where = f"pid {self.pid} on {self.host}"
        if self.alive is None:
            return f"{where} (another host: its process cannot be checked from here)"
        return where if self.alive else f"{where}, which is gone"


#: the most bytes of a lock file read (twinkle's hold a pid, a host and a time: ~80 B)
_LOCK_BYTES = 4096


def writer_of(run_dir: Path) -> Writer | None:
    """The process holding ``run_dir``, from its lock file (read, never locked); None
    when no process holds it (the file is removed as its writer lets go) or the file is
    not one twinkle writes (not a small regular file holding a JSON object)."""
    try:
        with open_regular(run_dir / RUN_LOCK_FILE) as f:
            data = orjson.loads(f.read(_LOCK_BYTES + 1) or b"{}")
    except (OSError, orjson.JSONDecodeError):  # (longer than _LOCK_BYTES: cut, not JSON)
        return None
    if not isinstance(data, dict):
        return None
    pid, host = data.get("pid"), data.get("hostname")
    if pid is None:  # (empty: a process is taking the lock, its line not yet written)
        return Writer(None, host if isinstance(host, str) else None, None)
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if host != socket.gethostname():
        return Writer(pid, host, None)
    since = data.get("since_unix_ns")
    return Writer(pid, host, _running(pid, since if isinstance(since, int) else None))


def _running(pid: int, since_ns: int | None) -> bool:
    """Whether process ``pid`` runs here and is the one that took the lock at
    ``since_ns`` (not a later process given the same pid, not a zombie)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process.create_time()
    except psutil.AccessDenied:  # (another user's: it runs)
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return since_ns is None or started <= since_ns / 1e9 + 1.0


class _Records:
    """The records the observers make, as ``metrics_raw.jsonl`` holds them: each
    ``seq`` its place in the file, the first ``start`` (the records before these: the
    ones a checkpoint covers, or a snapshot's before its close)."""

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.records: list[dict[str, Any]] = []

    @hookimpl
    def twinkle_record(self, record: MetricRecord) -> None:
        line = orjson.loads(orjson.dumps(record_to_dict(record)))
        line[SEQ_KEY] = self.start + len(self.records)  # (a follower's reporter: from 0)
        self.records.append(line)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The run as its log stood: ``events`` read, the summary the run would have had it
    finished at the last of them (``summary``; its ``status`` is the log's when it
    finished, else ``"in progress"``), every record so far (the finalised iterations',
    then those the close made), and ``finished``: the log ends with ``run_finished``;
    ``whole_log_why``: the follower's (why it read the whole log, not from the run's
    checkpoint; None when it started from the checkpoint or was not to try)."""

    events: int
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(repr=False)
    finished: bool
    first: RunStarted = field(repr=False)
    whole_log_why: str | None = None


class Follower:
    """Reads ``events.jsonl`` of ``run_dir`` as it grows (:meth:`poll`) and gives the
    figures so far (:meth:`snapshot`)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, from_checkpoint: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / EVENTS_FILE
        if self.run_dir.is_file():
            raise ReplayError(
                f"{str(self.run_dir)!r} is a file: give its run's directory (runs/<run_id>), "
                f"the one holding {EVENTS_FILE}"
            )
        if not self.path.is_file():
            if os.path.lexists(self.path):
                raise ReplayError(
                    f"{str(self.path)!r} is not a regular file ({_kind(self.path)}): a run's "
                    f"log is one; give the directory of a run twinkle writes"
                )
            raise ReplayError(
                f"{str(self.run_dir)!r} holds no {EVENTS_FILE} (yet): give a run's directory "
                "(runs/<run_id>), once its run has started"
            )
        self._reset()
        #: why the observers did not start from the run's checkpoint (None: they did,
        #: or none was tried)
        self.whole_log_why: str | None = None
        if from_checkpoint:
            self.whole_log_why = self._from_checkpoint()

    def _reset(self, config: Mapping[str, Any] | None = None, at: int = -1) -> None:
        """Read the log from its first line, the observers configured with ``config``
        (None: its first event's), the one of its event number ``at`` (a resumed
        segment's: no event up to it starts them again)."""
        self._offset = 0
        self.events = 0
        self._configured_at = at
        self.first: RunStarted | None = None
        self.last: Event | None = None
        self._config = config
        self._run: Run | None = None
        self._records = _Records()

    def _from_checkpoint(self) -> str | None:
        """Start the observers from the run's checkpoint, the log's offset, events and
        records where it stands; else (the whole log to be read) why not."""
        try:
            first = self._first_event()
        except ReplayError as exc:  # (the log read from its first line says it again)
            return str(exc)
        if first is None:
            return "the log holds no complete line yet"
        names = observers_of(make_plugin_manager(autoload=False))
        found = load(self.run_dir, first.run_id, names or [])
        if isinstance(found, str):
            return found
        log = found.files[EVENTS_FILE]
        try:
            records = _covered_records(self.run_dir, found.files[_RECORDS_FILE])
            line = line_ending_at(self.path, log.size, MAX_LINE_BYTES)
            if line is None:
                raise ReplayError(f"its last event's line is longer than {MAX_LINE_BYTES} bytes")
            last = self._decode(line, found.events - 1)
        except (OSError, RecordError, ReplayError, orjson.JSONDecodeError) as exc:
            return f"the files it marks changed since ({exc})"
        state = found.state()
        held = dataclasses.replace(
            found,
            files={},
            observers=[n for n in found.observers if n not in _SINKS],
            payload=b"",
            _state={
                **state,
                "observers": {n: v for n, v in state["observers"].items() if n not in _SINKS},
            },
        )  # (the follower writes no file: no sink of its own)
        self.first, self.last = first, last
        self._config = found.segment_config()
        self._records.records = records
        self._run = self._start(self._config, checkpoint=held)
        self._offset, self.events = log.size, found.events
        return None

    def _first_event(self) -> RunStarted | None:
        """The log's first event when it is a whole line (else None); read as the
        follower reads the log (through a symbolic link too)."""
        with self.path.open("rb") as f:
            line = f.readline(MAX_LINE_BYTES)
        if not line.endswith(b"\n"):
            return None
        return self._started(self._decode(line))

    def _started(self, event: Event) -> RunStarted:
        """``event``, the log's first, when it is a ``run_started`` (else ReplayError)."""
        if not isinstance(event, RunStarted):
            raise ReplayError(
                f"{self.path} must start with a run_started event, got {event.TYPE!r}"
            )
        return event

    @property
    def finished(self) -> bool:
        """Whether the log read so far holds its last segment's ``run_finished``."""
        return self._run is not None and self._run.finished is not None

    def poll(self) -> int:
        """Feed the complete lines written since the last poll; returns how many."""
        fed = 0
        while lines := self._read():
            for line in lines:
                if not self._feed(self._decode(line)):
                    break  # started again from the first line: read from there
                fed += 1
        return fed

    def _read(self) -> list[bytes]:
        """The complete lines after the offset (at least one whole line, however long,
        up to the log's line limit), the offset moved past them."""
        with self.path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < self._offset:
                raise ReplayError(
                    f"{self.path} is shorter than when it was read ({size} < {self._offset} "
                    "bytes): it was replaced or cut; follow the run again"
                )
            f.seek(self._offset)
            data = f.read(_READ_BYTES)
            while b"\n" not in data and len(data) < min(size - self._offset, MAX_LINE_BYTES):
                data += f.read(_READ_BYTES)  # (a line longer than one read)
        end = data.rfind(b"\n") + 1
        if not end and len(data) >= MAX_LINE_BYTES:
            raise ReplayError(
                f"{self.path}: the line at byte {self._offset} is longer than the log's line "
                f"limit ({MAX_LINE_BYTES} bytes): not a line twinkle wrote"
            )
        self._offset += end
        return data[:end].splitlines()

    def _decode(self, line: bytes, seq: int | None = None) -> Event:
        """The event of the log's line ``line``, number ``seq`` (0-based; None: the next
        to read), its ``seq`` checked."""
        seq = self.events if seq is None else seq
        where = f"{self.path}:{seq + 1}"
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ReplayError(
                f"{where}: not JSON ({exc}): not a line twinkle wrote; {BAD_LINE_FIX}"
            ) from None
        if not isinstance(data, dict):
            raise ReplayError(
                f"{where}: not a JSON object: not a line twinkle wrote; {BAD_LINE_FIX}"
            )
        logged = data.pop(SEQ_KEY, None)
        if logged is not None and logged != seq:
            raise ReplayError(f"{where}: {seq_problem(logged, seq)}")
        try:
            return event_from_dict(data)
        except TwinkleError as exc:
            raise ReplayError(f"{where}: {exc}; {BAD_LINE_FIX}") from exc

    def _feed(self, event: Event) -> bool:
        """Feed ``event``; False when it made the follower start again (a resumed
        segment's configuration differs): the log is then read from its first line."""
        if self._run is None:
            self.first = event = self._started(event)
            self._run = self._start(event.config if self._config is None else self._config)
        elif (
            isinstance(event, RunResumed)
            and self.events > self._configured_at
            and event.config != self._run.context.config
        ):
            # The observers work to the newest segment's configuration: start again
            # (an earlier segment's, met again on the way, starts nothing: A, B, A).
            self.close()
            self._reset(event.config, self.events)
            if self.whole_log_why is None:
                self.whole_log_why = (
                    f"segment {event.segment} changed the configuration: the observers "
                    "read the log again from its first line with it"
                )
            return False
        try:
            self._run.submit(event)
        except RecordError as exc:  # (the run refused it: named by its line, as replay does)
            raise ReplayError(f"{self.path}:{self.events + 1}: {exc}") from exc
        self._run.checkpoints.seen(event)
        self.events += 1
        self.last = event
        return True

    def _start(
        self, config: Mapping[str, Any], records: _Records | None = None, **context: Any
    ) -> Run:
        assert self.first is not None
        pm = make_plugin_manager(
            autoload=False, blocked=_SINKS, plugins=[("records", records or self._records)]
        )
        run = Run(
            pm, RunContext(self.first.run_id, None, dict(config), replay=True, **context),
            background=False,
        )  # fmt: skip
        run.start()
        return run

    def snapshot(self) -> Snapshot:
        """The figures of the log read so far (:class:`Snapshot`); the observers that
        read it go on."""
        first, last = self.first, self.last
        if first is None or last is None:
            raise ReplayError(f"{self.path} holds no complete line yet: poll again later")
        closing = _Records(len(self._records.records))
        copy = self._copy(closing)
        try:
            if copy.finished is None:
                copy.submit(
                    RunFinished(
                        last.run_id, last.monotonic_ns, last.wall_ns, status="error",
                        error="in progress: the figures of the events logged so far",
                    )
                )  # fmt: skip
            summary = copy.finish()
        finally:
            copy.close()
        summary = orjson.loads(orjson.dumps(summary))  # (as summary.json holds it: NaN null)
        if not self.finished:
            summary = _in_progress(summary)
        records = self._records.records + closing.records
        return Snapshot(self.events, summary, records, self.finished, first, self.whole_log_why)

    def _copy(self, records: _Records) -> Run:
        """A run whose observers hold a copy of the running ones' state (as a
        checkpoint holds it), its records going to ``records``."""
        run = self._run
        assert run is not None and run.calls is not None
        order = run.order
        state = {
            "segments": run.segments,
            "order": (order.last_boundary, order.last_iteration, order.last_step),
            "failures": dict(run.calls.failures),
            "observers": {n: v for n, v in snapshot_observers(run.pm).items() if n != "records"},
        }
        latest = run.checkpoints.latest
        assert latest is not None
        scan = {"last_ns": latest.ns, "last_wall_ns": latest.wall_ns}
        names = [n for n, p in run.pm.list_name_plugin() if p is not None and n != "records"]
        held = Checkpoint(run.run_id, self.events, {}, scan, names, pickle.dumps(state))
        return self._start(run.context.config, records, checkpoint=held)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop following (the observers closed; nothing is written)."""
        run, self._run = self._run, None
        if run is not None:
            run.close()


def _kind(path: Path) -> str:
    """What ``path`` (not a regular file) is, in words."""
    if path.is_symlink():
        return "a symbolic link to nothing" if not path.exists() else "a symbolic link"
    mode = path.lstat().st_mode
    return "a directory" if stat.S_ISDIR(mode) else f"mode {stat.filemode(mode)}"


def _covered_records(run_dir: Path, mark: FileMark) -> list[dict[str, Any]]:
    """The records a checkpoint's mark of ``metrics_raw.jsonl`` covers: its file's
    first ``mark.size`` bytes, ``mark.lines`` lines."""
    with open_regular(run_dir / mark.path) as f:
        data = f.read(mark.size)
    lines = data.splitlines()
    if len(data) != mark.size or len(lines) != mark.lines:
        raise RecordError(f"{mark.path} no longer holds the {mark.lines} lines it held")
    records = [orjson.loads(line) for line in lines]
    for n, record in enumerate(records, 1):
        try:
            check_record_line(record)
        except RecordError as exc:
            raise RecordError(f"{mark.path} line {n}: {exc}") from None
    return records


def _in_progress(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` of a copy closed at the last event read: status ``in progress`` (the
    run's and its last segment's), no error."""
    segments = [dict(s) for s in summary.get("segments", [])]
    if segments:
        segments[-1].update(status="in progress", error=None)
    return {**summary, "status": "in progress", "error": None, "segments": segments}
