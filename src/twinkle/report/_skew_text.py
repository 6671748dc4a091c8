"""The report's line on worker clocks found skewed (``summary.json`` ``clock_skew``,
docs/metrics.md "Clock skew between hosts"): whose spans were placed where their
reports arrived rather than where the worker's clock said."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.report._format import num

__all__ = ["clock_skew_lines"]


def clock_skew_lines(skew: Mapping[str, Any] | None) -> list[str]:
    """Each worker found skewed, its clock ahead or behind the run's by how much, and
    how many of its reports and spans were placed by their arrival; none when no worker
    was (or a summary from before the figure)."""
    workers = (skew or {}).get("workers") or {}
    if not workers:
        return []
    said = []
    for name, w in sorted(workers.items(), key=lambda kv: (-abs(kv[1]["offset_seconds"]), kv[0])):
        way = "ahead" if w["offset_seconds"] > 0 else "behind"
        said.append(
            f"{name} ({w['hostname']}) {num(abs(w['offset_seconds']))} s {way}, "
            f"{w['corrected_spans']} spans of {w['corrected_reports']} reports"
        )
    return [
        f"{'clock skew':<20}{'; '.join(said)}: placed where their reports arrived, not "
        "where the worker's clock put them (docs/metrics.md 'Clock skew between hosts')"
    ]
