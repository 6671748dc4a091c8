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
  huge line never costs more memory than the limit). A writer or reader may be given a
  lower one (``max_line_bytes``); without it, it takes :data:`MAX_LINE_BYTES` when it is
  built (:func:`line_limit`).
* Append mode keeps what an earlier process wrote. A torn last line left by a crash
  is moved to a sidecar (``<name>.torn``) and the file is truncated back to its last
  complete line; :attr:`JsonlWriter.recovery` says so.
* **Several processes may append to one file.** Each open writer holds a shared lock,
  and the torn-line repair on open runs only when no other writer holds it, so a live
  writer's line in progress is never taken for a torn one. Each batch is written under
  an exclusive lock that every writer honours (:mod:`twinkle.reporting._jsonl_locks`):
  under it the writer checks that the file ends at a line end (one ``fstat``; one
  ``pread`` of the last byte only when another writer wrote since). If it does not — a
  co-appender was killed in the middle of its write — the writer records the fragment
  in the sidecar and ends it with a newline before its own lines, so its lines never
  fuse onto the fragment; the reader passes over exactly those bytes
  (:attr:`~twinkle.reporting.JsonlReader.fragment_lines`).
* A failed write raises :class:`~twinkle.errors.WriteError`; the lines not yet written
  stay in memory and go out first on the next ``write``/``flush``, so a partly written
  line is completed, never duplicated (or, if another writer wrote after it, written
  again whole after a newline: its first part is then a recorded fragment).
* No symbolic link is followed (the shared ``O_NOFOLLOW`` opening of
  :mod:`twinkle.reporting._jsonl_files`).
