"""``twinkle report --plots``: a report's figures as PNG files, drawn headless."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinkle.errors import InvalidArgumentError, ReporterError
from twinkle.metric import convert_bytes
from twinkle.reporting import ReplacingFile

__all__ = ["PLOTS", "time_parts", "write_plots"]

PLOTS = ("limits.png", "throughput.png", "time.png", "memory.png", "reward.png")

#: the critical path's kinds, bottom to top
_PATH_KINDS = ("training", "generation", "publish", "other", "overhead", "idle")


def time_parts(row: Mapping[str, Any], pair: tuple[str, str] | None) -> dict[str, float]:
    """One iteration's window cut into parts that add up to its wall clock: generation
    alone, training alone, both at once, other busy time, idle (without a streaming
    pair: busy and idle)."""
    wall = row.get("window_wall_seconds") or 0.0
    busy = row.get("window_busy_seconds") or 0.0
    idle = row.get("window_idle_seconds") or max(0.0, wall - busy)
    phases = row.get("window_phase_seconds") or {}
    overlap = row.get("window_overlap_generation_training_seconds")
    if pair is None or overlap is None:
        return {"busy": busy, "idle": idle}
    gen, train = phases.get(pair[0]) or 0.0, phases.get(pair[1]) or 0.0
    union = gen + train - overlap
    return {
        f"{pair[0]} alone": gen - overlap,
        f"{pair[1]} alone": train - overlap,
        f"{pair[0]} and {pair[1]} at once": overlap,
        "other busy": max(0.0, busy - union),
        "idle": idle,
    }


def write_plots(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """PNG plots of the report into ``out_dir`` (made if missing), drawn headless with
    matplotlib's Agg canvas: each window's critical path stacked by kind, titled with
    the run's verdict; tokens/s/device per iteration (warm-up, drain and partial
    windows marked) and per phase, with the steady state's and the whole loop's lines
    (and where each resumed segment starts);
    each iteration's window cut into generation, training, both at once, other busy
    time and idle; each worker's peak memory; the reward when there is one.

    No symbolic link is written through: ``out_dir`` itself being one, or a plot's
    file, is refused (:class:`~twinkle.errors.InvalidArgumentError`); each file is
    written whole (:class:`~twinkle.reporting.ReplacingFile`)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InvalidArgumentError(
            "--plots needs matplotlib: pip install 'twinkle[report]'"
        ) from exc
    out = _plots_dir(out_dir)
    rows = report["iterations"]
    title = f"run {report['run_id']}"
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        FigureCanvasAgg(fig)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        _write_whole(out / name, png.getvalue())
        written.append(out / name)

    fig = Figure(figsize=(8, 4.5))
    _limits(fig.add_subplot(), report, title)
    save(fig, "limits.png")

    fig = Figure(figsize=(8, 4.5))
    _throughput(fig.add_subplot(), report, title)
    save(fig, "throughput.png")

    pair = report.get("streaming")
    timed = [r for r in rows if "window_wall_seconds" in r]  # (iterations with a window)
    stacks = [time_parts(r, None if pair is None else tuple(pair)) for r in timed]
    parts = list(dict.fromkeys(part for stack in stacks for part in stack))
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    bottom = [0.0] * len(timed)
    for part in parts:
        heights = [stack.get(part, 0.0) for stack in stacks]
        ax.bar([r["iteration"] for r in timed], heights, bottom=bottom, label=part, width=0.9)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(title=f"{title}: each iteration's window", xlabel="iteration", ylabel="seconds")
    ax.legend(fontsize="small")
    save(fig, "time.png")

    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    workers = list(report["memory_peak_bytes"])
    fields = sorted({f for peaks in report["memory_peak_bytes"].values() for f in peaks})
    width = 0.8 / max(1, len(fields))
    for k, field in enumerate(fields):
        values = [
            convert_bytes(report["memory_peak_bytes"][w].get(field, 0), "MiB") for w in workers
        ]
        ax.bar([i + k * width for i in range(len(workers))], values, width, label=field)
    ax.set_xticks([i + width * (len(fields) - 1) / 2 for i in range(len(workers))], workers)
    ax.set(title=f"{title}: peak memory per worker", ylabel="MiB")
    if fields:  # (a run without memory readings: an empty plot, no legend)
        ax.legend(fontsize="small")
    save(fig, "memory.png")

    rewards = [(r["iteration"], r["reward"]) for r in rows if r.get("reward") is not None]
    if rewards:
        fig = Figure(figsize=(8, 4.5))
        ax = fig.add_subplot()
        ax.plot([i for i, _ in rewards], [v for _, v in rewards], marker=".")
        ax.set(title=f"{title}: {report['reward']}", xlabel="iteration", ylabel="reward")
        save(fig, "reward.png")
    return written


