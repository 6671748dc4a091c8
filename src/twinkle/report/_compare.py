"""Two runs' figures side by side (``twinkle report A B``), and what streaming did to
throughput where the two runs measure it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from twinkle.observers import PEAK_FIELDS

__all__ = ["PEAKS", "compare", "phases_differ", "streaming_effect"]

#: the memory fields whose highest reading the report shows per worker
PEAKS = PEAK_FIELDS


def _figures(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The run-level figures two runs are compared on, by name."""
    window, seconds = report["window"], report["seconds"]
    out: dict[str, float | None] = {
        "tokens": window.get("tokens"),
        "steady_tokens_per_s_per_device": window.get("steady_tokens_per_s_per_device"),
        "tokens_per_s_per_device": window.get("tokens_per_s_per_device"),
        "active_logical_seconds": window.get("seconds"),
        "wall_seconds": seconds["wall"],
        "setup_wall_seconds": seconds["parts"]["wall"]["setup"],
        "loop_wall_seconds": seconds["parts"]["wall"]["loop"],
        "busy_seconds": seconds["busy"],
        "idle_seconds": seconds["idle"],
        "overhead_seconds": seconds["overhead"],
        "generation_hidden_share": seconds["generation_hidden_share"],
    }
    for phase, value in seconds["phases"].items():
        out[f"{phase}_seconds"] = value
    for phase, values in report["phase_windows"].items():
        out[f"{phase}_steady_tokens_per_s_per_device"] = values.get(
            "steady_tokens_per_s_per_device"
        )
    rewards = [row["reward"] for row in report["iterations"] if row.get("reward") is not None]
    if rewards:  # named: two runs' different rewards are two rows, never one ratio
        out[f"{report['reward']}_last"] = rewards[-1]
    # Workers are named per run (hostname:pid): the runs compare on the highest peak.
    for field in PEAKS:
        values = [p[field] for p in report["memory_peak_bytes"].values() if field in p]
        if values:
            out[f"{field}_max_over_workers"] = max(values)
    return out


def streaming_effect(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    """What overlapping generation with training did to throughput, where two runs
    measure it: exactly one of them overlapped (its ``generation_hidden_share`` > 0, the
    other's 0 or none). ``overlapped``: ``"a"`` or ``"b"``; ``figure``: ``"steady
    state"`` when both runs have one (warm-up and drain, where streaming has nothing to
    overlap, left out), else ``"whole loop"``; ``throughput_ratio``: the overlapping
    run's tokens/s/device over the other's, in that figure (None without both).
    None when the two runs do not measure it (both overlapped, or neither)."""
    share_a = a["seconds"]["generation_hidden_share"] or 0.0
    share_b = b["seconds"]["generation_hidden_share"] or 0.0
    if (share_a > 0) == (share_b > 0):
        return None
    overlapped, other = (b, a) if share_b > 0 else (a, b)
    key, figure = "steady_tokens_per_s_per_device", "steady state"
    if overlapped["window"].get(key) is None or other["window"].get(key) is None:
        key, figure = "tokens_per_s_per_device", "whole loop"
    with_, without = overlapped["window"].get(key), other["window"].get(key)
    ratio = _finite(with_ / without) if isinstance(with_, int | float) and without else None
    return {
        "overlapped": "b" if share_b > 0 else "a",
        "figure": figure,
        "tokens_per_s_per_device_with_overlap": with_,
        "tokens_per_s_per_device_without": without,
        "throughput_ratio": ratio,
    }


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Figure by figure: A's, B's and B / A (None where either lacks it, A is 0 or the
    ratio is past a float's range)."""
    fa, fb = _figures(a), _figures(b)
    rows = []
    for name in [*fa, *(n for n in fb if n not in fa)]:
        va, vb = fa.get(name), fb.get(name)
        ratio = None
        if isinstance(va, int | float) and isinstance(vb, int | float) and va != 0:
            ratio = _finite(vb / va)
        rows.append({"figure": name, "a": va, "b": vb, "ratio": ratio})
    return rows


def phases_differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The phases the two runs define by other span names (``config.phases``), each with
    A's and B's names (None: not a phase of that run): a figure of such a phase measures
    other work in each run, and its ratio is no speed-up."""
    pa, pb = a.get("phase_patterns", {}), b.get("phase_patterns", {})
    return {
        phase: {"a": pa.get(phase), "b": pb.get(phase)}
        for phase in [*pa, *(p for p in pb if p not in pa)]
        if _named(pa.get(phase)) != _named(pb.get(phase))  # (any of its names matches)
    }


def _named(patterns: list[str] | None) -> frozenset[str] | None:
    return None if patterns is None else frozenset(patterns)


def _finite(ratio: float) -> float | None:
    """``ratio``, or None when it is past a float's range (a figure of 1e300 over one of
    1e-300: no ratio to print)."""
    return ratio if math.isfinite(ratio) else None
