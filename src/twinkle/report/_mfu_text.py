"""The report's MFU lines: per phase, the steady state's and the whole loop's share of
the peak (or the model FLOP/s alone, without a peak), and the peak's source."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["mfu_lines", "mfu_phases", "mfu_share"]


def mfu_phases(report: Mapping[str, Any]) -> dict[str, str]:
    """The phases with an MFU column and the figure each shows (``mfu``, ``hfu``): none
    without a peak (the lines below the table say why)."""
    mfu = report.get("mfu") or {}
    if mfu.get("peak_flops_per_s") is None:
        return {}
    return {p: d["figure"] for p, d in mfu.get("phases", {}).items()}


def mfu_share(found: Mapping[str, Any] | None) -> str:
    """A share of the peak in per cent; over 100 % marked ``!`` (implied, not MFU)."""
    if not found or found.get("share") is None:
        return "-"
    return f"{100 * found['share']:.1f}" + ("!" if found.get("implied") else "")


def _rate(flops_per_s: Any) -> str:
    if flops_per_s is None:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {unit}"
    return f"{flops_per_s:.3g} FLOP/s"


def mfu_lines(report: Mapping[str, Any]) -> list[str]:
    """The run's MFU per phase (steady state, then the whole loop) and its peak, or why
    there is none."""
    mfu = report.get("mfu")
    if not mfu:
        return []
    if "phases" not in mfu:
        return [f"MFU                 n/a: {mfu.get('abstained')}"]
    run = mfu.get("run", {})

    def figure(prefix: str, phase: str, work: Mapping[str, Any]) -> str:
        name = f"{prefix}{phase}_"
        rate = _rate(run.get(name + "flops_per_s_per_device"))
        share = run.get(name + work["figure"])
        implied = run.get(f"{name}implied_{work['figure']}")
        if share is not None:
            return f"{phase} {100 * share:.1f}% ({rate}/device)"
        if implied is not None:
            over = f"implied {100 * implied:.0f}%, not a utilisation"
            return f"{phase} over the peak: {over} ({rate}/device)"
        return f"{phase} {rate}/device"

    phases = mfu["phases"].items()
    peak = mfu.get("peak_flops_per_s")
    names = "/".join(sorted({w["figure"].upper() for _, w in phases}))
    names = names if peak is not None else "model FLOP/s"
    lines = [
        f"{names:<20}" + ", ".join(figure("steady_", p, w) for p, w in phases) + " (steady state)",
        "  whole loop        " + ", ".join(figure("", p, w) for p, w in phases),
    ]
    device = f"{mfu.get('device') or 'the device'}, {mfu.get('dtype')}"
    if peak is None:
        lines.append(f"  peak              none for {device}: {mfu.get('abstained')}")
    else:
        lines.append(
            f"  peak              {_rate(peak)} per device ({device}): {mfu.get('peak_source')}"
        )
    return lines
