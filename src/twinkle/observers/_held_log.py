"""``HeldLog``: the event log's file as the run holds it open, to tell when its path no
longer leads there, to write it back from, and to make it durable.

The event log is the run: every figure is a function of it. A process that holds a
file open keeps writing into it after the file was deleted (or replaced: an editor's
save, ``mv``), and everything it writes then is gone when it closes. So the event-log
sink holds a read-only descriptor of its own on the file and compares it with the path
(device, inode, link count, size) before each batch and at close; a deleted or
replaced log is written back whole from that descriptor (what another file took its
place is moved aside, never overwritten). A truncated one cannot be: its bytes are gone.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from twinkle.errors import ReporterError, WriteError
from twinkle.reporting import ReplacingFile, sync_dir

__all__ = ["Damage", "HeldLog", "outputs_held", "refuse_outputs_without_log"]

_CHUNK: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Damage:
    """What happened to the log's file: ``what`` in words (``deleted``, ``moved away``,
    ``replaced by another file``, ``truncated from A to B bytes``); ``restorable``: the
    held file still has every byte, so it can be written back."""

    what: str
    restorable: bool


@final
class HeldLog:
    """A read-only descriptor on the file at ``path`` (opened without following a link)."""

    __slots__ = ("_fd", "_size", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ReporterError(
                f"cannot read back the event log {str(path)!r}: {exc.strerror or exc}; "
                "the run needs to read its own log: fix its permissions"
            ) from exc
        self._size = os.fstat(self._fd).st_size

    def check(self) -> Damage | None:
        """What happened to the log since the last call (None: nothing)."""
        held = os.fstat(self._fd)
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            # (read its links now: it may have gone between the two reads above)
            gone = os.fstat(self._fd).st_nlink == 0
            return Damage("deleted" if gone else "moved away", restorable=True)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return Damage("replaced by another file", restorable=True)
        was, self._size = self._size, held.st_size
        if held.st_size < was:
            return Damage(f"truncated from {was} to {held.st_size} bytes", restorable=False)
        return None

    def wrote(self, n_bytes: int) -> None:
        """The run appended ``n_bytes`` to the file: the next check expects it at least
        that much longer than at the last one. A file cut meanwhile is shorter than that
        however much the run appended after the cut (appends go to the new end), so a cut
        between a check and the write after it is found too. (Bytes the writer kept
        after a fault and wrote later are not counted here: the file is then longer than
        expected, never shorter.)"""
        self._size += n_bytes

    def restore(self) -> Path | None:
        """Write the held file back at its path, whole (a new file, fsynced, renamed into
        place); another file found there is first moved aside, to the path returned
        (None: there was none). :class:`~twinkle.errors.ReporterError` when it cannot."""
        aside = self._move_aside()
        try:
            out = ReplacingFile(self.path)
            try:
                offset = 0
                while chunk := os.pread(self._fd, _CHUNK, offset):
                    out.write(chunk)
                    offset += len(chunk)
            except BaseException:
                out.discard()
                raise
            out.commit()
        except OSError as exc:  # WriteError included
            raise ReporterError(
                f"cannot write the event log {str(self.path)!r} back: "
                f"{exc.strerror or exc}; its events are lost once this process ends"
            ) from exc
        self.reopen()
        return aside

    def _move_aside(self) -> Path | None:
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        held = os.fstat(self._fd)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return None
        aside = self.path.with_name(f"{self.path.name}.replaced-{time.time_ns()}")
        kind = "file" if stat.S_ISREG(now.st_mode) else "entry"
        try:
            os.rename(self.path, aside)
        except OSError as exc:
            raise ReporterError(
                f"cannot move the {kind} that took the event log's place, "
                f"{str(self.path)!r}, aside to {aside.name!r}: {exc.strerror or exc}"
            ) from exc
        return aside

    def reopen(self) -> None:
        """Hold the file now at the path (after it was written back)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.close(self._fd)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def sync(self) -> None:
        """fsync the file (whichever descriptor wrote it) and its directory (its entry:
        the file may be new). :class:`~twinkle.errors.WriteError` when it fails."""
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise WriteError(
                exc.errno, f"fsync of the event log {str(self.path)!r} failed: {exc.strerror}"
            ) from exc
        sync_dir(self.path.parent)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def refuse_outputs_without_log(log: Path, outputs: Iterable[str]) -> None:
    """:class:`~twinkle.errors.ReporterError` when ``log`` is missing or empty but one
    of the ``outputs`` beside it holds something: an earlier run's records whose log was
    deleted. A new run there would append its iterations to them (doubling iterations),
    and nothing can rebuild them."""
    gone = "was deleted"
    try:
        if os.stat(log, follow_symlinks=False).st_size:
            return
        gone = "is empty"
    except FileNotFoundError:
        pass
    left = outputs_held(log.parent, outputs)
    if left:
        raise ReporterError(
            f"run directory {str(log.parent)!r} holds {', '.join(left)} of an earlier run "
            f"but no event log ({log.name} {gone}): a new run there would add its "
            "iterations to those records, and without the log they cannot be rebuilt; "
            "move the directory away (or restore its events.jsonl), or choose another run id"
        )


def outputs_held(run_dir: Path, outputs: Iterable[str]) -> list[str]:
    """The ``outputs`` that are files in ``run_dir`` with something in them."""
    return [name for name in outputs if _holds_bytes(run_dir / name)]


def _holds_bytes(path: Path) -> bool:
    """A regular file with something in it (a planted link is refused by name later)."""
    try:
        found = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_size > 0
