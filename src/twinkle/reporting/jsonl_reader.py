"""``JsonlReader`` / :func:`read_jsonl`: the one reader of every JSONL file twinkle writes.

* Lazy, in file order; a line that is not a JSON object is a
  :class:`~twinkle.errors.RecordError` naming ``file:line`` (or, with
  ``on_error="skip"``, skipped and counted).
* **One line limit**, :data:`~twinkle.reporting.MAX_LINE_BYTES`, the writer's: a longer
  line is not a line twinkle wrote (a ``RecordError`` naming ``file:line``). Lines are
  read bounded, so a huge line never costs more memory than the limit. ``max_line_bytes``
  lowers it for one reader (checked by :func:`~twinkle.reporting.jsonl.line_limit`).
* A killed co-appender's unfinished line, which a writer recorded in the sidecar
  (``"kind": "fragment"``, its offset, length and sha256) and ended with a newline, is
  recognised by exactly those bytes and passed over
  (:attr:`JsonlReader.fragment_lines`); any other bad line is still an error.
* ``allow_torn_tail=True`` passes over a torn last line (what a crash mid-write leaves).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, Any, Literal

import orjson

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError
from twinkle.reporting._jsonl_files import CHUNK_BYTES, StrPath, reporter_error, sidecar_path
from twinkle.reporting.jsonl import line_limit

__all__ = ["JsonlReader", "read_jsonl"]

logger = logging.getLogger("twinkle.reporting")


def _recorded_fragments(path: Path) -> dict[int, tuple[int, str]]:
    """offset -> (length, sha256) of the unfinished lines the sidecar of ``path`` records
    (the ones writers ended with a newline after a co-appender died in the middle)."""
    side = sidecar_path(path)
    found: dict[int, tuple[int, str]] = {}
    if not side.is_file():
        return found
    try:
        for entry in JsonlReader(side, "skip", fragments=False):
            offset, size, digest = entry.get("offset"), entry.get("torn_bytes"), entry.get("sha256")
            if (
                entry.get("kind") == "fragment"
                and type(offset) is int
                and type(size) is int
                and isinstance(digest, str)
            ):
                found[offset] = (size, digest)
    except ReporterError as exc:  # an unreadable sidecar recognises nothing
        logger.warning("%s: cannot read the sidecar %s: %s", path, side, exc)
    return found


class JsonlReader(Iterator[dict[str, Any]]):
    """Iterator over the JSON objects of a JSONL file (see :func:`read_jsonl`).

    ``skipped`` counts the lines ``on_error="skip"`` passed over; ``skipped_lines``
    holds their 1-based line numbers. Blank lines are ignored and not counted.
    ``lineno`` is the line number of the object returned last. ``torn_line`` and
    ``torn_bytes`` describe a torn last line passed over (``allow_torn_tail=True``).
    ``fragment_lines`` lists the lines passed over as a killed co-appender's unfinished
    line, recorded in the sidecar (``fragment_bytes``: their total length).
    ``max_line_bytes`` is the line limit (None: :data:`~twinkle.reporting.MAX_LINE_BYTES`).
    ``warn_torn=False`` notes a torn last line without logging it (the caller says it).
    """

    def __init__(
        self,
        path: Path,
        on_error: Literal["raise", "skip"],
        allow_torn_tail: bool = False,
        *,
        fragments: bool = True,
        start: tuple[int, int] = (0, 0),
        max_line_bytes: int | None = None,
        warn_torn: bool = True,
    ) -> None:
        self.path = path
        self.max_line_bytes = line_limit(max_line_bytes)
        #: where reading begins: (a byte offset at a line's start, the lines before it)
        self._start = start
        self.on_error = on_error
        self.allow_torn_tail = allow_torn_tail
        self.warn_torn = warn_torn
        self.skipped = 0
        self.skipped_lines: list[int] = []
        self.lineno = 0
        self.offset = start[0]  # bytes read up to the end of the line returned last
        self.torn_line: int | None = None
        self.torn_bytes = 0
        self.fragment_lines: list[int] = []
        self.fragment_bytes = 0
        self.error: tuple[int, str] | None = None  # (line, why) of the line that raised
        self._fragments: dict[int, tuple[int, str]] | None = None if fragments else {}
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

    def _raise(self, lineno: int, why: str) -> None:
        self.error = (lineno, why)
        raise RecordError(
            f"{self.path!s}:{lineno}: {why}; fix or remove that line, or read with on_error='skip'"
        )

    def _bad(self, lineno: int, offset: int, line: bytes, why: str) -> None:
        if self._is_fragment(lineno, offset, line):
            return
        if self.allow_torn_tail and not line.endswith(b"\n"):
            # Only the last line can lack its newline: the write of a crashed process
            # stopped inside it. Complete JSON objects never get here.
            self.torn_line = lineno
            self.torn_bytes = len(line)
            if not self.warn_torn:
                return
            logger.warning(
                "%s:%d: torn last line (%d byte(s) without a newline: %s) passed over",
                self.path,
                lineno,
                len(line),
                why,
            )
            return
        if self.on_error == "raise":
            self._raise(lineno, why)
        self.skipped += 1
        self.skipped_lines.append(lineno)

    def _is_fragment(self, lineno: int, offset: int, line: bytes) -> bool:
        """Whether ``line`` (at ``offset``) is exactly an unfinished line the sidecar
        records: a co-appender's, killed mid-write (read the sidecar the first time)."""
        if self._fragments is None:
            self._fragments = _recorded_fragments(self.path)
        known = self._fragments.get(offset)
        if known is None:
            return False
        content = line[:-1] if line.endswith(b"\n") else line
        if known != (len(content), hashlib.sha256(content).hexdigest()):
            return False
        self.fragment_lines.append(lineno)
        self.fragment_bytes += len(content)
        logger.warning(
            "%s:%d: passed over the unfinished line (%d byte(s)) of a writer killed while "
            "writing it, as recorded in %s",
            self.path,
            lineno,
            len(content),
            sidecar_path(self.path),
        )
        return True

    def _overlong(self, f: IO[bytes], lineno: int, head: bytes, limit: int) -> int:
        """A line longer than the limit: raise, or skip it (returns the bytes read past
        ``head``, a bounded chunk at a time)."""
        if self.on_error == "raise":
            self._raise(
                lineno,
                f"line longer than MAX_LINE_BYTES={limit} bytes, the longest line twinkle "
                "writes (not a JSONL file twinkle wrote, or that line is corrupt)",
            )
        read = 0
        while not head.endswith(b"\n"):
            head = f.readline(CHUNK_BYTES * 16)
            if not head:
                break
            read += len(head)
        self.skipped += 1
        self.skipped_lines.append(lineno)
        return read

    def _lines(self) -> Generator[dict[str, Any], None, None]:
        try:
            f = self.path.open("rb")
        except OSError as exc:
            raise reporter_error(self.path, exc, "read") from exc
        loads = orjson.loads
        limit = self.max_line_bytes
        with f:
            readline = f.readline
            offset, lineno = self._start
            if offset:
                f.seek(offset)
            while line := readline(limit + 1):  # bounded: never more than the limit
                lineno += 1
                start = offset
                offset += len(line)
                if len(line) > limit:
                    offset += self._overlong(f, lineno, line, limit)
                    continue
                try:
                    obj = loads(line)
                except orjson.JSONDecodeError as exc:
                    if line.strip():
                        self._bad(lineno, start, line, f"invalid JSON ({exc})")
                    continue
                if type(obj) is not dict:
                    self._bad(
                        lineno, start, line, f"expected a JSON object, got {type(obj).__name__}"
                    )
                    continue
                self.lineno, self.offset = lineno, offset
                yield obj


