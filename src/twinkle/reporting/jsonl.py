"""``JsonlWriter``: the one writer of every JSONL file (metric records, events, WebUI flat).

Design points, each one tested:

* One ``os.write`` per batch on an ``O_APPEND`` descriptor, no user-space buffer: what
  :meth:`JsonlWriter.write` returned from is in the OS, whole lines only, in call order.
* Strict JSON through orjson (no ``NaN``/``Infinity`` tokens: orjson writes them as
  ``null``; :class:`~twinkle.reporting.MetricRecord` names such values).
* Append mode keeps what an earlier process wrote. A torn last line left by a crash
  is moved to a sidecar (``<name>.torn``, one JSON line per recovery) and the file is
  truncated back to its last complete line; :attr:`JsonlWriter.recovery` says so.
* Several processes may append to one file: each writer holds a shared ``flock`` on it
  while open, and the torn-line repair runs only under an exclusive one, so it never
  mistakes another live writer's line in progress for a torn one (a writer that finds
  the file shared leaves its tail alone: a live writer owns it).
* A failed write raises :class:`~twinkle.errors.WriteError`; the lines not yet written
  stay in memory and go out first on the next ``write``/``flush``, so a partly written
  line is completed, never duplicated.
"""

from __future__ import annotations

import base64
import errno as _errno
import fcntl
import logging
import os
import stat
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import orjson

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, WriteError

__all__ = ["JsonlReader", "JsonlWriter", "TornLineRecovery", "read_jsonl"]

logger = logging.getLogger("twinkle.reporting")

_DUMPS_OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
_CHUNK_BYTES = 1 << 16
# A "last line" longer than this is not a torn record: refuse rather than move it.
_MAX_TORN_BYTES = 64 << 20
_FILE_MODE = 0o644
_DIR_MODE = 0o755

# Indirection so tests can inject OS faults (partial writes, ENOSPC) without a full disk.
_os_write = os.write

StrPath = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class TornLineRecovery:
    """What :class:`JsonlWriter` found at the end of a file it opened in append mode."""

    path: str
    offset: int  # byte offset where the torn bytes began; the file now ends there
    torn_bytes: int  # bytes moved to the sidecar (0: only a missing newline was added)
    sidecar: str | None  # the sidecar file holding them, None when nothing was moved
    reason: str


def _reporter_error(path: Path, exc: OSError, doing: str) -> ReporterError:
    why = exc.strerror or type(exc).__name__
    if isinstance(exc, IsADirectoryError):
        fix = "pass a file path inside it, e.g. <dir>/metrics_raw.jsonl"
    elif isinstance(exc, PermissionError):
        fix = "fix the permissions or choose a writable directory"
    elif isinstance(exc, NotADirectoryError | FileExistsError):
        fix = "a parent of the path is a file: choose another path"
    else:
        fix = "check the path and the file system"
    return ReporterError(f"cannot {doing} {str(path)!r}: {why}; {fix}")


def _open_fd(path: Path, append: bool) -> tuple[int, bool]:
    """Open ``path`` for appending (creating parents); returns (fd, readable)."""
    if path.is_dir():
        raise ReporterError(
            f"JSONL path {str(path)!r} is a directory; pass a file path inside it, "
            "e.g. <dir>/metrics_raw.jsonl"
        )
    parent = path.parent
    if not parent.is_dir():
        try:
            parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise _reporter_error(parent, exc, "create the directory") from exc
    flags = os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    if not append:
        flags |= os.O_TRUNC
    try:
        return os.open(path, flags | os.O_RDWR, _FILE_MODE), True
    except PermissionError:
        pass  # a write-only file: still usable, without recovery and last_object
    except OSError as exc:
        raise _reporter_error(path, exc, "open") from exc
    try:
        return os.open(path, flags | os.O_WRONLY, _FILE_MODE), False
    except OSError as exc:
        raise _reporter_error(path, exc, "open") from exc


