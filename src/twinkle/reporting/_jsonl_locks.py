"""The byte-range locks by which JSONL writers of one file (threads or processes) see
each other: the shared lock an open writer holds and the write lock around each batch.

Two one-byte ranges far past any real end of file. An open writer holds a read lock on
:data:`LIVE_AT` (an opener that cannot take it exclusively is not alone); a writer holds
a write lock on :data:`WRITE_AT` around each write (its check of the file's end and its
write are one step for every writer). Linux has open-file-description locks: they belong
to the descriptor (two writers in one process exclude each other too, and closing another
descriptor of the file drops nothing). Elsewhere classic POSIX locks: per process.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import logging
import os
import struct
import sys

__all__ = ["LIVE_AT", "WRITE_AT", "range_lock", "write_lock", "write_unlock"]

logger = logging.getLogger("twinkle.reporting")

LIVE_AT = 1 << 62
WRITE_AT = LIVE_AT + 1
_OFD = sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLK")


def range_lock(fd: int, kind: int, at: int, *, wait: bool) -> bool:
    """Lock (``F_RDLCK``/``F_WRLCK``) or unlock (``F_UNLCK``) byte ``at`` of ``fd``.

    False only when another holder makes it busy (``wait=False``). Where the descriptor
    or the file system has no such locks the answer is True: one writer per file is then
    assumed, as before locks were taken.
    """
    while True:
        try:
            if _OFD:
                # struct flock: l_type, l_whence, l_start, l_len, l_pid (0: OFD locks)
                arg = struct.pack("hhqqi4x", kind, os.SEEK_SET, at, 1, 0)
                fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, arg)
            else:  # pragma: no cover - not Linux
                how = {fcntl.F_RDLCK: fcntl.LOCK_SH, fcntl.F_WRLCK: fcntl.LOCK_EX}
                cmd = how.get(kind, fcntl.LOCK_UN) | (0 if wait else fcntl.LOCK_NB)
                fcntl.lockf(fd, cmd, 1, at)
        except InterruptedError:
            continue
        except OSError as exc:
            if not wait and exc.errno in (_errno.EAGAIN, _errno.EACCES):
                return False
            logger.debug("lock of fd %d unsupported here (%s): no cross-process guard", fd, exc)
        return True


if _OFD:
    # The write lock is taken around every batch: its arguments are packed once.
    _WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, WRITE_AT, 1, 0)
    _WRITE_UNLOCK = struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, WRITE_AT, 1, 0)


def write_lock(fd: int) -> bool:
    """Take the write lock of ``fd`` (waiting for the writer holding it); False where
    the file system has no locks."""
    if not _OFD:  # pragma: no cover - not Linux
        return range_lock(fd, fcntl.F_WRLCK, WRITE_AT, wait=True)
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _WRITE_LOCK)
        except InterruptedError:
            continue
        except OSError as exc:
            logger.debug("lock of fd %d unsupported here (%s): no cross-process guard", fd, exc)
            return False
        return True


def write_unlock(fd: int) -> None:
    if not _OFD:  # pragma: no cover - not Linux
        range_lock(fd, fcntl.F_UNLCK, WRITE_AT, wait=False)
        return
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_UNLOCK)
