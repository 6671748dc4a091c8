"""``JsonlWriter``: the one writer of every JSONL file (metric records, events, WebUI flat).

Design points, each one tested:

* One ``os.write`` per batch on an ``O_APPEND`` descriptor, no user-space buffer: what
  :meth:`JsonlWriter.write` returned from is in the OS, whole lines only, in call order.
* Strict JSON through orjson (no ``NaN``/``Infinity`` tokens: orjson writes them as
  ``null``; :class:`~twinkle.reporting.MetricRecord` names such values).
* **One line limit**, :data:`MAX_LINE_BYTES` (64 MiB, the newline included), shared by
  the writer (a longer line is refused: :class:`~twinkle.errors.RecordError`, nothing of
  the batch written), the torn-tail repair and the reader (a longer line is not a line
  twinkle wrote: a ``RecordError`` naming ``file:line``; lines are read bounded, so a
  huge line never costs more memory than the limit). The limit lives here alone: the
  reader reads it from this module when a read begins.
* Append mode keeps what an earlier process wrote. A torn last line left by a crash
  is moved to a sidecar (``<name>.torn``, one JSON line per recovery) and the file is
  truncated back to its last complete line; :attr:`JsonlWriter.recovery` says so.
* **Several processes may append to one file.** Each open writer holds a shared lock
  (an open-file-description ``fcntl`` lock, a read lock on one byte far past the end),
  and the torn-line repair on open runs only when no other writer holds it, so a live
  writer's line in progress is never taken for a torn one. Each batch is written under
  an exclusive lock (a write lock on the next byte) that every writer honours: under it
  the writer checks that the file ends at a line end (one ``fstat``; one ``pread`` of
  the last byte only when another writer wrote since). If it does not — a co-appender
  was killed in the middle of its write — the writer records the fragment in the
  sidecar (``"kind": "fragment"``, its offset, length and sha256; the bytes stay in
  the file) and ends it with a newline before its own lines, so its lines never fuse
  onto the fragment. The reader recognises exactly those bytes (offset and digest) and
  passes over them (:attr:`~twinkle.reporting.JsonlReader.fragment_lines`); any other
  bad line is still an error.
* A failed write raises :class:`~twinkle.errors.WriteError`; the lines not yet written
  stay in memory and go out first on the next ``write``/``flush``, so a partly written
  line is completed, never duplicated (or, if another writer wrote after it, written
  again whole after a newline: its first part is then a recorded fragment).
* No symbolic link is followed (the shared ``O_NOFOLLOW`` opening of
  :mod:`twinkle.reporting._jsonl_files`).
* Durable at close: :meth:`JsonlWriter.close` fsyncs a regular file, and the directory
  once when the writer created the file, so whatever is written after a close (the
  run's ``summary.json``) never survives a power cut that the lines it sums up do not.

The reader (:class:`~twinkle.reporting.JsonlReader`, :func:`~twinkle.reporting.read_jsonl`)
lives in :mod:`twinkle.reporting.jsonl_reader`, whole-file writing
(:class:`~twinkle.reporting.ReplacingFile`) in :mod:`twinkle.reporting.whole_file`, the
cross-writer locks in :mod:`twinkle.reporting._jsonl_locks`; their public names are
importable from this module too.
"""

from __future__ import annotations

import base64
import errno as _errno
import fcntl
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, WriteError
from twinkle.reporting._jsonl_files import (
    CHUNK_BYTES,
    StrPath,
    open_appending,
    reporter_error,
    sidecar_path,
)
from twinkle.reporting._jsonl_locks import LIVE_AT, range_lock, write_lock, write_unlock
from twinkle.reporting.jsonl_reader import JsonlReader, read_jsonl
from twinkle.reporting.whole_file import ReplacingFile

__all__ = [
    "MAX_LINE_BYTES",
    "JsonlReader",
    "JsonlWriter",
    "ReplacingFile",
    "TornLineRecovery",
    "read_jsonl",
    "sidecar_path",
]

logger = logging.getLogger("twinkle.reporting")

#: The longest line of any JSONL file twinkle writes, its newline included. The writer
#: refuses a longer line, the torn-tail repair and the reader take one for a file twinkle
#: did not write. (Tests may lower it, here: every user, the reader too, reads it from
#: this module when it runs.)
MAX_LINE_BYTES = 64 << 20

