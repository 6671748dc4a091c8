"""What :class:`~twinkle.reporting.JsonlWriter` does with a line that is not whole.

* **A torn last line** (the write of a crashed process stopped inside it), found when a
  writer opens a file in append mode with no other writer on it: the torn bytes are moved
  to the sidecar (``<name>.torn``, one JSON line per part, base64 and a text preview) and
  the file is truncated back to its last complete line (:func:`move_to_sidecar`). A last
  record that is complete but lacks its newline is kept: the writer ends it
  (:func:`newline_added`). What was done is a :class:`TornLineRecovery`.
* **A co-appender's unfinished line** (another writer killed in the middle of its
  write), found under the write lock before a batch: recorded in the sidecar
  (``"kind": "fragment"``, its offset, length and sha256; the bytes stay in the file) so
  that readers recognise exactly those bytes and pass over them (:func:`record_fragment`).

The sidecar itself is written by the caller's ``write_sidecar`` (the writer passes one
that appends through a :class:`~twinkle.reporting.JsonlWriter` of its own, durably): this
module reads the file and decides, the writer module writes.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.errors import ReporterError
from twinkle.reporting._jsonl_files import sidecar_path
from twinkle.reporting._jsonl_tail import is_json, is_json_object, line_start, pread

__all__ = [
    "TornLineRecovery",
    "TornTail",
    "WriteSidecar",
    "find_torn_tail",
    "move_to_sidecar",
    "newline_added",
    "record_fragment",
]

logger = logging.getLogger("twinkle.reporting")

# A torn tail is moved to the sidecar in parts of at most this many bytes, so that each
# sidecar line (base64 and a text preview) stays far below MAX_LINE_BYTES.
_SIDECAR_PART_BYTES = 8 << 20
_PREVIEW_CHARS = 1000

#: Appends entries to a sidecar, one line each, durably (raises ReporterError/OSError).
WriteSidecar = Callable[[Path, Sequence[dict[str, Any]]], None]


@dataclass(frozen=True, slots=True)
class TornLineRecovery:
    """What :class:`JsonlWriter` found at the end of a file it opened in append mode."""

    path: str
    offset: int  # byte offset where the torn bytes began; the file now ends there
    torn_bytes: int  # bytes moved to the sidecar (0: only a missing newline was added)
    sidecar: str | None  # the sidecar file holding them, None when nothing was moved
    reason: str


@dataclass(frozen=True, slots=True)
class TornTail:
    """The end of a file that is not a complete line: ``tail``, from offset ``start``."""

    start: int
    tail: bytes
    reason: str
    #: a complete JSON object that only lacks its newline (kept: the writer ends it)
    complete: bool


def _preview(data: bytes) -> str:
    return data[: _PREVIEW_CHARS * 4].decode("utf-8", "replace")[:_PREVIEW_CHARS]


def find_torn_tail(fd: int, path: Path, limit: int) -> TornTail | None:
    """The torn last line of the file open on ``fd``; None when the file is empty or ends
    in a complete line (JSON or blank). A last line longer than ``limit`` raises
    :class:`~twinkle.errors.ReporterError`: twinkle did not write that file."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    if pread(fd, 1, size - 1) != b"\n":
        start = line_start(fd, size, limit)
        reason = "last line has no trailing newline (write interrupted)"
    else:
        start = line_start(fd, size - 1, limit)
        reason = "last line is not valid JSON"
    if start is None:
        raise ReporterError(
            f"the last line of {str(path)!r} is longer than MAX_LINE_BYTES={limit} "
            "bytes: this is not a JSONL file twinkle wrote; move it away or open it "
            "with append=False"
        )
    tail = pread(fd, size - start, start)
    if not tail.endswith(b"\n"):
        return TornTail(start, tail, reason, complete=is_json_object(tail))
    if not tail.strip() or is_json(tail):
        return None
    return TornTail(start, tail, reason, complete=False)


def newline_added(path: Path, size: int) -> TornLineRecovery:
    """The recovery of a complete last record that lacked its newline (``size``: the
    file's size before the writer added it), logged."""
    recovery = TornLineRecovery(
        str(path), size, 0, None, "complete last record lacked its newline; added it"
    )
    logger.warning("%s: %s", recovery.path, recovery.reason)
    return recovery


