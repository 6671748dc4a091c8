"""How many segments a run's log holds, found without parsing it (``twinkle report``
checks a summary covers them all)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

__all__ = ["log_ends_a_segment", "logged_segments"]

#: a run_resumed line of the log: the writer puts the type first (after the line's seq)
_RESUMED: Final = b'"type":"run_resumed"'
_LINE_HEAD: Final = re.compile(rb'\{(?:"seq":\d{1,20},)?')
_HEAD_MAX: Final = 32  # the most bytes between a line's start and its type


#: the log is searched this many bytes at a time
_CHUNK: Final = 1 << 20
#: the types of a segment's last event: backends_closed, or, in the log of an older
#: twinkle, run_finished
_ENDS: Final = (b'"type":"backends_closed"', b'"type":"run_finished"')


def log_ends_a_segment(log: Path, tail: int = _CHUNK) -> bool:
    """Whether the log's last whole line is a segment's last event (a log cut short,
    or added to, after its run finished ends otherwise), found in its last ``tail``
    bytes. A torn last line is no event (a resume killed as it wrote its first line)."""
    with log.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - tail))
        text = f.read()
    text = text[: text.rfind(b"\n") + 1]  # (its whole lines)
    if not text:
        return False
    line = text[text.rfind(b"\n", 0, len(text) - 1) + 1 :]
    head = _LINE_HEAD.match(line)
    return head is not None and line.startswith(_ENDS, head.end())


def logged_segments(log: Path) -> int:
    """How many segments the log holds: 1 + its ``run_resumed`` lines, found by a byte
    search instead of parsing the log (a gigabyte takes about half a second), a chunk
    at a time. Strings in a line have their quotes escaped, so the pattern right at a
    line's start is the event's own type, never a value; a torn last line (no newline)
    is no event."""
    keep = _HEAD_MAX + len(_RESUMED)  # a chunk's end the next one searches again
    segments = 0
    last_match = last_newline = -1  # where in the file
    offset, text = 0, b""  # the file offset of text[0]; the bytes searched
    with log.open("rb") as f:
        while chunk := f.read(_CHUNK):
            segments = segments or 1
            done = max(len(text) - keep, 0)  # bytes of text searched already
            text = text[done:] + chunk
            offset += done
            newline = text.rfind(b"\n")
            if newline != -1:
                last_newline = offset + newline
            # from text's start: the kept tail (a match across the seam) and the chunk
            # (a match found twice is counted once: last_match)
            at = text.find(_RESUMED, 0)
            while at != -1:
                if offset + at > last_match and _at_line_start(text, at, offset == 0):
                    segments += 1
                    last_match = offset + at
                at = text.find(_RESUMED, at + 1)
    # (a match on the torn last line is no event)
    return segments - (last_match > last_newline)


def _at_line_start(text: bytes, at: int, file_start: bool) -> bool:
    """Whether the pattern at ``at`` is a line's type: what comes before it on its line
    is the line's head (``{`` and its ``seq``)."""
    low = max(0, at - _HEAD_MAX)
    newline = text.rfind(b"\n", low, at)
    if newline == -1 and not (low == 0 and file_start):
        return False  # too far from a line's start
    return _LINE_HEAD.fullmatch(text[newline + 1 : at]) is not None