_DUMPS_OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
# A torn tail is moved to the sidecar in parts of at most this many bytes, so that each
# sidecar line (base64 and a text preview) stays far below MAX_LINE_BYTES.
_SIDECAR_PART_BYTES = 8 << 20
_PREVIEW_CHARS = 1000

# Indirection so tests can inject OS faults (partial writes, ENOSPC) without a full disk.
_os_write = os.write


def _max_line() -> int:
    return MAX_LINE_BYTES


@dataclass(frozen=True, slots=True)
class TornLineRecovery:
    """What :class:`JsonlWriter` found at the end of a file it opened in append mode."""

    path: str
    offset: int  # byte offset where the torn bytes began; the file now ends there
    torn_bytes: int  # bytes moved to the sidecar (0: only a missing newline was added)
    sidecar: str | None  # the sidecar file holding them, None when nothing was moved
    reason: str


# -- JSON checks ---------------------------------------------------------------------------


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def _is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _parse_object(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _too_long(path: Path, i: int, size: int) -> RecordError:
    return RecordError(
        f"line {i} of the batch for {str(path)!r} is {size} bytes, longer than "
        f"MAX_LINE_BYTES={_max_line()} (the longest line a twinkle JSONL file holds); "
        "split the object into several lines; nothing of this batch was written"
    )


# A dict first: a Mapping ABC check costs a microsecond, a concrete type a tenth of one.
_SINGLE_VALUES = (dict, str, bytes, bytearray, memoryview, Mapping)


def _refuse_non_iterable(path: Path, objs: object, method: str, items: str) -> None:
    """``write(dict)`` would write the dict's keys, ``write("x")`` its characters: refuse
    a single value where an iterable of values, one per line, is due."""
    if type(objs) is list or type(objs) is tuple:  # the common case, checked cheaply
        return
    if isinstance(objs, _SINGLE_VALUES):
        raise InvalidArgumentError(
            f"{method}() takes an iterable of {items}, one per line, got a single "
            f"{type(objs).__name__} {objs!r:.80} for {str(path)!r}; wrap it in a list: "
            f"{method}([value])"
        )


# -- the writer ------------------------------------------------------------------------------


class JsonlWriter:
    """Appends JSON lines to one file; thread-safe; the one JSONL writer of twinkle.

    ``append=True`` (the default) keeps existing lines and repairs a torn last line
    (see :attr:`recovery`); ``append=False`` truncates. Missing parent directories are
    created (mode 0755); new files get mode 0644 (both less the umask). ``fsync=True``
    syncs after every write; every regular file is synced at :meth:`close` either way
    (and its directory, once, when this writer created the file). A path that is a
    directory, a symlink, under a file, or not writable raises
    :class:`~twinkle.errors.ReporterError` naming it.

    Several writers (threads or processes) may append to one file: each batch is one
    ``O_APPEND`` write of whole lines, under an exclusive lock every writer honours,
    after a check that the file ends at a line end (see the module docstring: a killed
    co-appender's unfinished line is recorded and ended, never fused onto). A writer
    holds a shared lock while open; the torn-line repair on open runs only when no other
    writer holds the file. (A write-only file cannot be read back: such a writer repairs
    nothing, is not seen by openers and begins its batches with a newline whenever
    another writer wrote since its last write — a blank line at worst.)
    """

    __slots__ = (
        "_backlog",
        "_backlog_lines",
        "_closed",
        "_dir_fd",
        "_done",
        "_end",
        "_fd",
        "_fsync",
        "_lock",
        "_readable",
        "_regular",
        "fragments",
        "lines_written",
        "path",
        "recovery",
    )

    def __init__(self, path: StrPath, *, append: bool = True, fsync: bool = False) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(
                f"path must be a str or os.PathLike, got {path!r}; e.g. 'runs/<id>/x.jsonl'"
            )
        self.path = Path(path)
        self._fsync = bool(fsync)
        self._lock = threading.Lock()
        self._backlog = b""  # unwritten bytes, from the start of a line
        self._backlog_lines = 0
        self._done = 0  # bytes of the backlog's first line already in the file
        self._end = -1  # the file's size right after this writer's last write (-1: unknown)
        self._closed = True
        self._regular = False
        self.lines_written = 0  # lines this writer put into the file (this process)
        #: unfinished lines of co-appenders (killed mid-write) this writer ended with a
        #: newline before its own, each recorded in the sidecar
        self.fragments = 0
        self.recovery: TornLineRecovery | None = None  # what open found and repaired
        opened = open_appending(self.path, append)
        self._fd, self._readable, self._dir_fd = opened.fd, opened.readable, opened.dir_fd
        self._closed = False
        try:
            self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
            if self._regular and self._readable:
                # Exclusive: no other writer is open, so a partial last line is torn (its
                # writer died) and may be repaired. Busy: another live writer may be in
                # the middle of a line; leave the tail to it. Then hold the shared lock
                # while open (waiting for an opener that is repairing).
                alone = range_lock(self._fd, fcntl.F_WRLCK, LIVE_AT, wait=False)
                if append and alone:
                    self.recovery = self._recover()
                range_lock(self._fd, fcntl.F_RDLCK, LIVE_AT, wait=True)
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError) and not isinstance(exc, ReporterError):
                raise reporter_error(self.path, exc, "open") from exc
            raise

    # -- writing -----------------------------------------------------------------

    def write(self, objs: Iterable[Any]) -> int:
        """Serialise each object (dict, dataclass, ...) as one line; returns the count.

        The batch is all or nothing at serialisation: an object orjson cannot write
        (non-str key, unsupported type) or a line longer than :data:`MAX_LINE_BYTES`
        raises :class:`~twinkle.errors.RecordError` and nothing of the batch is written.
        A single dict, str or bytes (not an iterable of objects) raises
        :class:`~twinkle.errors.InvalidArgumentError`. An OS error raises
        :class:`~twinkle.errors.WriteError`; the batch stays in memory.
        """
        _refuse_non_iterable(self.path, objs, "write", "objects")
        dumps = orjson.dumps
        option = _DUMPS_OPTION
        # Appending each line to one buffer frees it at once: retaining thousands of
        # fresh bytes objects costs more than serialising them.
        buf = bytearray()
        obj: Any = None
        try:
            for obj in objs:
                buf += dumps(obj, option=option)
        except orjson.JSONEncodeError as exc:
            # Compact JSON holds no raw newline: each line has exactly one.
            raise RecordError(
                f"object {buf.count(10)} of the batch for {str(self.path)!r} is not strict "
                f"JSON ({exc}): {obj!r:.200}; use str keys and JSON types; nothing of this "
                "batch was written"
            ) from exc
        if len(buf) > _max_line():  # only then can one of its lines be too long
            self._check_line_lengths(buf)
        return self._write_data(buf, buf.count(10))

    def write_bytes_lines(self, lines: Sequence[bytes]) -> int:
        """Write pre-serialised lines, each one JSON value ending in exactly one ``\\n``
        and at most :data:`MAX_LINE_BYTES` long (else nothing of the batch is written)."""
        _refuse_non_iterable(self.path, lines, "write_bytes_lines", "bytes lines")
        limit = _max_line()
        for i, line in enumerate(lines):
            if not isinstance(line, bytes) or not line.endswith(b"\n") or b"\n" in line[:-1]:
                raise RecordError(
                    f"lines[{i}] of the batch for {str(self.path)!r} must be one JSON value "
                    f"ending in a single b'\\n', got {line[:80]!r}; serialise with "
                    "orjson.OPT_APPEND_NEWLINE"
                )
            if len(line) > limit:
                raise _too_long(self.path, i, len(line))
        return self._write_data(b"".join(lines), len(lines))

    @property
    def max_line_bytes(self) -> int:
        """The longest line this writer writes (and any twinkle reader reads), its newline
        included: :data:`MAX_LINE_BYTES`."""
        return _max_line()

    def flush(self) -> None:
        """Write what an earlier failure kept in memory (and fsync if asked).

        Lines are handed to the OS as they are written, so there is no buffer to flush
        otherwise. Raises :class:`~twinkle.errors.WriteError` while the fault lasts.
        """
        with self._lock:
            if self._closed:
                return
            if self._backlog:
                self._drain(b"", 0)
            elif self._fsync:
                self._sync()

    def sync(self) -> None:
        """Write what an earlier failure kept in memory, then fsync the file (and its
        directory, once, when this writer created it): every line written so far is
        durable. Raises :class:`~twinkle.errors.WriteError` while a fault lasts."""
        with self._lock:
            if self._closed:
                return
            if self._backlog:
                self._drain(b"", 0)
            self._sync()

    def close(self) -> None:
        """Write what is kept, fsync (a regular file, and its directory once when this
        writer created it) and close. Idempotent. If lines are still unwritten, they are
        lost: :class:`~twinkle.errors.WriteError` says how many."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._backlog:
                    self._drain(b"", 0)
                self._sync()
            except WriteError as exc:
                lost = self._backlog_lines
                raise WriteError(
                    exc.errno,
                    f"closing {str(self.path)!r} lost {lost} unwritten line(s): {exc.strerror}",
                ) from exc
            finally:
                self._backlog = b""
                self._backlog_lines = 0
                self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unwritten_records(self) -> int:
        """Lines kept in memory after a failed write, waiting for ``write``/``flush``."""
        return self._backlog_lines

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"JsonlWriter({str(self.path)!r}, {state}, unwritten={self._backlog_lines})"

    def _release(self) -> None:
        """Close the descriptors (the locks go with them)."""
        self._closed = True
        os.close(self._fd)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def _check_line_lengths(self, buf: bytearray) -> None:
        limit = _max_line()
        start = 0
        i = 0
        while start < len(buf):
            end = buf.find(b"\n", start) + 1
            if end - start > limit:
                raise _too_long(self.path, i, end - start)
            start = end
            i += 1

    def _write_data(self, data: bytes | bytearray, lines: int) -> int:
        with self._lock:
            if self._closed:
                raise ReporterError(
                    f"JsonlWriter for {str(self.path)!r} is closed; open a new one to write"
                )
            self._drain(data, lines)
        return lines

    def _drain(self, data: bytes | bytearray, lines: int) -> None:
        """Write backlog + data fully, or keep the unwritten rest and raise (lock held)."""
        if self._backlog:
            data = self._backlog + data
            lines += self._backlog_lines
        if not data:
            return
        if not self._regular:  # a device or a pipe: no locks, no end to check
            self._write_out(data, lines, self._done, b"", -1)
            return
        fd = self._fd
        locked = write_lock(fd)
        try:
            done = self._done
            prefix = b""
            try:
                size = os.lseek(fd, 0, os.SEEK_END)  # (O_APPEND: the position is unused)
                if size != self._end:
                    # Another writer wrote (or cut the file) since this one's last write:
                    # a line this one left half written is no longer the end, so it is
                    # written again whole; and the file may end in a co-appender's
                    # unfinished line, which must not have this writer's lines fused on.
                    done = 0
                    prefix = self._guard(size)
            except OSError as exc:
                self._keep(data, lines, self._done)
                raise self._write_error(exc) from exc
            self._write_out(data, lines, done, prefix, size)
        finally:
            if locked:
                write_unlock(fd)

    def _write_out(
        self, data: bytes | bytearray, lines: int, done: int, prefix: bytes, size: int
    ) -> None:
        """Write ``prefix`` and ``data[done:]`` (``size``: the file's size, -1 unknown)."""
        payload: bytes | bytearray | memoryview = memoryview(data)[done:] if done else data
        if prefix:
            payload = prefix + bytes(payload)
        total = len(payload)
        written = 0
        try:
            written = _os_write(self._fd, payload)
            while written < total:
                n = _os_write(self._fd, memoryview(payload)[written:])
                if n <= 0:
                    raise OSError(_errno.EIO, "write() wrote nothing")
                written += n
        except OSError as exc:
            # The file ends with this writer's bytes only if the guard's newline went out.
            self._end = size + written if size >= 0 and written >= len(prefix) else -1
            self._keep(data, lines, done + max(0, written - len(prefix)))
            raise self._write_error(exc) from exc
        self._end = size + total if size >= 0 else -1
        self._backlog = b""
        self._backlog_lines = 0
        self._done = 0
        self.lines_written += lines
        if self._fsync:
            self._sync()

    def _keep(self, data: bytes | bytearray, lines: int, done: int) -> None:
        """Keep what of ``data`` is not in the file after its first ``done`` bytes: from
        the start of the first line not fully written (how much of it is noted)."""
        start = data.rfind(b"\n", 0, done) + 1
        rest = bytes(data[start:])
        self._backlog = rest
        self._done = done - start
        self._backlog_lines = rest.count(b"\n")
        self.lines_written += lines - self._backlog_lines

    def _write_error(self, exc: OSError) -> WriteError:
        return WriteError(
            exc.errno,
            f"cannot write to {str(self.path)!r}: {exc.strerror or exc}; "
            f"{self._backlog_lines} line(s) are kept in memory and written by the next "
            "write() or flush(): free disk space or fix permissions",
        )

    def _guard(self, size: int) -> bytes:
        """``b"\\n"`` when the file (``size`` bytes) does not end at a line end: a
        co-appender was killed in the middle of its write. Its unfinished line is
        recorded in the sidecar first (write lock held)."""
        if size == 0:
            return b""
        if not self._readable:
            return b"\n"  # cannot look: at worst a blank line, which readers ignore
        if self._pread(1, size - 1) == b"\n":
            return b""
        self._record_fragment(size)
        return b"\n"

    def _record_fragment(self, end: int) -> None:
        path = str(self.path)
        start = self._line_start(end)
        if start is None:
            logger.error(
                "%s: ends in more than %d bytes without a newline (not a line twinkle "
                "wrote); ended it with a newline before writing, not recorded",
                path,
                _max_line(),
            )
            return
        fragment = self._pread(end - start, start)
        if _is_json_object(fragment):
            # A complete record whose newline its writer never wrote: ending it keeps it.
            logger.warning(
                "%s: another writer's last record (offset %d) lacked its newline; ended it",
                path,
                start,
            )
            return
        self.fragments += 1
        sidecar = sidecar_path(self.path)
        entry = {
            "kind": "fragment",
            "path": path,
            "offset": start,
            "torn_bytes": len(fragment),
            "reason": (
                "another writer stopped in the middle of this line (killed while writing "
                "it); the bytes stay in the file as a line of their own, which readers "
                "pass over"
            ),
            "sha256": hashlib.sha256(fragment).hexdigest(),
            "text": fragment[: _PREVIEW_CHARS * 4].decode("utf-8", "replace")[:_PREVIEW_CHARS],
        }
        try:
            with JsonlWriter(sidecar, fsync=True) as side:
                side.write([entry])
        except (ReporterError, OSError) as exc:
            logger.error(
                "%s: cannot record another writer's unfinished line (offset %d, %d "
                "byte(s)) in %s: %s; it is ended with a newline, but readers will take it "
                "for corruption (read with on_error='skip')",
                path,
                start,
                len(fragment),
                sidecar,
                exc,
            )
            return
        logger.warning(
            "%s: another writer was killed in the middle of a line (offset %d, %d "
            "byte(s)); recorded it in %s and ended it with a newline",
            path,
            start,
            len(fragment),
            sidecar,
        )

    def _sync(self) -> None:
        if not self._regular:
            return
        try:
            os.fsync(self._fd)
            if self._dir_fd >= 0:  # this writer created the file: its directory entry too
                os.fsync(self._dir_fd)
                os.close(self._dir_fd)
                self._dir_fd = -1
        except OSError as exc:
            raise WriteError(
                exc.errno, f"fsync of {str(self.path)!r} failed: {exc.strerror or exc}"
            ) from exc

    # -- reading back --------------------------------------------------------------

    def _pread(self, size: int, offset: int) -> bytes:
        chunks = []
        while size > 0:
            chunk = os.pread(self._fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def _line_start(self, end: int) -> int | None:
        """Offset just after the last ``\\n`` before ``end`` (0 if none); None when the
        line would be longer than :data:`MAX_LINE_BYTES`."""
        limit = _max_line()
        pos = end
        start = 0
        while pos > 0 and end - pos <= limit:
            lo = max(0, pos - CHUNK_BYTES)
            idx = self._pread(pos - lo, lo).rfind(b"\n")
            if idx >= 0:
                start = lo + idx + 1
                break
            pos = lo
        return None if end - start > limit else start

    def _recover(self) -> TornLineRecovery | None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return None
        path = str(self.path)
        if self._pread(1, size - 1) != b"\n":
            start = self._line_start(size)
            reason = "last line has no trailing newline (write interrupted)"
        else:
            start = self._line_start(size - 1)
            reason = "last line is not valid JSON"
        if start is None:
            raise ReporterError(
                f"the last line of {path!r} is longer than MAX_LINE_BYTES={_max_line()} "
                "bytes: this is not a JSONL file twinkle wrote; move it away or open it "
                "with append=False"
            )
        tail = self._pread(size - start, start)
        if not tail.endswith(b"\n"):
            if _is_json_object(tail):
                # A complete record that only lacks its newline: keep it, end the line
                # (this writer takes the file's end as its own: no guard before it).
                self._end = size
                self._drain(b"\n", 0)
                recovery = TornLineRecovery(
                    path, size, 0, None, "complete last record lacked its newline; added it"
                )
                logger.warning("%s: %s", path, recovery.reason)
                return recovery
        elif not tail.strip() or _is_json(tail):
            return None
        sidecar = sidecar_path(self.path)
        # Sidecar first, durably; only then cut the file. A crash in between leaves the
        # torn bytes in both places, never in neither. A long tail goes in several parts,
        # each line well within the line limit.
        parts = max(1, -(-len(tail) // _SIDECAR_PART_BYTES))
        entries = []
        for k in range(parts):
            piece = tail[k * _SIDECAR_PART_BYTES : (k + 1) * _SIDECAR_PART_BYTES]
            entry: dict[str, Any] = {
                "kind": "torn_tail",
                "path": path,
                "offset": start,
                "torn_bytes": len(tail),
                "reason": reason,
                "text": piece[: _PREVIEW_CHARS * 4].decode("utf-8", "replace")[:_PREVIEW_CHARS],
                "base64": base64.b64encode(piece).decode("ascii"),
            }
            if parts > 1:
                entry.update(part=k, parts=parts, part_offset=start + k * _SIDECAR_PART_BYTES)
            entries.append(entry)
        try:
            with JsonlWriter(sidecar, fsync=True) as side:
                for entry in entries:  # one line per write: each line is bounded
                    side.write([entry])
        except (ReporterError, OSError) as exc:
            raise ReporterError(
                f"{path!r} ends with a torn line ({reason}) that cannot be moved to "
                f"{str(sidecar)!r}: {exc}; make that path writable and reopen"
            ) from exc
        os.ftruncate(self._fd, start)
        os.fsync(self._fd)
        self._end = start  # the file ends at a line end now
        recovery = TornLineRecovery(path, start, len(tail), str(sidecar), reason)
        logger.warning(
            "%s: %s; moved %d byte(s) from offset %d to %s",
            path,
            reason,
            len(tail),
            start,
            sidecar,
        )
        return recovery

    def last_object(
        self, predicate: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """The last JSON object line (satisfying ``predicate``), scanning backwards.

        Reads the file in 64 KiB chunks from its end, so finding a recent record is
        cheap however long the file is. Lines that are not JSON objects, or longer than
        :data:`MAX_LINE_BYTES`, are skipped. Returns None for an empty file, a
        non-regular file (a device) or no match.
        """
        with self._lock:
            if self._closed:
                raise ReporterError(f"JsonlWriter for {str(self.path)!r} is closed")
            if not (self._regular and self._readable):
                return None
            pos = os.fstat(self._fd).st_size
        limit = _max_line()
        # The pieces of the line being read backwards, last first (joined once, when its
        # start is found: a long line costs no quadratic copying); dropped past the limit.
        parts: list[bytes] = []
        held = 0
        overlong = False

        def match(line: bytes) -> dict[str, Any] | None:
            obj = _parse_object(line)
            return obj if obj is not None and (predicate is None or predicate(obj)) else None

        while pos > 0:
            lo = max(0, pos - CHUNK_BYTES)
            chunk = self._pread(pos - lo, lo)
            pos = lo
            idx = chunk.rfind(b"\n")
            if idx < 0:
                if not overlong:
                    parts.append(chunk)
                    held += len(chunk)
                    if held > limit:
                        parts, held, overlong = [], 0, True
                continue
            if not overlong:
                found = match(chunk[idx + 1 :] + b"".join(reversed(parts)))
                if found is not None:
                    return found
            parts, held, overlong = [], 0, False
            lines = chunk[:idx].split(b"\n")
            head = lines.pop(0)  # continues in the chunk before (unless at offset 0)
            for line in reversed(lines):
                found = match(line)
                if found is not None:
                    return found
            if pos > 0:
                parts, held = [head], len(head)
            else:
                return match(head)
        return None if overlong or not parts else match(b"".join(reversed(parts)))
