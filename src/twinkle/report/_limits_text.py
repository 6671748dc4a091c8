"""The report's "What limits this run" block, in words: the verdict on the steady
state, each window's verdict counted, the critical path, how busy each side was, the
stragglers, the driver's health, the waits, the policy age, and at most what a
twice-as-fast side would save (docs/metrics.md, "What limits the run")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.report._format import NAMED_WORKERS, num
from twinkle.report._no_phase_text import unnamed_work_line

__all__ = ["HEADLINE_LINES", "limits_lines"]

#: how many of :func:`limits_lines`' first lines are its headline: the title, the
#: verdict, the windows counted and the critical path (what a short view keeps)
HEADLINE_LINES = 4


def limits_lines(report: Mapping[str, Any]) -> list[str]:
    """ "What limits this run": the verdict on the steady state in plain words, each
    window's verdict counted, the critical path, how busy each side was, and at most
    what a twice-as-fast side would save."""
    limits = report.get("limits") or {}
    if "verdict" not in limits:
        return ["What limits this run: not known (the run's summary has no limits)"]
    windows = limits.get("windows", {})
    counted = ", ".join(
        f"{n} {name}" for name, n in sorted(windows.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    total = sum(windows.values())
    path = limits.get("path_seconds", {})
    shares = limits.get("path_shares", {})
    shown = [k for k in _PATH_ORDER if path.get(k) or k in ("training", "generation")]
    lines = [
        f"What limits this run ({limits.get('over', '-')}, docs/metrics.md 'What limits the run')",
        f"  verdict           {limits['verdict']}: {limits.get('reason', '-')}",
        f"  windows           {counted} (of {total})",
        "  critical path     "
        + ", ".join(f"{k} {num(path[k])} s ({_pct(shares.get(k))})" for k in shown),
    ]
    busy = limits.get("busy_shares", {})
    if busy:
        sides = limits.get("side_shares") or {}
        lines.append(
            "  busy              "
            + ", ".join(f"{side} ran {_pct(share)}" for side, share in busy.items())
            + " of it"
            + (
                "; by side: " + ", ".join(f"{side} {_pct(share)}" for side, share in sides.items())
                if sides
                else ""
            )
        )
    stragglers = limits.get("stragglers") or {}
    if stragglers:
        lines.append(
            "  stragglers        "
            + "; ".join(_stragglers(side, s) for side, s in stragglers.items())
        )
    driver = limits.get("driver") or {}
    if driver:
        lines.append(_driver_line(driver))
    never = limits.get("never_trained") or {}
    if never.get("unstarted_iterations"):
        lines.append(_never_started(never, report))
    workers = limits.get("workers") or {}
    for name, by_worker in (workers.get("waits") or {}).items():
        lines.append(f"  {name:<17} " + _most(by_worker) + " of their windows waiting")
    lines += unnamed_work_line(report)
    if workers.get("unaccounted"):
        lines.append(
            "  unaccounted       " + _most(workers["unaccounted"]) + " of their windows: no span"
        )
    age = limits.get("policy_age") or {}
    if age:
        lines.append(
            f"  policy age        mean {num(age.get('mean'))}, max {age.get('max')} versions "
            f"behind the policy trained ({age.get('spans')} generation spans)"
        )
    faster = limits.get("twice_as_fast", {})
    if faster:
        lines.append(
            "  if 2x faster      "
            + "; ".join(
                f"{side}: at most {_pct(v.get('share'))} shorter"
                if busy.get(side)
                else f"{side}: none ran (no span of its phase)"
                for side, v in faster.items()
            )
        )
    return lines


def _never_started(never: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """What was observed for iterations that never started: rollouts made ahead and
    never trained, or an ``iteration=`` that is not the loop's number."""
    tokens = ", ".join(f"{num(n)} {tag}" for tag, n in never["unstarted_tokens"].items())
    numbers = report.get("unstarted_iterations") or []
    started = [row["iteration"] for row in report.get("iterations", [])]
    which = ", ".join(map(str, numbers[:5])) + (
        f" and {len(numbers) - 5} more" if len(numbers) > 5 else ""
    )
    last = (
        f"; the last started: {max(started)}"
        if started
        else "; none started: call run.bus.iteration_started(i) as each iteration begins"
    )
    again = sorted(set(numbers) & set(started))
    if again:  # (work a process made ahead, then ended: a resumed one started the number)
        last += (
            f"; {', '.join(map(str, again[:5]))} started in a later segment, without the "
            "work observed for it before"
        )
    return (
        f"  never started     {never['unstarted_iterations']} iterations observed but never "
        f"started ({which}{last}): {num(never['unstarted_span_seconds'])} s of spans"
        + (f", tokens {tokens}" if tokens else "")
        + " in no iteration's figures (rollouts made ahead and never trained, or an "
        "iteration= of bus.samples or a span that is not the loop's iteration_started)"
    )


