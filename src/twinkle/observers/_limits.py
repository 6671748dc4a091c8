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

__all__ = ["BOUND_SHARE", "MARGIN", "LimitsLedger", "path_values", "rest_ns", "verdict"]

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
    rest: Mapping[str, tuple[str, int]] | None = None,
) -> tuple[str, str]:
    """The verdict on a critical path and why, by the rule of docs/metrics.md: the side
    (training, generation, publish) holding at least :data:`BOUND_SHARE` of the path
    and leading the next by :data:`MARGIN` bounds it (``training-bound``...), unless
    the pipeline ran so much else besides it (``rest``: :func:`rest_ns`) that a faster
    bound side alone would save less than :data:`MARGIN` of the stretch; ``mixed``
    when none bounds it; ``abstain`` when the sides cannot be told apart (no
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
        other, busy = (rest or {}).get(side, ("", 0))
        if busy and Fraction(wall - busy, wall) < MARGIN:
            return "mixed", (
                f"{side} {float(first):.0%} of the critical path, but {other} ran "
                f"{_pct(Fraction(busy, wall), 1 - MARGIN)} of the stretch: a faster {side} "
                f"alone saves at most {_pct(Fraction(wall - busy, wall), MARGIN)} (both matter)"
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
        f"{side} {_pct(first, BOUND_SHARE)} and {runner_up} {float(second):.0%} of the "
        f"critical path: {why}"
    )


def _pct(share: Fraction, line: Fraction) -> str:
    """``share`` as a whole percentage, or to a tenth of a point (rounded away from
    ``line``) where the whole one would read as the ``line`` it was tested against: 49.9 %
    is no 50 %, 80.2 % is more than 80 %."""
    if f"{float(share):.0%}" != f"{float(line):.0%}" or share == line:
        return f"{float(share):.0%}"
    tenths = 1000 * share
    return f"{(math.floor(tenths) if share < line else math.ceil(tenths)) / 10:.1f}%"


def rest_ns(t: WindowTiming, config: ObserverConfig) -> dict[str, tuple[str, int]]:
    """Per side of the verdict (training, generation, publish), what the pipeline must
    still run however fast that side gets, and its time: the longer of the two sides'
    other work (each side's union of the rest of its work: the engines' for training is
    their generation and the publish they ran; the trainer's, the publish it ran). The
    stretch cannot end before it: a twice-as-fast side saves at most the rest of the
    stretch. {} without ``config.streaming``."""
    sides = t.sides_ns
    if config.streaming is None:
        return {}
    generation, training = config.streaming
    engines, trainer = sides["engines"], sides["trainer"]
    to_engines, to_trainer = sides["engines_publish"], sides["trainer_publish"]
    engines_label = "the engines (generation and publish)" if to_engines else "generation"
    trainer_label = "the trainer (training and publish)" if to_trainer else "training"
    rest = {
        "training": max((engines, engines_label), (to_trainer, "the trainer's publish")),
        "generation": max((trainer, trainer_label), (to_engines, "the engines' publish")),
    }
    if config.publish is not None:
        rest["publish"] = max(
            (t.phase_ns[training], "training"), (t.phase_ns[generation], "generation")
        )
    return {side: (label, ns) for side, (ns, label) in rest.items()}


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
        found, _ = verdict(window.path_ns, config, rest_ns(window, config))
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
        found, why = verdict(basis.path_ns, config, rest_ns(basis, config))
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
            "side_shares": _side_shares(basis),
        }


def _twice_as_fast(t: WindowTiming, config: ObserverConfig) -> dict[str, dict[str, float | None]]:
    """Per side, at most how many seconds (and what share of the stretch) a twice-as-fast
    side would save: half its time, no more than its time on the critical path (what
    the path waits on it), and no more than the stretch leaves the pipeline's other
    work (:func:`rest_ns`: the stretch cannot end before it has run)."""
    out: dict[str, dict[str, float | None]] = {}
    rest = rest_ns(t, config)
    for side, ns in _busy_ns(t, config).items():
        saved = min(t.path_ns[side], ns // 2, t.wall_ns - rest[side][1])
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


def _side_shares(t: WindowTiming) -> dict[str, float]:
    """How much of the stretch the trainer's and the engines' work each covered (the
    sides the critical path is taken through: :attr:`WindowTiming.sides_ns`)."""
    if not t.wall_ns or not t.sides_ns:
        return {}
    return {side: t.sides_ns[side] / t.wall_ns for side in ("trainer", "engines")}