def _limits(ax: Any, report: Mapping[str, Any], title: str) -> None:
    """Each window's critical path stacked by kind (what its length waited on), titled
    with the run's verdict."""
    rows = [r for r in report["iterations"] if r.get("window_path_seconds")]
    its = [r["iteration"] for r in rows]
    bottom = [0.0] * len(rows)
    for kind in _PATH_KINDS:
        heights = [r["window_path_seconds"].get(kind) or 0.0 for r in rows]
        if any(heights):
            ax.bar(its, heights, bottom=bottom, label=kind, width=0.9)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    verdict = (report.get("limits") or {}).get("verdict", "not known")
    ax.set(
        title=f"{title}: critical path per window ({verdict})",
        xlabel="iteration",
        ylabel="seconds",
    )
    if rows:
        ax.legend(fontsize="small")


def _throughput(ax: Any, report: Mapping[str, Any], title: str) -> None:
    """Tokens/s/device per iteration (flagged windows hollow: not the steady state),
    each throughput phase's (over the time its work took), the steady state's line and
    the whole loop's."""
    rows = report["iterations"]
    its = [r["iteration"] for r in rows]
    line = ax.plot(
        its, [r.get("tokens_per_s_per_device") for r in rows], label="iteration (its window)"
    )[0]
    flagged = [r for r in rows if r.get("window_flags")]
    if flagged:
        ax.plot(
            [r["iteration"] for r in flagged],
            [r.get("tokens_per_s_per_device") for r in flagged],
            linestyle="none",
            marker="o",
            markerfacecolor="none",
            color=line.get_color(),
            label="warm-up, drain or partial (not steady)",
        )
    for phase in report.get("throughput_phases", []):
        values = [r.get("phase_tokens_per_s_per_device", {}).get(phase) for r in rows]
        ax.plot(its, values, linewidth=0.8, alpha=0.7, label=f"{phase} (its work's time)")
    window = report["window"]
    steady = window.get("steady_tokens_per_s_per_device")
    if steady is not None:
        ax.axhline(steady, color="black", label=f"steady state ({steady:,.0f})")
    loop = window.get("tokens_per_s_per_device")
    if loop is not None:
        ax.axhline(loop, color="grey", linestyle="--", label=f"whole loop ({loop:,.0f})")
    starts = [s["first_iteration"] for s in report.get("segments", [])[1:]]
    for k, first in enumerate(x for x in starts if x is not None):
        label = "a segment starts (resumed)" if k == 0 else None
        ax.axvline(first - 0.5, color="red", linestyle=":", label=label)
    ax.set(title=f"{title}: throughput", xlabel="iteration", ylabel="tokens/s/device")
    ax.legend(fontsize="small")


def _plots_dir(out_dir: str | os.PathLike[str]) -> Path:
    """The plots' directory (made, with its parents, by the first plot written); refused
    when it is a symbolic link (like a run directory: what it points at is not what the
    command was given) or not a directory."""
    out = Path(out_dir)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise InvalidArgumentError(
            f"--plots {str(out)!r} is {what}: plots are written into a directory of "
            "their own, never through a link; give a directory's real path, or a new one"
        )
    return out


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all, never through a symlink planted there."""
    try:
        out = ReplacingFile(path)
    except ReporterError as exc:
        raise InvalidArgumentError(f"--plots: {exc}") from None
    try:
        out.write(data)
    except BaseException:
        out.discard()
        raise
    out.commit()
