"""The low-level file pieces that the JSONL writer, the reader and
:class:`~twinkle.reporting.ReplacingFile` share.

* No symbolic link is followed: every file is opened with ``O_NOFOLLOW`` (a planted
  symlink is a :class:`~twinkle.errors.ReporterError` naming it).
* One sidecar per JSONL file, ``<name>.torn`` (:func:`sidecar_path`): the writer records
  torn tails and co-appenders' unfinished lines there, the reader recognises the latter.
* One way to say that a path cannot be opened, created or read
  (:func:`reporter_error`): what is wrong with which path, and how to fix it.
"""

from __future__ import annotations

import errno as _errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from twinkle.errors import ReporterError

__all__ = [
    "CHUNK_BYTES",
    "DIR_MODE",
    "FILE_MODE",
    "Opened",
    "StrPath",
    "make_dirs",
    "open_appending",
    "open_regular",
    "real_path",
    "reporter_error",
    "sidecar_path",
]

#: Files are read back (backwards scans, bounded line reads) this many bytes at a time.
CHUNK_BYTES = 1 << 16
FILE_MODE = 0o644
DIR_MODE = 0o755

StrPath = str | os.PathLike[str]


def sidecar_path(path: Path) -> Path:
    """The sidecar of a JSONL file: ``<name>.torn``."""
    return path.with_name(path.name + ".torn")


def reporter_error(path: Path, exc: OSError, doing: str) -> ReporterError:
    why = exc.strerror or type(exc).__name__
    if exc.errno == _errno.ELOOP:
        why = "it is a symbolic link"
        fix = (
            "twinkle never writes through a symlink (it could point anywhere outside the "
            "run directory): remove the link (a run makes its own files in place), or, "
            "writing a file of your own, pass the real file's path"
        )
    elif isinstance(exc, IsADirectoryError):
        fix = "pass a file path inside it, e.g. <dir>/metrics_raw.jsonl"
    elif isinstance(exc, PermissionError):
        fix = "fix the permissions or choose a writable directory"
    elif isinstance(exc, NotADirectoryError | FileExistsError):
        fix = "a parent of the path is a file: choose another path"
    else:
        fix = "check the path and the file system"
    return ReporterError(f"cannot {doing} {str(path)!r}: {why}; {fix}")


# -- opening ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Opened:
    fd: int
    readable: bool
    dir_fd: int  # the parent directory, kept to fsync it when the file was created; -1


def real_path(path: Path) -> Path:
    """``path`` absolute, its links followed as far as they go: a loop of links is left
    as it is, for whatever opens the path to refuse by name (``Path.resolve()`` raises a
    bare ``RuntimeError`` there)."""
    return Path(os.path.realpath(path))


def make_dirs(path: Path) -> None:
    """Create the directory ``path`` and its missing parents, each :data:`DIR_MODE` less
    the umask: ``Path.mkdir(parents=True)`` gives the parents 0777 less the umask
    (under ``umask 000``, writable by every user). Raises ``OSError``."""
    missing = []
    for directory in (path, *path.parents):
        if directory.is_dir():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():  # (a file: else another process made it meanwhile)
                raise


def open_appending(path: Path, append: bool) -> Opened:
    """Open ``path`` for appending (creating parents), never through a symlink."""
    parent = path.parent
    if not parent.is_dir():
        try:
            make_dirs(parent)
        except OSError as exc:
            raise reporter_error(parent, exc, "create the directory") from exc
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise reporter_error(parent, exc, "open the directory") from exc
    try:
        fd, readable, created = _open_in(dir_fd, path, append)
    except BaseException:
        os.close(dir_fd)
        raise
    if not created:
        os.close(dir_fd)
        dir_fd = -1
    return Opened(fd, readable, dir_fd)


def _open_once(dir_fd: int, name: str, flags: int) -> tuple[int, bool]:
    """(fd, created): create ``name`` exclusively, else open the existing file."""
    for _ in range(8):  # it may vanish between the two opens: try again
        try:
            return os.open(name, flags | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dir_fd), True
        except FileExistsError:
            pass
        try:
            return os.open(name, flags, dir_fd=dir_fd), False
        except FileNotFoundError:
            continue
    raise FileNotFoundError(_errno.ENOENT, "the file keeps vanishing while it is opened")


def _open_in(dir_fd: int, path: Path, append: bool) -> tuple[int, bool, bool]:
    """(fd, readable, created) of ``path.name`` in the directory ``dir_fd``."""
    flags = os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    if not append:
        flags |= os.O_TRUNC
    try:
        try:
            fd, created = _open_once(dir_fd, path.name, flags | os.O_RDWR)
            return fd, True, created
        except PermissionError:
            # A write-only file: still usable, without recovery and last_object.
            fd, created = _open_once(dir_fd, path.name, flags | os.O_WRONLY)
            return fd, False, created
    except IsADirectoryError:
        raise ReporterError(
            f"JSONL path {str(path)!r} is a directory; pass a file path inside it, "
            "e.g. <dir>/metrics_raw.jsonl"
        ) from None
    except OSError as exc:
        raise reporter_error(path, exc, "open") from exc


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file, else an :class:`OSError`
    saying what it is: no symbolic link is followed and a FIFO is not waited on, so a
    planted entry never hangs a reader nor has it read a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if path.is_symlink():
            raise OSError(f"{path.name} is a symbolic link, which twinkle never follows") from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{path.name} is not a regular file (mode {stat.filemode(mode)})")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")
