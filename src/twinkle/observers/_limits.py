"""What limits the run: each window's critical path (measured with the window,
:func:`~twinkle.observers._measure.critical_path`), a verdict per window and for the
steady state by one documented rule, and at most what a twice-as-fast side would save
(docs/metrics.md, "What limits the run")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from twinkle.observers._config import ObserverConfig
from twinkle.observers._measure import PATH_KINDS, WindowTiming

__all__ = ["BOUND_SHARE", "MARGIN", "LimitsLedger", "path_values", "verdict"]

#: a side is the bound when it holds at least this share of the critical path ...
BOUND_SHARE = Fraction(1, 2)
#: ... and leads the next side by at least this much (shares of the path); exact
#: fractions of integer nanoseconds, so 60 % against 40 % is a lead of 20 points
MARGIN = Fraction(1, 5)
#: the sides a verdict can name, as the critical path's kinds
SIDES = ("training", "generation", "publish")

_NS = 1e9


def path_values(t: WindowTiming, prefix: str) -> dict[str, int | float]:
    """``<prefix>path_<kind>_seconds`` of a stretch of the timeline, in PATH_KINDS order."""
    return {f"{prefix}path_{kind}_seconds": t.path_ns[kind] / _NS for kind in PATH_KINDS}


def verdict(
    path_ns: Mapping[str, int],
    config: ObserverConfig,
    busy_ns: Mapping[str, int] | None = None,
) -> tuple[str, str]:
    """The verdict on a critical path and why, by the rule of docs/metrics.md: the side
    (training, generation, publish) holding at least :data:`BOUND_SHARE` of the path
    and leading the next by :data:`MARGIN` bounds it (``training-bound``...), unless
    another side ran so much of the stretch (``busy_ns``: each side's union) that a
    faster bound side alone would save less than :data:`MARGIN` of it; ``mixed`` when
    none bounds it; ``abstain`` when the sides cannot be told apart (no
    ``config.streaming``), when the path holds no time, or when most of it is none of
    the three (other phases, twinkle's own work, idle)."""
    if config.streaming is None:
        return "abstain", "no config.streaming: generation and training cannot be told apart"
    wall = sum(path_ns.values())
    if wall <= 0:
        return "abstain", "the window holds no time"
    # (ties: the sides' order; shares as exact fractions of integer nanoseconds)
    shares = sorted(((Fraction(path_ns[s], wall), s) for s in SIDES), key=lambda x: -x[0])
    (first, side), (second, runner_up) = shares[0], shares[1]
    sides = sum(share for share, _ in shares)
    if sides < BOUND_SHARE:
        return "abstain", (
            f"{float(1 - sides):.0%} of the critical path is neither training, generation "
            "nor publish (other phases, twinkle's own work or idle)"
        )
    if first >= BOUND_SHARE and first - second >= MARGIN:
        busiest = _busiest_other(side, busy_ns)
        if busiest is not None and Fraction(wall - busiest[1], wall) < MARGIN:
            other, busy = busiest
            return "mixed", (
                f"{side} {float(first):.0%} of the critical path, but {other} ran "
                f"{busy / wall:.0%} of the stretch: a faster {side} alone saves at most "
                f"{(wall - busy) / wall:.0%} (both matter)"
            )
        return f"{side}-bound", (
            f"{side} {float(first):.0%} of the critical path, {runner_up} next at "
            f"{float(second):.0%}"
        )
    # (which test failed, said exactly: rounded shares can seem to pass both; the lead
    # rounded down, so that it never reads as the margin it falls short of)
    why = (
        f"no side holds {float(BOUND_SHARE):.0%}"
        if first < BOUND_SHARE
        else f"a lead of {math.floor(1000 * (first - second)) / 10:.1f} points, under the "
        f"{float(100 * MARGIN):.0f} a bound side needs"
    )
    return "mixed", (
        f"{side} {float(first):.0%} and {runner_up} {float(second):.0%} of the critical path: {why}"
    )


def _busiest_other(side: str, busy_ns: Mapping[str, int] | None) -> tuple[str, int] | None:
    """The side other than ``side`` that ran longest, and its time (None: none known)."""
    others = [(ns, s) for s, ns in (busy_ns or {}).items() if s != side]
    if not others:
        return None
    ns, other = max(others)
    return other, ns


def _busy_ns(t: WindowTiming, config: ObserverConfig) -> dict[str, int]:
    """How long training, generation and publish each ran in the stretch (their unions,
    overlapping or not)."""
    if config.streaming is None:
        return {}
    generation, training = config.streaming
    phases = {"training": training, "generation": generation, "publish": config.publish}
    return {side: t.phase_ns[p] for side, p in phases.items() if p is not None}


class LimitsLedger:
    """Each window's verdict counted, and the steady-state windows' timing summed, for
    the run's verdict and what a twice-as-fast side would save."""

    def __init__(self) -> None:
        self.windows: dict[str, int] = {}
        self.steady: WindowTiming | None = None
        self.steady_windows = 0

    def add(self, window: WindowTiming, steady: bool, config: ObserverConfig) -> str:
        """Count ``window``'s verdict (returned) and, when ``steady``, its timing."""
        found, _ = verdict(window.path_ns, config, _busy_ns(window, config))
        self.windows[found] = self.windows.get(found, 0) + 1
        if steady:
            self.steady = window if self.steady is None else self.steady + window
            self.steady_windows += 1
        return found

    def summary(self, loop: WindowTiming, config: ObserverConfig) -> dict[str, Any]:
        """``summary.json``'s ``limits``: the verdict on the steady state (else on the
        whole loop), its evidence, each window's verdict counted, and at most what a
        twice-as-fast side would save of that stretch."""
        basis, over = (self.steady, "steady state") if self.steady is not None else (loop, "loop")
        found, why = verdict(basis.path_ns, config, _busy_ns(basis, config))
        if self.steady is None and config.streaming is not None:
            # Warm-up (compiling, caches filling) and a cut-short end are no pace to
            # judge a run by: the loop's path is evidence, not a verdict.
            found, why = (
                "abstain",
                (
                    "no steady-state window (every window is warm-up, drain or partial; a "
                    f"segment needs 3 iterations or more): over the whole loop, warm-up "
                    f"included, {found}: {why}"
                ),
            )
        wall = basis.wall_ns
        path = {k: basis.path_ns[k] / _NS for k in PATH_KINDS}
        return {
            "verdict": found,
            "reason": why,
            "over": over,
            "windows": dict(sorted(self.windows.items())),
            "steady_windows": self.steady_windows,
            "path_seconds": path,
            "path_shares": {k: basis.path_ns[k] / wall if wall else None for k in PATH_KINDS},
            "twice_as_fast": _twice_as_fast(basis, config),
            "busy_shares": _busy_shares(basis, config),
        }


def _twice_as_fast(t: WindowTiming, config: ObserverConfig) -> dict[str, dict[str, float | None]]:
    """Per side, at most how many seconds (and what share of the stretch) a twice-as-fast
    side would save: half its time, no more than its time on the critical path (what
    the path waits on it), and no more than the stretch leaves the other sides (the
    stretch cannot end before the busiest of them has run its time)."""
    out: dict[str, dict[str, float | None]] = {}
    busy = _busy_ns(t, config)
    for side, ns in busy.items():
        busiest = _busiest_other(side, busy)
        left = t.wall_ns - (0 if busiest is None else busiest[1])
        saved = min(t.path_ns[side], ns // 2, left)
        out[side] = {
            "seconds": saved / _NS,
            "share": saved / t.wall_ns if t.wall_ns else None,
        }
    return out


def _busy_shares(t: WindowTiming, config: ObserverConfig) -> dict[str, float | None]:
    """How much of the stretch training, generation and publish each ran (their unions,
    overlapping or not)."""
    if not t.wall_ns:
        return {}
    return {side: ns / t.wall_ns for side, ns in _busy_ns(t, config).items()}
