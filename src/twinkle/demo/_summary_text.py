"""The demo's own summary for humans: what it did and its run's health (the run's
figures are the report's, printed before it; summary.json holds the numbers)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_summary"]


def format_summary(summary: dict[str, Any]) -> str:
    """What the demo did, for humans: its counts and its run's health (the run's figures
    are the report's, printed before it; summary.json holds the numbers)."""
    counts = summary.get("counts", {})

    def c(key: str) -> Any:  # n/a: the observer that counts it was blocked
        value = counts.get(key, {}).get("final")
        return "n/a" if value is None else value

    late = summary.get("spans", {}).get("window", {}).get("late", {})
    limits = summary.get("limits") or {}
    verdict = (
        f"{limits['verdict']}: {limits['reason']}"
        if "verdict" in limits
        else "n/a (is timing blocked?)"
    )
    segments = len(summary.get("segments") or [])
    restarts = (
        [
            f"  segments                {segments}: each process's model started from its "
            "initial weights (the demo keeps no model checkpoint)"
        ]
        if segments > 1
        else []
    )
    return "\n".join(
        [
            f"run {summary['run_id']}: {summary['status']}",
            f"  generation groups       {c('groups_rollout')}",
            f"  samples generated       {c('samples_rollout')} (those the trainer took: the "
            "report's driver line counts any left in the buffer or dropped as stale)",
            f"  training sample visits  {c('samples_train')}",
            f"  optimizer updates       {c('optimizer_updates')}",
            f"  records dropped         {summary.get('records_dropped')}",
            f"  observer failures       {sum(summary.get('observer_failures', {}).values())}",
            f"  what limits it          {verdict}",
            f"  late spans              {late.get('spans', 0)} ({late.get('seconds', 0.0):.3f} s "
            "outside their windows)",
            f"  process wall time       {_process_wall(summary)}",
            *restarts,
        ]
    )


def _process_wall(summary: dict[str, Any]) -> str:
    """The run's process wall time, saying whose: a resumed run's is its segments'
    added, a killed one's not known (docs/metrics.md, ``process_wall_seconds``)."""
    seconds = f"{summary.get('process_wall_seconds') or 0.0:.1f} s"
    segments = summary.get("segments") or []
    if len(segments) <= 1:
        return f"{seconds} (the process's, interpreter start-up included, to the run's finish)"
    known = sum(s.get("process_wall_seconds") is not None for s in segments)
    unknown = len(segments) - known
    return (
        f"{seconds} (its {len(segments)} segments' processes added, interpreter start-up "
        "included"
        + (f"; {unknown} stopped without finishing: not known, left out)" if unknown else ")")
    )