def read_jsonl(
    path: StrPath,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    allow_torn_tail: bool = False,
    start: tuple[int, int] = (0, 0),
    max_line_bytes: int | None = None,
    warn_torn: bool = True,
) -> JsonlReader:
    """Iterate the JSON objects of a JSONL file, lazily, in file order.

    A line that is not a JSON object raises :class:`~twinkle.errors.RecordError`
    naming ``file:line``; with ``on_error="skip"`` it is skipped and counted in the
    returned reader's ``skipped``. Lines are read bounded: one longer than
    :data:`~twinkle.reporting.MAX_LINE_BYTES` (or ``max_line_bytes``, lower) is such an error
    too (never a ``MemoryError``).
    ``allow_torn_tail=True`` passes over a last line without a newline that is not a
    JSON object (what a crash mid-write leaves), logs it and notes it in
    ``torn_line``/``torn_bytes``; a bad line anywhere else is still an error — except,
    in every mode, a line the sidecar (``<name>.torn``) records as the unfinished line
    of a co-appender killed while writing it, byte for byte (its offset, length and
    sha256): that one is passed over, logged and listed in ``fragment_lines``. A missing
    file raises :class:`~twinkle.errors.ReporterError` when iteration starts.
    ``start`` = (byte offset, lines before it) begins at a line's start, numbering on.
    ``warn_torn=False``: a torn last line is noted, not logged (its caller says it).
    """
    if on_error not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, got {path!r}")
    return JsonlReader(
        Path(path),
        on_error,
        bool(allow_torn_tail),
        start=start,
        max_line_bytes=max_line_bytes,
        warn_torn=warn_torn,
    )
