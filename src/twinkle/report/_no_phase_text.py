"""The report's words on the idle time in which only spans no phase names ran
(``seconds.unnamed``) and on those spans' names (``summary.json`` ``spans.no_phase``),
docs/metrics.md "Spans in no phase"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.report._format import num

__all__ = ["no_phase_lines", "unnamed_work_line"]

#: how many names the lines name, the most idle seconds first
SHOWN = 3


def unnamed_work_line(report: Mapping[str, Any]) -> list[str]:
    """The "What limits this run" line: the run's idle in which spans no phase names
    ran, and the name that ran in most of it (none when no such idle; not named from a
    summary without each name's idle seconds, whose summed ones count time in phases)."""
    unnamed = (report.get("seconds") or {}).get("unnamed")
    if not unnamed:
        return []
    ranked, key = _ranked(report.get("no_phase"))
    most = ""
    if ranked and key == "idle_seconds":
        most = f" (the most: {ranked[0][0]} {num(ranked[0][1][key])} s)"
    return [
        f"  unnamed work      {num(unnamed)} s of the run's idle ran spans no phase "
        f"names{most}: that idle may be work"
    ]


def no_phase_lines(seconds: Mapping[str, Any], no_phase: Mapping[str, Any] | None) -> list[str]:
    """The idle time in which only spans no phase names ran, and the names that ran in
    it, the most idle seconds first (none when no such time: such spans inside a
    phase's are busy)."""
    unnamed, idle = seconds.get("unnamed"), seconds.get("idle")
    if not unnamed or not no_phase or not no_phase["spans"]:
        return []
    ranked, key = _ranked(no_phase)
    parts = [f"{name} {num(entry[key])} s ({_spans(entry['spans'])})" for name, entry in ranked]
    if len(parts) > SHOWN:
        more = len(parts) - SHOWN
        parts[SHOWN:] = [f"{more} more {'name' if more == 1 else 'names'}"]
    share = f" ({100 * unnamed / idle:.0f}% of idle)" if idle else ""
    label = "idle by name" if key == "idle_seconds" else "by name (summed)"
    return [
        f"in no phase         {num(unnamed)} s idle{share} ran only spans no phase names: "
        "name them in config.phases if they are work",
        f"  {label:<18}{', '.join(parts)}",
    ]


def _ranked(no_phase: Mapping[str, Any] | None) -> tuple[list[tuple[str, Any]], str]:
    """The names (and the later names together) with idle seconds, the most first, and
    the key ranked by: a summary from before ``idle_seconds`` ranks by summed seconds."""
    if not no_phase:
        return [], "idle_seconds"
    key = "idle_seconds" if "idle_seconds" in no_phase["other"] else "seconds"
    entries = [*no_phase["names"].items(), ("later names", no_phase["other"])]
    ranked = sorted((kv for kv in entries if kv[1][key]), key=lambda kv: (-kv[1][key], kv[0]))
    return ranked, key


def _spans(n: int) -> str:
    return f"{n} span" if n == 1 else f"{n} spans"
