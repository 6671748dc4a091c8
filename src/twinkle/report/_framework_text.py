"""The report's lines on a framework's own figures beside twinkle's (``summary.json``
``compare``, docs/metrics.md "A framework's own figures"): its throughput and its timers,
recomputed from the log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.report._format import num

__all__ = ["framework_lines"]


def framework_lines(compare: Mapping[str, Any] | None) -> list[str]:
    """The framework's throughput against the same figure recomputed from the log (and
    why the window figure above is lower), then its timers against their spans; none
    without ``config.compare``."""
    if not compare:
        return []
    name = compare["scalars"]
    own = f"{name}'s own"
    lines = []
    tp = compare.get("throughput")
    if tp and tp["iterations"]:
        lines.append(
            f"{own:<19} {tp['key']} {num(tp['theirs_mean'])} (mean of "
            f"{tp['iterations']} steps) against {num(tp['twinkle_mean'])} recomputed from "
            f"the log, largest difference {100 * tp['max_relative_difference']:.1f}% "
            f"(its definition: a step's tokens over its {tp.get('span', 'step')} span; the "
            "window figure above also counts the time between steps)"
        )
    timed = {n: s for n, s in compare["seconds"].items() if s["iterations"]}
    if timed:
        worst = max(timed, key=lambda n: (timed[n]["max_difference_seconds"], n))
        never = sorted(set(compare["seconds"]) - set(timed))
        lines.append(
            f"{'  timers':<20}{len(timed)} of {name}'s timers against their spans over their "
            f"steps: largest difference {num(timed[worst]['max_difference_seconds'], 4)} s "
            f"({worst})" + (f"; never logged: {', '.join(never)}" if never else "")
        )
    return lines
