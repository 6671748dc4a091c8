"""Checkpoints: the observers' state, so that a resume feeds them only the log's tail
(docs/metrics.md, "Resuming from a checkpoint").

A running segment writes ``checkpoint.bin`` beside its log at an iteration boundary
every :data:`~twinkle.run._checkpointing.CHECKPOINT_EVERY` events, and a segment that finishes
once more at its end, last (after the summary), each durably: a JSON header line, then
the state, pickled (read back by :mod:`twinkle.run._state_pickle`). The header says what
the state covers: the log's first ``events`` events (``log_bytes`` bytes), the record
files' and the trace's first bytes and lines, and a digest of the last bytes of each,
so that a resume can tell the files still begin as they did.

A resume uses it only when everything agrees: the same format, the same twinkle code
(a digest of its sources) and Python, the same run, the same observers (twinkle's
own, and plugins that keep their state through ``twinkle_checkpoint_state``, with the
same code; any other plugin rebuilds its outputs from the events it sees), the state's digest,
and each file's length and digest. Anything else, it says why and feeds the whole log
again, as a resume without a checkpoint does: never a wrong figure; but an event log
that holds the bytes its checkpoint covers, ending otherwise, was edited, and is
refused (:func:`log_edited`); a checkpoint whose log was cut short, or is gone, is
removed before the log is written again (:func:`drop_stale`). One digest covers
the header and the state together (a changed count in the header is as much a
different checkpoint as a changed state). The state is read by an unpickler that only
makes twinkle's classes and plain Python values.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

import orjson

import twinkle
from twinkle.observers import (
    EVENTS_FILE,
)
from twinkle.observers._held_log import outputs_held
from twinkle.reporting import (
    MAX_LINE_BYTES,
    ReplacingFile,
    json_object,
    open_regular,
    sync_dir,
)
from twinkle.run._state_pickle import read_state

__all__ = [
    "CHECKPOINT_FILE",
    "NO_CHECKPOINT",
    "Checkpoint",
    "FileMark",
    "code_digest",
    "load",
    "drop_stale",
    "log_edited",
    "log_unlike_checkpoint",
    "mark",
    "write",
]

CHECKPOINT_FILE: Final = "checkpoint.bin"
#: the files a checkpoint marks
MARKED: Final = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "trace.json")
NO_CHECKPOINT: Final = "the run has no checkpoint"
FORMAT: Final = 2
#: the header's key of the digest over the rest of the header and the state
DIGEST: Final = "sha256"
#: the bytes of a file's end that its digest covers
TAIL_BYTES: Final = 64 * 1024
#: the most bytes a checkpoint's header line may take (its file marks and observers'
#: names: a few KiB); a file whose first line is longer is not read further
HEADER_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class FileMark:
    """Where a file stood when the checkpoint was taken: its first ``size`` bytes (``lines``
    lines), the digest of the last :data:`TAIL_BYTES` of them, and the name of the file
    in the run directory that held them (a running segment's trace and rebuilt record
    files are temporary files beside their final names)."""

    size: int
    lines: int
    tail: str
    path: str

    def matches(self, path: Path) -> str | None:
        """None when ``path`` still begins so, else why not."""
        tail = self._tail(path)
        if isinstance(tail, str):
            return tail
        if hashlib.sha256(tail).hexdigest() != self.tail:
            return f"{path.name} no longer begins with the bytes the checkpoint covers"
        return None

    def edited(self, path: Path) -> bool:
        """Whether ``path`` holds the marked bytes' count at least, but other bytes than
        they were at the mark (a line changed, added or removed before it; a file cut
        short is not)."""
        tail = self._tail(path)
        return isinstance(tail, bytes) and hashlib.sha256(tail).hexdigest() != self.tail

    def _tail(self, path: Path) -> bytes | str:
        """The bytes ``path`` holds where the mark's tail was, else why there are none."""
        try:
            with open_regular(path) as f:
                have = os.fstat(f.fileno()).st_size
                if have < self.size:
                    return f"{path.name} holds {have} bytes, fewer than its {self.size}"
                f.seek(max(0, self.size - TAIL_BYTES))
                return f.read(self.size - max(0, self.size - TAIL_BYTES))
        except OSError as exc:
            return f"cannot read {path.name} ({exc.strerror or exc})"