* Durable at close: :meth:`JsonlWriter.close` fsyncs a regular file, and the directory
  once when the writer created the file, so whatever is written after a close (the
  run's ``summary.json``) never survives a power cut that the lines it sums up do not.

What is done with a line that is not whole (the torn-tail repair, a co-appender's
fragment) lives in :mod:`twinkle.reporting._jsonl_torn`, reading a file back from its end
in :mod:`twinkle.reporting._jsonl_tail`, turning a batch into lines in
:mod:`twinkle.reporting._jsonl_batch`. The reader (:class:`~twinkle.reporting.JsonlReader`,
:func:`~twinkle.reporting.read_jsonl`) lives in :mod:`twinkle.reporting.jsonl_reader`: it
imports this module (for :func:`line_limit`), never the other way round.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from twinkle.errors import InvalidArgumentError, ReporterError, WriteError
from twinkle.reporting._jsonl_batch import encode_objects, join_lines
from twinkle.reporting._jsonl_files import StrPath, open_appending, reporter_error
from twinkle.reporting._jsonl_locks import LIVE_AT, range_lock, write_lock, write_unlock
from twinkle.reporting._jsonl_tail import last_object, pread
from twinkle.reporting._jsonl_torn import (
    TornLineRecovery,
    find_torn_tail,
    move_to_sidecar,
    newline_added,
    record_fragment,
)

__all__ = ["MAX_LINE_BYTES", "JsonlWriter", "line_limit"]

#: The longest line of any JSONL file twinkle writes, its newline included: the limit of
#: every writer and reader built without ``max_line_bytes`` (read when one is built). The
#: writer refuses a longer line, the torn-tail repair and the reader take one for a file
#: twinkle did not write. (A test lowers one writer's or reader's limit with
#: ``max_line_bytes``; only a test that cannot reach the constructor, such as that of an
#: observer's writer or of replay's reader, lowers this default instead.)
MAX_LINE_BYTES = 64 << 20

# Indirection so tests can inject OS faults (partial writes, ENOSPC) without a full disk.
_os_write = os.write


def line_limit(max_line_bytes: object = None) -> int:
    """The line limit of a writer or reader: ``max_line_bytes`` checked (an int from 1 to
    :data:`MAX_LINE_BYTES`: the limit can only be lowered, so that every twinkle reader
    reads what a writer wrote), or :data:`MAX_LINE_BYTES` for None."""
    default = MAX_LINE_BYTES
    if max_line_bytes is None:
        return default
    if type(max_line_bytes) is not int or not 0 < max_line_bytes <= default:
        raise InvalidArgumentError(
            f"max_line_bytes must be an int from 1 to MAX_LINE_BYTES={default}, got "
            f"{max_line_bytes!r}; leave it out for the default"
        )
    return max_line_bytes


def _write_sidecar(sidecar: Path, entries: Sequence[dict[str, Any]]) -> None:
    """Append ``entries`` to a sidecar durably, one line per write (each line bounded)."""
    with JsonlWriter(sidecar, fsync=True) as side:
        for entry in entries:
            side.write([entry])


# -- the writer ------------------------------------------------------------------------------


class JsonlWriter:
    """Appends JSON lines to one file; thread-safe; the one JSONL writer of twinkle.

    ``append=True`` (the default) keeps existing lines and repairs a torn last line
    (see :attr:`recovery`); ``append=False`` truncates. Missing parent directories are
    created (mode 0755); new files get mode 0644 (both less the umask). ``fsync=True``
    syncs after every write; every regular file is synced at :meth:`close` either way
    (and its directory, once, when this writer created the file). A path that is a
    directory, a symlink, under a file, or not writable raises
    :class:`~twinkle.errors.ReporterError` naming it. ``max_line_bytes`` lowers the line
    limit of this writer (:func:`line_limit`; the default is :data:`MAX_LINE_BYTES`).

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
        "_max_line",
        "_readable",
        "_regular",
        "fragments",
        "lines_written",
        "path",
        "recovery",
    )

    def __init__(
        self,
        path: StrPath,
        *,
        append: bool = True,
        fsync: bool = False,
        max_line_bytes: int | None = None,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(
                f"path must be a str or os.PathLike, got {path!r}; e.g. 'runs/<id>/x.jsonl'"
            )
        self.path = Path(path)
        self._max_line = line_limit(max_line_bytes)
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
        (non-str key, unsupported type) or a line longer than :attr:`max_line_bytes`
        raises :class:`~twinkle.errors.RecordError` and nothing of the batch is written.
        A single dict, str or bytes (not an iterable of objects) raises
        :class:`~twinkle.errors.InvalidArgumentError`. An OS error raises
        :class:`~twinkle.errors.WriteError`; the batch stays in memory.
        """
        buf = encode_objects(self.path, objs, self._max_line)
        return self._write_data(buf, buf.count(10))

    def write_bytes_lines(self, lines: Sequence[bytes]) -> int:
        """Write pre-serialised lines, each one JSON value ending in exactly one ``\\n``
        and at most :attr:`max_line_bytes` long (else nothing of the batch is written)."""
        data = join_lines(self.path, lines, self._max_line)
        return self._write_data(data, len(lines))

    @property
    def max_line_bytes(self) -> int:
        """The longest line this writer writes, its newline included: ``max_line_bytes``,
        by default :data:`MAX_LINE_BYTES` (the longest line any twinkle reader reads)."""
        return self._max_line

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
                error = WriteError(
                    exc.errno,
                    f"closing {str(self.path)!r} lost {lost} unwritten line(s): {exc.strerror}",
                )
                error.lost_lines = lost
                raise error from exc
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
        if pread(self._fd, 1, size - 1) == b"\n":
            return b""
        if record_fragment(self._fd, self.path, size, self._max_line, _write_sidecar):
            self.fragments += 1
        return b"\n"

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

    # -- the file's end --------------------------------------------------------------

    def _recover(self) -> TornLineRecovery | None:
        """Repair a torn last line on open (no other writer holds the file)."""
        torn = find_torn_tail(self._fd, self.path, self._max_line)
        if torn is None:
            return None
        if torn.complete:
            # A complete record that only lacks its newline: keep it, end the line (this
            # writer takes the file's end as its own: no guard before it).
            size = torn.start + len(torn.tail)
            self._end = size
            self._drain(b"\n", 0)
            return newline_added(self.path, size)
        recovery = move_to_sidecar(self._fd, self.path, torn, _write_sidecar)
        self._end = torn.start  # the file ends at a line end now
        return recovery

    def last_object(
        self, predicate: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """The last JSON object line (satisfying ``predicate``), scanning backwards.

        Reads the file in 64 KiB chunks from its end, so finding a recent record is
        cheap however long the file is. Lines that are not JSON objects, or longer than
        this writer's line limit (:attr:`max_line_bytes`), are skipped. Returns None for
        an empty file, a non-regular file (a device) or no match.
        """
        with self._lock:
            if self._closed:
                raise ReporterError(f"JsonlWriter for {str(self.path)!r} is closed")
            if not (self._regular and self._readable):
                return None
            size = os.fstat(self._fd).st_size
        return last_object(self._fd, size, self._max_line, predicate)
