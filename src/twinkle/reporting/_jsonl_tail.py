"""Reading a JSONL file back from its end: what the writer's torn-line repair and
:meth:`~twinkle.reporting.JsonlWriter.last_object` share.

Every read is a ``pread`` on the writer's own descriptor (its position is never moved:
the descriptor appends), a bounded chunk at a time, so a long file or a long line costs
no more memory than the line limit the caller passes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from twinkle.reporting._jsonl_files import CHUNK_BYTES

__all__ = [
    "is_json",
    "is_json_object",
    "json_object",
    "last_object",
    "line_ending_at",
    "line_start",
    "pread",
]


def is_json_object(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def json_object(line: bytes) -> dict[str, Any] | None:
    """``line``'s JSON object (None: blank, not JSON, or JSON but no object)."""
    if not line.strip():
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def pread(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset`` (fewer at the end of the file)."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def line_start(fd: int, end: int, limit: int) -> int | None:
    """Offset just after the last ``\\n`` before ``end`` (0 if none); None when the
    line would be longer than ``limit`` bytes."""
    pos = end
    start = 0
    while pos > 0 and end - pos <= limit:
        lo = max(0, pos - CHUNK_BYTES)
        idx = pread(fd, pos - lo, lo).rfind(b"\n")
        if idx >= 0:
            start = lo + idx + 1
            break
        pos = lo
    return None if end - start > limit else start


def line_ending_at(path: Path, end: int, limit: int) -> bytes | None:
    """The line of ``path`` whose newline is its byte ``end - 1`` (without it); None
    when it would be longer than ``limit`` bytes."""
    with path.open("rb") as f:
        fd = f.fileno()
        start = line_start(fd, end - 1, limit)
        return None if start is None else pread(fd, end - 1 - start, start)


def last_object(
    fd: int,
    size: int,
    limit: int,
    predicate: Callable[[dict[str, Any]], bool] | None,
) -> dict[str, Any] | None:
    """The last JSON object line of the first ``size`` bytes of ``fd`` (satisfying
    ``predicate``), scanning backwards; lines longer than ``limit`` are passed over."""
    # The pieces of the line being read backwards, last first (joined once, when its
    # start is found: a long line costs no quadratic copying); dropped past the limit.
    parts: list[bytes] = []
    held = 0
    overlong = False

    def match(line: bytes) -> dict[str, Any] | None:
        obj = json_object(line)
        return obj if obj is not None and (predicate is None or predicate(obj)) else None

    pos = size
    while pos > 0:
        lo = max(0, pos - CHUNK_BYTES)
        chunk = pread(fd, pos - lo, lo)
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
