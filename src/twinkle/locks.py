"""Narrow, host-wide file locks (on ``filelock``) with timeouts that name the holder.

A :class:`FileLock` serialises one short critical section across threads *and*
processes of the same user on one host (e.g. choosing and recording ports). Lock files
live in a caller-chosen directory or in the per-user runtime directory
(:func:`runtime_dir`), never in the working directory. Nothing is created or read at
import: the directory is resolved when a lock is first built.

While held, a small sidecar ``<name>.holder.json`` records who holds the lock (pid,
thread, host, since when) so that a timeout can say which process to look at.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import os
import shutil
import socket
import stat
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, final

import filelock
import orjson
import psutil

from twinkle.checks import check_seconds
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    LockTimeoutError,
    ReporterError,
    RunDirInUseError,
)
from twinkle.forks import forget_in_child

__all__ = [
    "RUN_LOCK_FILE",
    "FileLock",
    "LockHolder",
    "RunDirLock",
    "process_alive",
    "process_dir",
    "runtime_dir",
]

_RUNTIME_SUBDIR: Final = "twinkle"
_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o600
_UNSAFE_DIR_BITS: Final = stat.S_IRWXG | stat.S_IRWXO


class _Unset(enum.Enum):
    TOKEN = 0


_UNSET: Final = _Unset.TOKEN


def runtime_dir() -> Path:
    """The per-user directory for twinkle's lock and registry files, created on first use.

    ``$TWINKLE_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/twinkle``, else
    ``/tmp/twinkle-<uid>``; created with mode 0700. An existing directory must be owned
    by the current user and not be accessible to others (a shared ``/tmp`` must not let
    another user plant files we would trust).
    """
    explicit = os.environ.get("TWINKLE_RUNTIME_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if explicit:
        path = Path(explicit)
    elif xdg and Path(xdg).is_dir():
        path = Path(xdg) / _RUNTIME_SUBDIR
    else:
        path = Path("/tmp") / f"twinkle-{os.getuid()}"
    return _ensure_private_dir(path)


def process_dir(kind: str) -> Path:
    """A new private directory of this process: ``<runtime dir>/<kind>/<pid>-<start>-<n>``
    (mode 0700; ``start`` is the process's start time in ms, so a reused pid is another
    owner). The directories of ``kind`` whose owner no longer runs are removed first: a
    process killed outright leaves its directory behind only until the next one of the
    same kind is made. The caller removes its own when done."""
    if not kind or kind != Path(kind).name or kind.startswith("."):
        raise InvalidArgumentError(f"kind={kind!r} is not a plain directory name, e.g. 'ddp'")
    parent = _ensure_private_dir(runtime_dir() / kind)
    _remove_dead_owners(parent)
    me = os.getpid()
    owner = f"{me}-{_start_ms(me)}"
    while True:
        path = parent / f"{owner}-{os.urandom(4).hex()}"
        try:
            path.mkdir(mode=_DIR_MODE)
            return path
        except FileExistsError:
            continue


def process_alive(pid: int, start_ms: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie) and, with ``start_ms``, is the one
    that started then (to 1 s: a reused pid is another process)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started_ms = int(proc.create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # another user's process
    return start_ms is None or abs(started_ms - start_ms) <= 1000


def _start_ms(pid: int) -> int:
    return int(psutil.Process(pid).create_time() * 1000)


def _remove_dead_owners(parent: Path) -> None:
    for entry in parent.iterdir():
        pid, _, rest = entry.name.partition("-")
        start = rest.partition("-")[0]
        if not (pid.isdigit() and start.isdigit()) or process_alive(int(pid), int(start)):
            continue  # not one of ours, or its owner runs
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _ensure_dir(path: Path) -> Path:
    """A caller-chosen directory: created if missing, its permissions left to the caller."""
    try:
        path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"directory={str(path)!r} cannot be created: {exc}; pass a writable directory"
        ) from exc
    if not path.is_dir():
        raise InvalidArgumentError(f"directory={str(path)!r} is not a directory")
    return path


def _ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) if missing; refuse one that is not ours or not private."""
    try:
        path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the twinkle runtime directory {str(path)!r}: {exc}; "
            "set TWINKLE_RUNTIME_DIR or pass directory= to a writable place"
        ) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"twinkle runtime directory {str(path)!r} is not a directory (a symlink or file); "
            "remove it or set TWINKLE_RUNTIME_DIR"
        )
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"twinkle runtime directory {str(path)!r} is owned by uid {st.st_uid}, "
            f"not by us (uid {os.getuid()}); remove it or set TWINKLE_RUNTIME_DIR"
        )
    if st.st_mode & _UNSAFE_DIR_BITS:
        os.chmod(path, _DIR_MODE)
    return path


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds (or last held) a lock, as recorded in its sidecar file."""

    pid: int
    thread: str
    hostname: str
    acquired_unix_ns: int
    alive: bool  # whether a process with that pid exists now

    def describe(self, now_unix_ns: int) -> str:
        """One line for error messages: pid, thread, host, how long it has held the lock."""
        held_s = max(0, now_unix_ns - self.acquired_unix_ns) / 1e9
        state = "" if self.alive else ", no longer running"
        return (
            f"pid {self.pid} (thread {self.thread!r} on {self.hostname}{state}), "
            f"held for {held_s:.1f} s"
        )


@final
class FileLock:
    """An exclusive lock on ``<directory>/<name>.lock``, across threads and processes.

    Not re-entrant: a second :meth:`acquire` from any thread (also the holder's) waits.
    ``timeout_s`` bounds every wait (``None`` waits forever); on timeout
    :class:`~twinkle.errors.LockTimeoutError` names the lock file and the holder.
    Keep the critical section short: the point of this lock is that only the step that
    truly conflicts is serialised.
    """

    __slots__ = ("_file_lock", "_holder_path", "_local", "path", "timeout_s")

    def __init__(
        self,
        name: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        timeout_s: float | None = 60.0,
    ) -> None:
        if not name or name != Path(name).name or name.startswith("."):
            raise InvalidArgumentError(
                f"name={name!r} is not a plain file name; pass a name such as 'ports' "
                "(the lock file is <directory>/<name>.lock)"
            )
        _check_timeout(timeout_s)
        base = runtime_dir() if directory is None else _ensure_dir(Path(directory))
        self.path: Path = base / f"{name}.lock"
        self.timeout_s = timeout_s
        self._holder_path = base / f"{name}.holder.json"
        # filelock counts re-entries per object; this lock makes the object exclusive
        # between threads too, so a second thread waits instead of "re-entering".
        self._local = threading.Lock()
        self._file_lock = filelock.FileLock(
            str(self.path), timeout=-1, mode=_FILE_MODE, thread_local=False
        )

    @property
    def is_locked(self) -> bool:
        """Whether this object currently holds the lock."""
        return self._file_lock.is_locked

    def acquire(self, timeout_s: float | _Unset | None = _UNSET) -> None:
        """Wait for the lock (``timeout_s`` overrides the constructor's for this call)."""
        limit = self.timeout_s if isinstance(timeout_s, _Unset) else timeout_s
        _check_timeout(limit)
        deadline = None if limit is None else time.monotonic() + limit
        if not self._local.acquire(timeout=-1 if limit is None else limit):
            raise self._timeout_error(limit)
        try:
            remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._file_lock.acquire(timeout=remaining, poll_interval=0.005)
            except filelock.Timeout:
                raise self._timeout_error(limit) from None
            self._write_holder()
        except BaseException:
            if self._file_lock.is_locked:
                self._file_lock.release()
            self._local.release()
            raise

    def release(self) -> None:
        """Release the lock; raises ``RuntimeError`` if this object does not hold it."""
        if not self._local.locked():
            raise RuntimeError(f"lock {str(self.path)!r} released but not held")
        try:
            self._holder_path.unlink(missing_ok=True)
        finally:
            try:
                self._file_lock.release()
            finally:
                self._local.release()

    def holder(self) -> LockHolder | None:
        """The holder recorded in the sidecar, or ``None`` if none is recorded."""
        try:
            data = orjson.loads(self._holder_path.read_bytes())
            pid = int(data["pid"])
            hostname = str(data.get("hostname", "?"))
            return LockHolder(
                pid=pid,
                thread=str(data.get("thread", "?")),
                hostname=hostname,
                acquired_unix_ns=int(data.get("acquired_unix_ns", 0)),
                # a pid on another host (shared file system) cannot be checked from here
                alive=psutil.pid_exists(pid) if hostname == socket.gethostname() else True,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_holder(self) -> None:
        record = {
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "hostname": socket.gethostname(),
            "acquired_unix_ns": time.time_ns(),
        }
        tmp = self._holder_path.with_name(f"{self._holder_path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
        with open(fd, "wb") as f:
            f.write(orjson.dumps(record))
        os.replace(tmp, self._holder_path)

    def _timeout_error(self, timeout_s: float | None) -> LockTimeoutError:
        holder = self.holder()
        who = (
            f"held by {holder.describe(time.time_ns())}"
            if holder is not None
            else "holder not recorded"
        )
        return LockTimeoutError(
            f"could not acquire lock {str(self.path)!r} within {timeout_s} s ({who}); "
            "wait for that process to finish, raise timeout_s, or stop the holder if it is stuck"
        )

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FileLock({str(self.path)!r}, timeout_s={self.timeout_s!r})"


def _check_timeout(timeout_s: object) -> None:
    # inf and True were taken once: inf broke acquire() (OverflowError), True meant 1 s
    check_seconds("timeout_s", timeout_s, none_ok=True, none_means="to wait forever")


RUN_LOCK_FILE: Final = ".twinkle.lock"
"""The lock file of a run directory (its content names the live writer)."""


@final
class RunDirLock:
    """One live writer per run directory: an exclusive ``flock`` on
    ``<run dir>/.twinkle.lock``, held from a run's start to its close.

    The lock file holds the owner's pid, host and start time (JSON), so a refusal says
    who writes the directory. The kernel drops the lock when its owner dies, however it
    dies (SIGKILL, OOM): a dead owner's lock is reclaimed by the next process, which
    overwrites the stale content. An owner removes the file as it gives the directory up
    (a run directory holds only the run's files); a process that locked the file just
    removed checks it still is the one at the path, and tries again if not. A forked
    child closes its copy of the descriptor without unlocking (the lock stays its
    parent's). Hand-written on ``fcntl.flock``
    rather than :mod:`filelock`: the lock must be held for a whole run on a descriptor
    this class owns, carry its holder inside the file, and survive a fork in the parent
    only — none of which ``filelock`` offers.
    """

    __slots__ = ("__weakref__", "_fd", "path")

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / RUN_LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, run_id: str) -> None:
        """Take the directory, or raise :class:`~twinkle.errors.RunDirInUseError` naming
        the live process that has it (never waits)."""
        if self._fd is not None:
            raise RunDirInUseError(f"{str(self.path.parent)!r} is already held by this run")
        for _ in range(100):
            fd = self._open()
            try:
                if not self._lock(fd):
                    continue  # the file was removed by its last owner meanwhile: again
                owner = {
                    "pid": os.getpid(),
                    "hostname": socket.gethostname(),
                    "run_id": run_id,
                    "since_unix_ns": time.time_ns(),
                }
                os.ftruncate(fd, 0)
                os.pwrite(fd, orjson.dumps(owner) + b"\n", 0)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            forget_in_child(_run_locks_after_fork_in_child)
            _held_run_locks.add(self)
            return
        raise RunDirInUseError(  # pragma: no cover - 100 owners in a row came and went
            f"run directory {str(self.path.parent)!r} kept changing hands; try again"
        )

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise ReporterError(
                f"cannot open the run directory's lock {str(self.path)!r}: "
                f"{exc.strerror or exc}; the run directory must be a writable directory "
                "(a symlink in its place is refused)"
            ) from exc

    def _lock(self, fd: int) -> bool:
        """Lock ``fd``; False when its file is no longer the one at :attr:`path` (an
        owner removes the file as it gives the directory up, so a lock taken on the old
        file is no lock at all)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUseError(
                f"run directory {str(self.path.parent)!r} is in use by {_read_holder(fd)}: "
                "one live process writes a run at a time; wait for it to finish, stop it, "
                "or choose another run id"
            ) from None
        except OSError as exc:  # a file system without flock: no guard, as before
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return True
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            return False
        held = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev):
            os.close(fd)
            return False
        return True

    def release(self) -> None:
        """Give the directory up (idempotent); the lock file goes with it."""
        fd, self._fd = self._fd, None
        _held_run_locks.discard(self)
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while locked: no one holds the old file
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def _forget_in_child(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # never LOCK_UN: that would free the parent's lock


def _read_holder(fd: int) -> str:
    try:
        data = orjson.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, orjson.JSONDecodeError):
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "another process (it has not recorded its pid yet)"
    pid = data.get("pid")
    alive = isinstance(pid, int) and psutil.pid_exists(pid)
    since = data.get("since_unix_ns")
    held = f", for {max(0, time.time_ns() - since) / 1e9:.0f} s" if isinstance(since, int) else ""
    return (
        f"pid {pid} on {data.get('hostname', '?')} (run {data.get('run_id', '?')!r}"
        f"{held}{'' if alive else '; that pid is not running here: another host?'})"
    )


_held_run_locks: weakref.WeakSet[RunDirLock] = weakref.WeakSet()


def _run_locks_after_fork_in_child() -> None:
    for lock in list(_held_run_locks):
        lock._forget_in_child()
