"""``ReplacingFile``: a file written whole or not at all (``trace.json``).

* The bytes go to a new temporary file beside the target, created with ``O_EXCL |
  O_NOFOLLOW``; :meth:`ReplacingFile.commit` fsyncs it, renames it over the target and
  fsyncs the directory. A reader never sees a half-written file; a crash or
  :meth:`ReplacingFile.discard` leaves the previous file (or none) as it was.
* No symbolic link is followed or written through (a planted symlink is a
  :class:`~twinkle.errors.ReporterError` naming it).
* The temporaries that writers killed before their commit left are removed by the next
  writer of the same file.
* :func:`remove_shared_write`: what another library created in a run directory (a
  plugin's backend) made writable only by its owner, as twinkle's own files are.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import glob
import logging
import os
import stat
from pathlib import Path
from typing import IO, ClassVar

from twinkle.errors import InvalidArgumentError, ReporterError, WriteError
from twinkle.reporting._jsonl_files import FILE_MODE, StrPath, make_dirs, reporter_error

__all__ = ["ReplacingFile", "remove_shared_write", "sync_dir"]

logger = logging.getLogger("twinkle.reporting")


class ReplacingFile:
    """A file written whole or not at all (``trace.json``): the bytes go to a new
    temporary file in the same directory (``.<name>.<pid>.<random>.tmp``, created with
    ``O_EXCL | O_NOFOLLOW``), which :meth:`commit` fsyncs and renames over ``path`` (then
    fsyncs the directory). A reader never sees a half-written file, and a crash, or
    :meth:`discard`, leaves the previous file (or none) as it was.

    ``path`` itself must not be a symlink (:class:`~twinkle.errors.ReporterError` naming
    it). Opening it creates missing parent directories (mode 0755) and removes the
    temporary files of ``path`` that writers killed before their commit left (those of
    processes no longer alive here, or of an earlier process with this one's pid, as a
    container's first process restarted has; not this process's own); the file gets
    mode 0644 less the umask. Not thread-safe: one writer at a time.
    """

    __slots__ = ("_file", "path", "tmp")

    #: the temporary files this process has open (a killed earlier process may have had
    #: the same pid, a container's first process: its files are stale, these are not)
    _open_here: ClassVar[set[Path]] = set()

    def __init__(self, path: StrPath, *, buffering: int = 1 << 20) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(f"path must be a str or os.PathLike, got {path!r}")
        self.path = Path(path)
        if self.path.is_symlink():
            raise reporter_error(self.path, OSError(_errno.ELOOP, "symlink"), "write")
        parent = self.path.parent
        try:
            make_dirs(parent)
        except OSError as exc:
            raise reporter_error(parent, exc, "create the directory") from exc
        self._remove_stale()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        while True:
            self.tmp = parent / f".{self.path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            try:
                fd = os.open(self.tmp, flags, FILE_MODE)
                ReplacingFile._open_here.add(self.tmp)
                break
            except FileExistsError:
                continue  # a name taken (by a planted file too): draw another
            except OSError as exc:
                raise reporter_error(self.path, exc, "create a temporary file beside") from exc
        self._file: IO[bytes] | None = os.fdopen(fd, "wb", buffering=buffering)

    def _remove_stale(self) -> None:
        prefix = f".{self.path.name}."
        for tmp in self.path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
            pid = tmp.name[len(prefix) :].split(".", 1)[0]
            if not pid.isdigit() or tmp in self._open_here:
                continue
            if int(pid) != os.getpid() and _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                tmp.unlink()  # (unlink removes a link itself, never what it points at)
                logger.info("removed %s, left by process %s killed before its commit", tmp, pid)

    def write(self, data: bytes) -> None:
        """Append ``data`` (buffered). A failure (a full disk, a file size limit) is a
        :class:`~twinkle.errors.WriteError` whose ``filename`` is :attr:`path` (the
        caller discards)."""
        if self._file is None:
            raise ReporterError(f"{str(self.path)!r} was committed or discarded already")
        try:
            self._file.write(data)
        except OSError as exc:
            raise self._failed(exc) from exc

    def flush(self) -> None:
        """Hand what was written to the temporary file (no fsync): a checkpoint marks
        how much of it there is. Fails as :meth:`write` does."""
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> WriteError:
        """A failed write or flush, as a :class:`~twinkle.errors.WriteError` of :attr:`path`."""
        return WriteError(exc.errno, exc.strerror or str(exc), str(self.path))

    def commit(self) -> None:
        """Flush, fsync, rename over ``path``, fsync the directory. On failure the
        temporary file is removed, the previous ``path`` is kept and
        :class:`~twinkle.errors.WriteError` says so."""
        f, self._file = self._file, None
        if f is None:
            return
        try:
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()
            # rename() replaces a link planted meanwhile; it never writes through one.
            os.replace(self.tmp, self.path)
            ReplacingFile._open_here.discard(self.tmp)
        except OSError as exc:
            self._unlink()
            raise WriteError(
                exc.errno,
                f"cannot write {str(self.path)!r}: {exc.strerror or exc}; the previous file "
                "(if any) is kept: free disk space or fix permissions",
            ) from exc
        sync_dir(self.path.parent)

    def discard(self) -> None:
        """Drop what was written: ``path`` stays as it was. Idempotent."""
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(OSError):  # the bytes are being thrown away
                f.close()
            self._unlink()

    def _unlink(self) -> None:
        ReplacingFile._open_here.discard(self.tmp)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    @property
    def closed(self) -> bool:
        return self._file is None

    def __repr__(self) -> str:
        return f"ReplacingFile({str(self.path)!r}, {'closed' if self.closed else 'open'})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def sync_dir(directory: Path) -> None:
    """fsync a directory (its entries: a file created or renamed in it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        logger.debug("cannot open %s to fsync it: %s", directory, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        raise WriteError(
            exc.errno, f"fsync of the directory {str(directory)!r} failed: {exc.strerror}"
        ) from exc
    finally:
        os.close(fd)


#: the write permission of the group and of others
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def remove_shared_write(path: StrPath) -> None:
    """Remove the group's and others' write permission from ``path`` and everything
    under it (symbolic links are left alone): files a library creates with its own modes
    (0666 and 0777 less the umask: under ``umask 000``, writable by every user) end as
    twinkle's own do (:data:`FILE_MODE` and :data:`DIR_MODE` less the umask). Entries
    removed meanwhile are passed over; other errors raise ``OSError``."""
    _remove_shared_write(str(path))
    for root, dirs, files in os.walk(path):  # (links to directories are not walked)
        for name in (*dirs, *files):
            _remove_shared_write(os.path.join(root, name))


def _remove_shared_write(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
        # (a link put in the entry's place since would have this chmod act on its target:
        # it only ever takes permissions away, from a file of this user's)
        if not stat.S_ISLNK(mode) and mode & _SHARED_WRITE:
            os.chmod(path, stat.S_IMODE(mode) & ~_SHARED_WRITE)
    except FileNotFoundError:
        pass  # removed meanwhile (a library's temporary file)