def _torn_entries(path: str, torn: TornTail) -> list[dict[str, Any]]:
    """The sidecar lines of a torn tail: a long tail in several parts, each line well
    within the line limit."""
    start, tail = torn.start, torn.tail
    parts = max(1, -(-len(tail) // _SIDECAR_PART_BYTES))
    entries = []
    for k in range(parts):
        piece = tail[k * _SIDECAR_PART_BYTES : (k + 1) * _SIDECAR_PART_BYTES]
        entry: dict[str, Any] = {
            "kind": "torn_tail",
            "path": path,
            "offset": start,
            "torn_bytes": len(tail),
            "reason": torn.reason,
            "text": _preview(piece),
            "base64": base64.b64encode(piece).decode("ascii"),
        }
        if parts > 1:
            entry.update(part=k, parts=parts, part_offset=start + k * _SIDECAR_PART_BYTES)
        entries.append(entry)
    return entries


def move_to_sidecar(
    fd: int, path: Path, torn: TornTail, write_sidecar: WriteSidecar
) -> TornLineRecovery:
    """Move ``torn`` to the sidecar, then truncate the file (on ``fd``) where it began."""
    name = str(path)
    sidecar = sidecar_path(path)
    # Sidecar first, durably; only then cut the file. A crash in between leaves the torn
    # bytes in both places, never in neither.
    try:
        write_sidecar(sidecar, _torn_entries(name, torn))
    except (ReporterError, OSError) as exc:
        raise ReporterError(
            f"{name!r} ends with a torn line ({torn.reason}) that cannot be moved to "
            f"{str(sidecar)!r}: {exc}; make that path writable and reopen"
        ) from exc
    os.ftruncate(fd, torn.start)
    os.fsync(fd)
    recovery = TornLineRecovery(name, torn.start, len(torn.tail), str(sidecar), torn.reason)
    logger.warning(
        "%s: %s; moved %d byte(s) from offset %d to %s",
        name,
        torn.reason,
        len(torn.tail),
        torn.start,
        sidecar,
    )
    return recovery


def _fragment_entry(path: str, start: int, fragment: bytes) -> dict[str, Any]:
    """The sidecar line of a co-appender's unfinished line: what readers recognise it by
    (offset, length, sha256)."""
    return {
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
        "text": _preview(fragment),
    }


def record_fragment(fd: int, path: Path, end: int, limit: int, write_sidecar: WriteSidecar) -> bool:
    """Record in the sidecar the unfinished line that ends the file at ``end`` (a
    co-appender killed mid-write; write lock held). Returns whether it was one (counted
    even when the sidecar cannot be written: the line is ended with a newline anyway);
    a complete record lacking its newline, or an overlong line, is only logged."""
    name = str(path)
    start = line_start(fd, end, limit)
    if start is None:
        logger.error(
            "%s: ends in more than %d bytes without a newline (not a line twinkle "
            "wrote); ended it with a newline before writing, not recorded",
            name,
            limit,
        )
        return False
    fragment = pread(fd, end - start, start)
    if is_json_object(fragment):
        # A complete record whose newline its writer never wrote: ending it keeps it.
        logger.warning(
            "%s: another writer's last record (offset %d) lacked its newline; ended it",
            name,
            start,
        )
        return False
    sidecar = sidecar_path(path)
    try:
        write_sidecar(sidecar, [_fragment_entry(name, start, fragment)])
    except (ReporterError, OSError) as exc:
        logger.error(
            "%s: cannot record another writer's unfinished line (offset %d, %d "
            "byte(s)) in %s: %s; it is ended with a newline, but readers will take it "
            "for corruption (read with on_error='skip')",
            name,
            start,
            len(fragment),
            sidecar,
            exc,
        )
        return True
    logger.warning(
        "%s: another writer was killed in the middle of a line (offset %d, %d "
        "byte(s)); recorded it in %s and ended it with a newline",
        name,
        start,
        len(fragment),
        sidecar,
    )
    return True
