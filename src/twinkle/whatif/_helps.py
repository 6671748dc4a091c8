"""What would help: the predicted effect of five common changes on a recorded run
(``twinkle report RUN --whatif``; docs/metrics.md, "What if: predicting another
configuration").

Each change is predicted as ``twinkle whatif`` predicts it, and compared with the
model's own replay of the recorded configuration, not with the run: the model's error
on this run (what the replay misses) cancels out of the ratio.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from typing import Any

from twinkle.checks import printable
from twinkle.whatif import Changes, Prediction, predict
from twinkle.whatif._predict import not_predicted, speed_shared_note
from twinkle.whatif._recorded import Recorded, read_recorded
from twinkle.whatif._reproduce import replay_off
from twinkle.whatif._work import MAX_SPEED

__all__ = ["HELPS", "format_helps", "what_would_help"]

#: the changes tried: a label and the changes, from the recorded settings
HELPS: Sequence[tuple[str, Callable[[dict[str, Any]], Changes]]] = (
    ("+1 engine", lambda s: Changes(engines=s["engines"] + 1)),
    ("+1 trainer rank", lambda s: Changes(ranks=s["ranks"] + 1)),
    ("2x faster generation", lambda s: Changes(speed={s["generation"]: 2.0})),
    ("2x faster training", lambda s: Changes(speed={s["training"]: 2.0})),
    ("lag +1", lambda s: Changes(lag=s["lag"] + 1)),
)
#: the largest lag a prediction takes
MAX_LAG = 8


def _steady(p: Prediction) -> tuple[Any, Any]:
    window = p.predicted["window"]
    return window.get("steady_tokens_per_s"), window.get("steady_tokens_per_s_per_device")


def _ratio(a: Any, b: Any) -> float | None:
    return b / a if isinstance(a, int | float) and isinstance(b, int | float) and a else None


def what_would_help(run: str) -> list[dict[str, Any]]:
    """Per change: its settings, the predicted steady-state tokens/s (the run's) and
    tokens/s/device, and each as a ratio to the model's replay of the run as recorded
    (``speedup``, ``per_device``). The changes: :data:`HELPS`, then each engine the
    run found a chronic straggler brought to its peers' speed."""
    recorded = read_recorded(run)
    base = predict(recorded, Changes())
    try:
        settings = {
            **base.settings,
            "generation": recorded.generation,
            "training": recorded.training,
        }
        changes = [
            (label, make(settings))
            for label, make in HELPS
            if label != "lag +1" or settings["lag"] < MAX_LAG  # (else at its bound)
        ]
        changes += _stragglers_fixed(base.recorded, set(recorded.engines))
        off = replay_off(base)
        return [_row(recorded, label, change, _steady(base), off) for label, change in changes]
    finally:
        shutil.rmtree(base.out_dir, ignore_errors=True)


def _stragglers_fixed(report: dict[str, Any], engines: set[str]) -> list[tuple[str, Changes]]:
    """For each engine the report's stragglers call chronic, the change that brings it
    to its peers' speed: its speed times its median ratio to them."""
    found = (report.get("limits") or {}).get("stragglers") or {}
    workers = (found.get("generation") or {}).get("workers") or {}
    return [
        (f"{name} at its peers' speed", Changes(speed={name: min(ratio, MAX_SPEED)}))
        for name, w in sorted(workers.items())
        if w.get("verdict") == "chronic"
        and name in engines
        and isinstance(ratio := w.get("median_ratio_to_peers"), int | float)
        and ratio > 1
    ]


def _row(
    recorded: Recorded, label: str, change: Changes, before: tuple[Any, Any], off: str | None
) -> dict[str, Any]:
    """One change's row: its prediction against ``before`` (the model's replay; ``off``:
    why it is too far from the run for any prediction, see :func:`replay_off`)."""
    p = predict(recorded, change)
    try:
        after = _steady(p)
        # A worker added on a device another uses adds no compute there, where the
        # model gives it its own; a change of how much runs at once on a shared device
        # changes what sharing cost; a replay far from the run: no ratio, and why.
        why = not_predicted(p.settings) or off
        return {
            "change": label,
            "settings": p.settings,
            "speed": dict(change.speed),
            "steady_tokens_per_s": after[0],
            "steady_tokens_per_s_per_device": after[1],
            "speedup": None if why else _ratio(before[0], after[0]),
            "per_device": None if why else _ratio(before[1], after[1]),
            "not_predicted": why,
        }
    finally:
        shutil.rmtree(p.out_dir, ignore_errors=True)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_helps(rows: list[dict[str, Any]]) -> str:
    """The rows as the report's "what would help" block."""
    width = max([22, *(len(printable(r["change"])) + 2 for r in rows)])
    lines = [
        "what would help (predicted by twinkle whatif: steady-state tokens/s against its "
        "replay of this run as recorded; assumptions: twinkle whatif RUN)",
        f"  {'change':<{width}}{'tokens/s':>10}{'per device':>12}",
    ]
    for r in rows:
        why = "" if r.get("not_predicted") is None else f"  (not predicted: {r['not_predicted']})"
        change = printable(r["change"])
        lines.append(
            f"  {change:<{width}}{_x(r['speedup']):>10}{_x(r['per_device']):>12}{printable(why)}"
        )
    shared = [r["settings"]["speed_shared"] for r in rows if r["settings"]["speed_shared"]]
    if shared:
        lines.append(f"  (the speed changes: {speed_shared_note(shared[0])})")
    return "\n".join(lines)