def _lock(fd: int, how: int) -> bool:
    """``flock(fd, how)``; False only when another holder makes it busy (``LOCK_NB``).

    Where the file system has no ``flock`` the answer is True: one writer per file is
    then assumed, as before locks were taken.
    """
    try:
        fcntl.flock(fd, how)
    except OSError as exc:
        if exc.errno in (_errno.EWOULDBLOCK, _errno.EAGAIN):
            return False
        logger.debug("flock(%d) unsupported here (%s): no cross-process guard", fd, exc)
    return True


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


class JsonlWriter:
    """Appends JSON lines to one file; thread-safe; the one JSONL writer of twinkle.

    ``append=True`` (the default) keeps existing lines and repairs a torn last line
    (see :attr:`recovery`); ``append=False`` truncates. Missing parent directories are
    created (mode 0755); new files get mode 0644 (both less the umask). ``fsync=True``
    syncs after every write. A path that is a directory, under a file, or not writable
    raises :class:`~twinkle.errors.ReporterError` naming it.

    Several writers (threads or processes) may append to one file: each batch is one
    ``O_APPEND`` write of whole lines. A writer holds a shared ``flock`` while open; the
    torn-line repair on open runs only when no other writer holds the file.
    """

    __slots__ = (
        "_backlog",
        "_backlog_lines",
        "_closed",
        "_fd",
        "_fsync",
        "_lock",
        "_readable",
        "_regular",
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
        self._backlog = b""
        self._backlog_lines = 0
        self._closed = True
        self.lines_written = 0  # lines this writer put into the file (this process)
        self._fd, self._readable = _open_fd(self.path, append)
        self._closed = False
        self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
        self.recovery: TornLineRecovery | None = None  # what open found and repaired
        if not self._regular:
            return
        try:
            # Exclusive: no other writer is open, so a partial last line is torn (its
            # writer died) and may be repaired. Busy: another live writer may be in the
            # middle of a line; leave the tail to it. Then hold a shared lock while open.
            alone = _lock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if append and self._readable and alone:
                self.recovery = self._recover()
            _lock(self._fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self._fd)
            self._closed = True
            raise

    # -- writing -----------------------------------------------------------------

    def write(self, objs: Iterable[Any]) -> int:
        """Serialise each object (dict, dataclass, ...) as one line; returns the count.

        The batch is all or nothing at serialisation: an object orjson cannot write
        (non-str key, unsupported type) raises :class:`~twinkle.errors.RecordError`
        and nothing of the batch is written. An OS error raises
        :class:`~twinkle.errors.WriteError`; the batch stays in memory.
        """
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
        return self._write_data(buf, buf.count(10))

    def write_bytes_lines(self, lines: Sequence[bytes]) -> int:
        """Write pre-serialised lines, each one JSON value ending in exactly one ``\\n``."""
        for i, line in enumerate(lines):
            if not line.endswith(b"\n") or b"\n" in line[:-1]:
                raise RecordError(
                    f"lines[{i}] of the batch for {str(self.path)!r} must be one JSON value "
                    f"ending in a single b'\\n', got {line[:80]!r}; serialise with "
                    "orjson.OPT_APPEND_NEWLINE"
                )
        return self._write_data(b"".join(lines), len(lines))

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

    def close(self) -> None:
        """Flush and close. Idempotent. If lines are still unwritten, they are lost:
        :class:`~twinkle.errors.WriteError` says how many."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._backlog:
                    self._drain(b"", 0)
                elif self._fsync:
                    self._sync()
            except WriteError as exc:
                lost = self._backlog_lines
                raise WriteError(
                    exc.errno,
                    f"closing {str(self.path)!r} lost {lost} unwritten line(s): {exc.strerror}",
                ) from exc
            finally:
                self._closed = True
                self._backlog = b""
                self._backlog_lines = 0
                os.close(self._fd)

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
        total = len(data)
        if total == 0:
            return
        written = 0
        try:
            written = _os_write(self._fd, data)
            while written < total:
                n = _os_write(self._fd, memoryview(data)[written:])
                if n <= 0:
                    raise OSError(_errno.EIO, "write() wrote nothing")
                written += n
        except OSError as exc:
            rest = bytes(data[written:])
            self._backlog = rest
            self._backlog_lines = rest.count(b"\n")
            self.lines_written += lines - self._backlog_lines
            raise WriteError(
                exc.errno,
                f"cannot write to {str(self.path)!r}: {exc.strerror or exc}; "
                f"{self._backlog_lines} line(s) are kept in memory and written by the next "
                "write() or flush(): free disk space or fix permissions",
            ) from exc
        self._backlog = b""
        self._backlog_lines = 0
        self.lines_written += lines
        if self._fsync:
            self._sync()

    def _sync(self) -> None:
        if not self._regular:
            return
        try:
            os.fsync(self._fd)
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

    def _line_start(self, end: int) -> int:
        """Offset just after the last ``\\n`` before ``end`` (0 if none)."""
        pos = end
        start = 0
        while pos > 0 and end - pos <= _MAX_TORN_BYTES:
            lo = max(0, pos - _CHUNK_BYTES)
            idx = self._pread(pos - lo, lo).rfind(b"\n")
            if idx >= 0:
                start = lo + idx + 1
                break
            pos = lo
        if end - start > _MAX_TORN_BYTES:
            raise ReporterError(
                f"the last line of {str(self.path)!r} is longer than "
                f"{_MAX_TORN_BYTES} bytes: this is not a JSONL file twinkle wrote; "
                "move it away or open it with append=False"
            )
        return start

    def _recover(self) -> TornLineRecovery | None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return None
        path = str(self.path)
        if self._pread(1, size - 1) != b"\n":
            start = self._line_start(size)
            tail = self._pread(size - start, start)
            if _is_json_object(tail):
                # A complete record that only lacks its newline: keep it, end the line.
                self._drain(b"\n", 0)
                recovery = TornLineRecovery(
                    path, size, 0, None, "complete last record lacked its newline; added it"
                )
                logger.warning("%s: %s", path, recovery.reason)
                return recovery
            reason = "last line has no trailing newline (write interrupted)"
        else:
            start = self._line_start(size - 1)
            tail = self._pread(size - start, start)
            if not tail.strip() or _is_json(tail):
                return None
            reason = "last line is not valid JSON"
        sidecar = self.path.with_name(self.path.name + ".torn")
        entry = {
            "path": path,
            "offset": start,
            "torn_bytes": len(tail),
            "reason": reason,
            "text": tail.decode("utf-8", "replace"),
            "base64": base64.b64encode(tail).decode("ascii"),
        }
        # Sidecar first, durably; only then cut the file. A crash in between leaves the
        # torn bytes in both places, never in neither.
        try:
            with JsonlWriter(sidecar, fsync=True) as side:
                side.write([entry])
        except (ReporterError, OSError) as exc:
            raise ReporterError(
                f"{path!r} ends with a torn line ({reason}) that cannot be moved to "
                f"{str(sidecar)!r}: {exc}; make that path writable and reopen"
            ) from exc
        os.ftruncate(self._fd, start)
        os.fsync(self._fd)
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
        cheap however long the file is. Lines that are not JSON objects are skipped.
        Returns None for an empty file, a non-regular file (a device) or no match.
        """
        with self._lock:
            if self._closed:
                raise ReporterError(f"JsonlWriter for {str(self.path)!r} is closed")
            if not (self._regular and self._readable):
                return None
            pos = os.fstat(self._fd).st_size
        carry = b""
        while pos > 0:
            lo = max(0, pos - _CHUNK_BYTES)
            buf = self._pread(pos - lo, lo) + carry
            pos = lo
            lines = buf.split(b"\n")
            # The first piece may continue in the previous chunk (unless at offset 0).
            carry = lines.pop(0) if pos > 0 else b""
            for line in reversed(lines):
                obj = self._parse_object(line)
                if obj is not None and (predicate is None or predicate(obj)):
                    return obj
        if carry:
            obj = self._parse_object(carry)
            if obj is not None and (predicate is None or predicate(obj)):
                return obj
        return None

    @staticmethod
    def _parse_object(line: bytes) -> dict[str, Any] | None:
        if not line.strip():
            return None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None


class JsonlReader(Iterator[dict[str, Any]]):
    """Iterator over the JSON objects of a JSONL file (see :func:`read_jsonl`).

    ``skipped`` counts the lines ``on_error="skip"`` passed over; ``skipped_lines``
    holds their 1-based line numbers. Blank lines are ignored and not counted.
    ``lineno`` is the line number of the object returned last. ``torn_line`` and
    ``torn_bytes`` describe a torn last line passed over (``allow_torn_tail=True``).
    """

    def __init__(
        self, path: Path, on_error: Literal["raise", "skip"], allow_torn_tail: bool = False
    ) -> None:
        self.path = path
        self.on_error = on_error
        self.allow_torn_tail = allow_torn_tail
        self.skipped = 0
        self.skipped_lines: list[int] = []
        self.lineno = 0
        self.torn_line: int | None = None
        self.torn_bytes = 0
        self.error: tuple[int, str] | None = None  # (line, why) of the line that raised
        self._it = self._lines()

    def __iter__(self) -> JsonlReader:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._it)

    def close(self) -> None:
        """Close the file early (iterating to the end closes it too)."""
        self._it.close()

    def __enter__(self) -> JsonlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bad(self, lineno: int, line: bytes, why: str) -> None:
        if self.allow_torn_tail and not line.endswith(b"\n"):
            # Only the last line can lack its newline: the write of a crashed process
            # stopped inside it. Complete JSON objects never get here.
            self.torn_line = lineno
            self.torn_bytes = len(line)
            logger.warning(
                "%s:%d: torn last line (%d byte(s) without a newline: %s) passed over",
                self.path,
                lineno,
                len(line),
                why,
            )
            return
        if self.on_error == "raise":
            self.error = (lineno, why)
            raise RecordError(
                f"{self.path!s}:{lineno}: {why}; fix or remove that line, or read with "
                "on_error='skip'"
            )
        self.skipped += 1
        self.skipped_lines.append(lineno)

    def _lines(self) -> Generator[dict[str, Any], None, None]:
        try:
            f = self.path.open("rb")
        except OSError as exc:
            raise _reporter_error(self.path, exc, "read") from exc
        loads = orjson.loads
        with f:
            for lineno, line in enumerate(f, 1):
                try:
                    obj = loads(line)
                except orjson.JSONDecodeError as exc:
                    if not line.strip():
                        continue
                    self._bad(lineno, line, f"invalid JSON ({exc})")
                    continue
                if type(obj) is not dict:
                    self._bad(lineno, line, f"expected a JSON object, got {type(obj).__name__}")
                    continue
                self.lineno = lineno
                yield obj


def read_jsonl(
    path: StrPath,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    allow_torn_tail: bool = False,
) -> JsonlReader:
    """Iterate the JSON objects of a JSONL file, lazily, in file order.

    A line that is not a JSON object raises :class:`~twinkle.errors.RecordError`
    naming ``file:line``; with ``on_error="skip"`` it is skipped and counted in the
    returned reader's ``skipped``. ``allow_torn_tail=True`` passes over a last line
    without a newline that is not a JSON object (what a crash mid-write leaves),
    logs it and notes it in ``torn_line``/``torn_bytes``; a bad line anywhere else
    is still an error. A missing file raises :class:`~twinkle.errors.ReporterError`
    when iteration starts.
    """
    if on_error not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, got {path!r}")
    return JsonlReader(Path(path), on_error, bool(allow_torn_tail))
