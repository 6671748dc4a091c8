"""A batch for :class:`~twinkle.reporting.JsonlWriter` as the bytes of whole lines, all
or nothing: an object that is not strict JSON, a line longer than the writer's limit or
a pre-serialised line that is not exactly one line refuses the whole batch
(:class:`~twinkle.errors.RecordError`), before anything is written."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from twinkle.errors import InvalidArgumentError, RecordError

__all__ = ["encode_objects", "join_lines"]

_DUMPS_OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
# A dict first: a Mapping ABC check costs a microsecond, a concrete type a tenth of one.
_SINGLE_VALUES = (dict, str, bytes, bytearray, memoryview, Mapping)


def _refuse_non_iterable(path: Path, objs: object, method: str, items: str) -> None:
    """``write(dict)`` would write the dict's keys, ``write("x")`` its characters: refuse
    a single value where an iterable of values, one per line, is due."""
    if type(objs) is list or type(objs) is tuple:  # the common case, checked cheaply
        return
    if isinstance(objs, _SINGLE_VALUES):
        raise InvalidArgumentError(
            f"{method}() takes an iterable of {items}, one per line, got a single "
            f"{type(objs).__name__} {objs!r:.80} for {str(path)!r}; wrap it in a list: "
            f"{method}([value])"
        )


def _too_long(path: Path, i: int, size: int, limit: int) -> RecordError:
    return RecordError(
        f"line {i} of the batch for {str(path)!r} is {size} bytes, longer than "
        f"MAX_LINE_BYTES={limit} (the longest line a twinkle JSONL file holds); "
        "split the object into several lines; nothing of this batch was written"
    )


def _check_line_lengths(path: Path, buf: bytearray, limit: int) -> None:
    start = 0
    i = 0
    while start < len(buf):
        end = buf.find(b"\n", start) + 1
        if end - start > limit:
            raise _too_long(path, i, end - start, limit)
        start = end
        i += 1


def encode_objects(path: Path, objs: Iterable[Any], limit: int) -> bytearray:
    """Each object of ``objs`` serialised as one line (``path``, ``limit``: the writer's);
    every line ends in its one newline (compact JSON holds no raw newline)."""
    _refuse_non_iterable(path, objs, "write", "objects")
    dumps = orjson.dumps
    option = _DUMPS_OPTION
    # Appending each line to one buffer frees it at once: retaining thousands of fresh
    # bytes objects costs more than serialising them.
    buf = bytearray()
    obj: Any = None
    try:
        for obj in objs:
            buf += dumps(obj, option=option)
    except orjson.JSONEncodeError as exc:
        raise RecordError(
            f"object {buf.count(10)} of the batch for {str(path)!r} is not strict "
            f"JSON ({exc}): {obj!r:.200}; use str keys and JSON types; nothing of this "
            "batch was written"
        ) from exc
    if len(buf) > limit:  # only then can one of its lines be too long
        _check_line_lengths(path, buf, limit)
    return buf


def join_lines(path: Path, lines: Sequence[bytes], limit: int) -> bytes:
    """Pre-serialised ``lines`` joined, each checked to be one line of at most ``limit``."""
    _refuse_non_iterable(path, lines, "write_bytes_lines", "bytes lines")
    for i, line in enumerate(lines):
        if not isinstance(line, bytes) or not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise RecordError(
                f"lines[{i}] of the batch for {str(path)!r} must be one JSON value "
                f"ending in a single b'\\n', got {line[:80]!r}; serialise with "
                "orjson.OPT_APPEND_NEWLINE"
            )
        if len(line) > limit:
            raise _too_long(path, i, len(line), limit)
    return b"".join(lines)
