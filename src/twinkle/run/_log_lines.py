"""What is wrong with a line of a run's log, said alike by every reader of it (a replay,
a follower: ``twinkle report`` and ``watch``), with the fix."""

from __future__ import annotations

from typing import Final

__all__ = ["BAD_LINE_FIX", "seq_problem"]

#: what to do about a line of the log that is no event twinkle wrote (the lines are
#: numbered: one taken out would make every later one refused as out of place)
BAD_LINE_FIX: Final = (
    "restore the original log, or cut the log just before that line to replay the "
    "events before it, and run this again"
)


def seq_problem(seq: object, expected: int, *, after_numbered: bool = True) -> str:
    """Why a line numbered ``seq`` (not an int: no number) where ``expected`` was due is
    refused, and the fix (``after_numbered``: a numbered line comes before it, so one
    number less repeats the line before)."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        return (
            f"seq = {seq!r}: expected the line's 0-based number, an int; restore the original file"
        )
    if seq > expected:
        gap = f"{expected}" if seq == expected + 1 else f"{expected}..{seq - 1}"
        why = f"seq {gap} missing before it (lines lost or moved)"
    elif seq == expected - 1 and after_numbered:
        why = "it repeats the line before it (a duplicated line)"
    else:
        why = f"seq {seq} belongs to an earlier line (a duplicated or reordered line)"
    return (
        f"seq {seq} where {expected} was due: {why}; a log with duplicated, reordered or "
        "missing lines would give wrong figures: restore the original file"
    )