def mark(path: Path, size: int, lines: int) -> FileMark:
    """The :class:`FileMark` of ``path``'s first ``size`` bytes (``lines`` lines)."""
    with path.open("rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read(size - max(0, size - TAIL_BYTES))
    if len(tail) != size - max(0, size - TAIL_BYTES):
        raise OSError(f"{path.name} holds fewer than {size} bytes")
    return FileMark(size, lines, hashlib.sha256(tail).hexdigest(), path.name)


@dataclass(slots=True)
class Checkpoint:
    """What a segment's end left for the next resume: the events it covers and where the
    files stood (``files`` by name: the log, the record files, the trace's part before
    its tail), the scan's figures (:class:`~twinkle.run._session._Scan`'s), the names of
    the observers whose state it holds, and the state (``payload``, pickled)."""

    run_id: str
    events: int
    files: dict[str, FileMark]
    scan: dict[str, Any]
    observers: list[str]
    payload: bytes = field(repr=False)

    _state: dict[str, Any] | None = field(default=None, repr=False)

    def state(self) -> dict[str, Any]:
        """The pickled state, made by :class:`_Unpickler` (once: a caller that changes
        what it holds copies it first)."""
        if self._state is None:
            collecting = gc.isenabled()
            gc.disable()  # (the collector would walk the objects made so far, again and again)
            try:
                self._state = read_state(io.BytesIO(self.payload))
            finally:
                if collecting:
                    gc.enable()
        return self._state

    def segment_config(self) -> Mapping[str, Any]:
        """The configuration of the segment the checkpoint was taken in."""
        config: Mapping[str, Any] = self.state()["segments"][-1].start.config
        return config


@cache
def code_digest() -> str:
    """A digest of the sources of the installed twinkle: a checkpoint is read back only
    by the code that wrote it (the state's shape is that code's)."""
    root = Path(twinkle.__file__).parent
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write(out_dir: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` into ``out_dir`` durably (a whole file or the old one)."""
    header = {
        "format": FORMAT,
        "code": code_digest(),
        "run_id": checkpoint.run_id,
        "events": checkpoint.events,
        "files": {
            name: [m.size, m.lines, m.tail, m.path] for name, m in sorted(checkpoint.files.items())
        },
        "scan": checkpoint.scan,
        "observers": checkpoint.observers,
    }
    header[DIGEST] = _digest(header, checkpoint.payload)
    out = ReplacingFile(out_dir / CHECKPOINT_FILE)  # synced, then renamed into place
    try:
        out.write(orjson.dumps(header) + b"\n" + checkpoint.payload)
    except BaseException:
        out.discard()
        raise
    out.commit()


def _digest(header: Mapping[str, Any], payload: bytes) -> str:
    """The SHA-256 of ``header`` (its JSON, keys sorted, without the digest) and the
    state."""
    fields = {k: v for k, v in header.items() if k != DIGEST}
    digest = hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
    digest.update(b"\n")
    digest.update(payload)
    return digest.hexdigest()


def load(out_dir: Path, run_id: str, observers: list[str]) -> Checkpoint | str:
    """The checkpoint in ``out_dir`` when it can serve this resume (the run's id, its
    observers' names, every file as it marks it), else why not."""
    path = out_dir / CHECKPOINT_FILE
    try:
        with open_regular(path) as f:
            head = f.readline(HEADER_BYTES + 1)
            header = _header(head)
            # (the state is read only for a header this code wrote)
            payload = f.read() if isinstance(header, dict) and _ours(header) else b""
    except FileNotFoundError:
        return NO_CHECKPOINT
    except OSError as exc:
        return f"cannot read {CHECKPOINT_FILE} ({exc.strerror or exc}): remove it"
    unreadable = f"{CHECKPOINT_FILE} is not a checkpoint twinkle wrote (its header is unreadable)"
    if not isinstance(header, dict):
        return unreadable
    try:
        checkpoint = Checkpoint(
            run_id=header["run_id"],
            events=int(header["events"]),
            files={name: FileMark(*mark) for name, mark in header["files"].items()},
            scan=dict(header["scan"]),
            observers=list(header["observers"]),
            payload=payload,
        )
        if sorted(checkpoint.files) != sorted(MARKED):
            raise ValueError("files")
    except (KeyError, TypeError, ValueError, AttributeError):
        return unreadable
    why = _disagreement(header, checkpoint, run_id, observers)
    if why is None:
        for _, file_mark in sorted(checkpoint.files.items()):
            if Path(file_mark.path).name != file_mark.path:
                why = f"it names {file_mark.path!r}, not a file of the run directory"
            else:
                why = file_mark.matches(out_dir / file_mark.path)
            if why is not None:
                break
    if why is None:
        try:
            checkpoint.state()
        except Exception as exc:  # (whatever a bad pickle raises)
            why = f"its state cannot be read back ({type(exc).__name__}: {exc})"
    return checkpoint if why is None else why


def log_unlike_checkpoint(out_dir: Path) -> str | None:
    """Why the run's event log is not what its checkpoint marks (cut, or a line added,
    removed or changed before the end the checkpoint covers), else None (it is, or no
    checkpoint marks it). Reads the checkpoint's first line and the log's marked tail."""
    mark = _log_mark(out_dir)
    return None if mark is None else mark.matches(out_dir / EVENTS_FILE)


def log_edited(out_dir: Path) -> str | None:
    """Why the run's event log was changed within the part its checkpoint covers (a line
    changed, added or removed: not only cut short), else None."""
    mark = _log_mark(out_dir)
    if mark is None or not mark.edited(out_dir / EVENTS_FILE):
        return None
    return (
        f"{EVENTS_FILE} changed since the run wrote it: its first {mark.size} bytes, which "
        f"{CHECKPOINT_FILE} covers, end otherwise than they did"
    )


def drop_stale(out_dir: Path) -> bool:
    """Remove the run's checkpoint, durably, when its event log no longer holds what it
    marks (cut short: it never fits again, and the bytes the run appends where its mark
    ended would later read as an edit of the log), or when the run's files are gone but
    it (a new run of a run id whose files were removed; an earlier run's outputs
    without their log are refused by the run, and keep their checkpoint); whether it
    did."""
    path = out_dir / CHECKPOINT_FILE
    if not os.path.lexists(path):
        return False
    log = out_dir / EVENTS_FILE
    logged = log.is_file() and log.stat().st_size > 0
    if logged and log_unlike_checkpoint(out_dir) is None:
        return False
    if not logged and outputs_held(out_dir, MARKED):
        return False
    path.unlink()
    sync_dir(out_dir)
    return True


def _log_mark(out_dir: Path) -> FileMark | None:
    """Where the run's checkpoint marks its event log (None: no checkpoint of this
    format, none readable, or another run's: a checkpoint copied in from elsewhere says
    nothing of this log, and :func:`load` refuses it naming its run). Reads the
    checkpoint's first line and the log's."""
    try:
        with open_regular(out_dir / CHECKPOINT_FILE) as f:
            header = _header(f.readline(HEADER_BYTES + 1))
        if header is None or header.get("format") != FORMAT:
            return None
        try:
            with open_regular(out_dir / EVENTS_FILE) as f:
                first = json_object(f.readline(MAX_LINE_BYTES + 1))
        except OSError:
            first = None  # (gone, or not a file to read: the mark's own check says so)
        if first is not None and first.get("run_id") != header["run_id"]:
            return None
        return FileMark(*header["files"][EVENTS_FILE])
    except (OSError, KeyError, TypeError, ValueError):
        return None  # (no checkpoint of this twinkle's: nothing to compare with)


def _header(line: bytes) -> dict[str, Any] | None:
    """A checkpoint's header: its first line's JSON object (None: no line within
    :data:`HEADER_BYTES`, or not a JSON object)."""
    return json_object(line) if line.endswith(b"\n") else None


def _ours(header: Mapping[str, Any]) -> bool:
    """Whether ``header`` says this code (this twinkle, this Python) wrote it."""
    return header.get("format") == FORMAT and header.get("code") == code_digest()


def _disagreement(
    header: dict[str, Any], checkpoint: Checkpoint, run_id: str, observers: list[str]
) -> str | None:
    if not _ours(header):
        return "it was written by another twinkle (or Python) than this one"
    if header.get(DIGEST) != _digest(header, checkpoint.payload):
        return f"{CHECKPOINT_FILE} is cut or changed (its digest differs)"
    if checkpoint.run_id != run_id:
        return f"it is run {checkpoint.run_id!r}'s, not {run_id!r}'s"
    if checkpoint.observers != observers:
        extra = sorted(set(observers) - set(checkpoint.observers))
        hint = (
            f"; {extra} not among them (new to the run, or left out of its segment: one "
            "that could not set up; block one that cannot set up here either, "
            "blocked=[...] or --block NAME, for a resume to start from the checkpoint)"
            if extra and set(checkpoint.observers) < set(observers)
            else ""
        )
        return (
            f"it holds the state of observers {checkpoint.observers}, and this run has "
            f"{observers}{hint}"
        )
    return None