def _driver_line(driver: Mapping[str, Any]) -> str:
    """The driver's totals in words: they cover the whole run, not the steady state."""
    blocked = sum((driver.get("engines_blocked_seconds") or {}).values())
    return (
        "  driver (run)      over the whole run, warm-up included, the trainer waited "
        f"{num(driver.get('trainer_wait_seconds'))} s for rollouts; engines blocked on a "
        f"full buffer {num(blocked)} s; "
        f"{driver.get('produced', '-')} batches produced, {driver.get('consumed', '-')} "
        f"trained, {driver.get('dropped', '-')} dropped as stale, "
        f"{driver.get('left_in_buffer', '-')} left at the end"
    )


def _most(workers: Mapping[str, Mapping[str, Any]], shown: int = 3) -> str:
    """The ``shown`` workers with the most seconds, each with its share."""
    top = sorted(workers.items(), key=lambda kv: (-kv[1]["seconds"], kv[0]))
    words = [f"{w} {num(v['seconds'])} s ({_pct(v.get('share'))})" for w, v in top[:shown]]
    return ", ".join(words) + (f" and {len(top) - shown} more" if len(top) > shown else "")


def _only(worker: Mapping[str, Any], chronic: bool) -> str:
    """Why a one-off is not chronic: slow in half the iterations compared or fewer, or
    in more but too few were compared (docs/metrics.md, "Stragglers")."""
    if chronic:
        return ""
    slow, compared = worker.get("slow_iterations") or 0, worker.get("compared_iterations") or 0
    if slow * 2 > compared:
        return ", too few compared to call it chronic"
    return " only"


def _stragglers(side: str, found: Mapping[str, Any]) -> str:
    """One side's stragglers in words: the slow workers, or that none was, or why its
    workers were not compared."""
    workers = found.get("workers", {})
    if not workers:
        why = ", ".join(
            f"{n} iteration{'' if n == 1 else 's'}: {r}"
            for r, n in found.get("abstained", {}).items()
        )
        return f"{side}: not compared ({why or 'no span of its phase names an iteration'})"
    # (the chronic first; a one-off's slow iterations said first, its typical ratio, 1.0x
    # in a healthy run's jitter, after)
    slow = [
        f"{name} {w.get('verdict')} (slow in {w.get('slow_iterations')} of "
        f"{w.get('compared_iterations')} iterations{_only(w, chronic)}, typically "
        f"{w.get('median_ratio_to_peers', 0):.1f}x its peers' seconds per {found.get('unit')})"
        for chronic in (True, False)
        for name, w in workers.items()
        if w.get("verdict") != "ok" and (w.get("verdict") == "chronic") == chronic
    ]
    if not slow:
        many = len(workers) > NAMED_WORKERS
        return f"{side}: none of " + (f"its {len(workers)} workers" if many else ", ".join(workers))
    more = len(slow) - NAMED_WORKERS
    return (
        f"{side}: "
        + ", ".join(slow[:NAMED_WORKERS])
        + (f", and {more} more (report --json)" if more > 0 else "")
    )


#: the critical path's kinds, as docs/metrics.md orders them
_PATH_ORDER = ("training", "generation", "publish", "other", "overhead", "idle")


def _pct(share: Any) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"
