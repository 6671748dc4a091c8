"""The report's line on a resumed run's segments (``summary.json`` ``segments``): what
each process that wrote the run ran and how it ended."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

__all__ = ["segments_line"]


def segments_line(segments: Sequence[Mapping[str, Any]]) -> str:
    """Each segment's iterations and status, in order. Neighbours that ran no iteration
    and ended alike (a job restarted into the same crash, again and again) are said once,
    with their count: the line stays as short as the run's distinct episodes."""
    parts: list[str] = []
    for (first, status), group in groupby(segments, _empty_alike):
        run = list(group)
        if first is not None or len(run) == 1:
            parts += map(_segment, run)
        else:
            numbers = f"{run[0]['segment']}-{run[-1]['segment']}"
            parts.append(f"{numbers}: no iteration ({status or 'unfinished'}, {len(run)} segments)")
    return "segments            " + ", ".join(parts)


def _empty_alike(s: Mapping[str, Any]) -> tuple[object, str | None]:
    """What makes neighbours alike: no iteration (a segment that ran some is its own:
    its first iteration) and the same status."""
    return s["first_iteration"], s["status"]


def _segment(s: Mapping[str, Any]) -> str:
    first, last = s["first_iteration"], s["last_iteration"]
    span = "no iteration" if first is None else f"iterations {first}-{last}"
    return f"{s['segment']}: {span} ({s['status'] or 'unfinished'})"
