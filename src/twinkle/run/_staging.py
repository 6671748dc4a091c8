"""Where a replay writes: a hidden directory beside its output directory, moved into
place once the replay succeeded, or removed with whatever it had to create."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from twinkle.errors import ReplayError, WriteError

__all__ = ["Staging"]


class Staging:
    """Where a replay writes: a new hidden directory beside ``target``, moved into place
    by :meth:`commit`, removed with whatever directories it had to create by
    :meth:`discard`. ``target`` is checked first: not a symlink, not a file, empty unless
    ``force``; even then, never one holding an ``events.jsonl`` that is not the start of
    ``log`` (the log replayed): another run's raw log is the one file nothing rebuilds."""

    def __init__(self, target: Path, *, force: bool, log: Path | None = None) -> None:
        if target.is_symlink():
            # The staging directory could not be renamed onto the link, and its files
            # would land wherever the link points: refused before anything is made.
            raise ReplayError(
                f"replay output {str(target)!r} is a symbolic link (to "
                f"{os.readlink(target)!r}): a replay never writes through a link; give "
                "the directory's real path, or a new one"
            )
        if target.exists() and not target.is_dir():
            raise ReplayError(f"replay output {str(target)!r} exists and is not a directory")
        if target.is_dir() and not force:
            entries = sorted(p.name for p in target.iterdir())
            if entries:
                shown = ", ".join(repr(e) for e in entries[:5])
                more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
                raise ReplayError(
                    f"replay output {str(target)!r} is not empty (it holds {shown}{more}): "
                    "choose a new or empty directory, or pass --force (force=True) to "
                    "replace its files of the replay's names"
                )
        _check_log_kept(target, log)
        self.target = target
        self._created: list[Path] = []  # ancestors this replay made, outermost first
        missing = [a for a in reversed(target.absolute().parents) if not a.exists()]
        try:
            for ancestor in missing:
                ancestor.mkdir(mode=0o755)
                self._created.append(ancestor)
            self.dir = self._make_dir(target)
        except OSError as exc:
            self._remove_created()
            raise ReplayError(
                f"replay output {str(target)!r}: cannot create "
                f"{str(exc.filename or target)!r} ({exc.strerror or exc}): choose a "
                "writable --out directory"
            ) from None

    @staticmethod
    def _make_dir(target: Path) -> Path:
        for _ in range(100):
            candidate = target.with_name(f".{target.name}.replay-{os.urandom(4).hex()}")
            try:
                candidate.mkdir(mode=0o755)  # less the umask, like every run directory
            except FileExistsError:
                continue
            return candidate
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(target))

    def commit(self) -> None:
        """Move the replay's files into ``target`` (replacing those of the same names)."""
        try:
            try:
                os.rename(self.dir, self.target)  # a new target: all at once
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    raise
            for entry in sorted(self.dir.iterdir()):
                dest = self.target / entry.name
                if dest.is_dir() and not dest.is_symlink() and entry.is_dir():
                    shutil.rmtree(dest)
                os.replace(entry, dest)
            self.dir.rmdir()
        except OSError as exc:
            raise WriteError(
                exc.errno,
                f"replay output {str(self.target)!r}: cannot move the replayed files there "
                f"from {str(self.dir)!r} ({exc.strerror or exc}); they are left in the "
                "latter: fix the permissions and move them, or replay again",
            ) from exc

    def discard(self) -> None:
        """Remove everything this replay created (never what ``target`` held before)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for ancestor in reversed(self._created):
            with contextlib.suppress(OSError):
                ancestor.rmdir()  # only while empty: never what someone put there since
        self._created.clear()


def _check_log_kept(target: Path, log: Path | None) -> None:
    """Refuse a ``target`` whose ``events.jsonl`` the replay would replace unless it is
    ``log``'s start (an earlier replay's copy of that log, or the log itself)."""
    held = target / "events.jsonl"
    if not held.is_file() or (log is not None and _starts(log, held)):
        return
    raise ReplayError(
        f"replay output {str(target)!r} holds an events.jsonl that is not the log "
        f"replayed: another run's raw log, which nothing rebuilds (--force replaces only "
        "a copy of this log); replay into another directory, or move that run first"
    )


def _starts(log: Path, held: Path, chunk: int = 1 << 20) -> bool:
    """Whether the bytes of ``held`` are the first bytes of ``log``."""
    try:
        if held.stat().st_size > log.stat().st_size:
            return False
        with log.open("rb") as a, held.open("rb") as b:
            while part := b.read(chunk):
                if a.read(len(part)) != part:
                    return False
    except OSError:
        return False
    return True
