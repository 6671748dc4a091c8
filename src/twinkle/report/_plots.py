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


def write_plots(
    report: Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    *,
    other: Mapping[str, Any] | None = None,
) -> list[Path]:
    """PNG plots of the report into ``out_dir`` (made if missing), drawn headless with
    matplotlib's Agg canvas: each window's critical path stacked by kind, titled with
    the run's verdict; tokens/s/device per iteration (warm-up, drain and partial
    windows marked) and per phase, with the steady state's and the whole loop's lines
    (and where each resumed segment starts);
    each iteration's window cut into generation, training, both at once, other busy
    time and idle; each worker's peak memory; the reward when there is one. With
    ``other`` (a second run's report), each plot shows both: run B over run A, B's
    lines dashed and its bars hatched beside A's.

    No symbolic link is written through: ``out_dir`` itself being one, or a plot's
    file, is refused (:class:`~twinkle.errors.InvalidArgumentError`), as is a plot's
    file that is not a PNG (a file of the user's), each before any is written; each
    file is written whole (:class:`~twinkle.reporting.ReplacingFile`)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InvalidArgumentError(
            "--plots needs matplotlib: pip install 'twinkle[report]'"
        ) from exc
    out = _plots_dir(out_dir)
    drawn = figures(report, other=other, figure=Figure)
    for name in drawn:  # (each checked before any is written)
        _check_replaceable(out / name, "--plots", PNG_START)
    written: list[Path] = []
    for name, fig in drawn.items():
        FigureCanvasAgg(fig)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        _write_whole(out / name, png.getvalue())
        written.append(out / name)
    return written


def figures(
    report: Mapping[str, Any], *, other: Mapping[str, Any] | None = None, figure: Any
) -> dict[str, Any]:
    """The plots of :func:`write_plots` as matplotlib figures made by ``figure`` (the
    ``Figure`` class), by file name."""
    runs = [_Run(report, "A" if other else "", 0)]
    if other is not None:
        runs.append(_Run(other, "B", 1))
    title = " vs ".join(f"run {r.report['run_id']}{r.tag}" for r in runs)
    drawn = {"limits.png": _limits, "throughput.png": _throughput, "time.png": _time,
             "memory.png": _memory}  # fmt: skip
    if any(r.get("reward") is not None for run in runs for r in run.report["iterations"]):
        drawn["reward.png"] = _reward
    made = {}
    for name, draw in drawn.items():
        fig = figure(figsize=(10, 4.5), layout="constrained")
        draw(fig.add_subplot(), runs, title)
        made[name] = fig
    return made


def _legend(ax: Any) -> None:
    """The plot's legend beside it, right of the axes: never over the data."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)


class _Run:
    """One run of a plot: its report, its tag (``A``, ``B``; none alone) and its place
    (0, 1): bars side by side, B's hatched, its lines dashed."""

    def __init__(self, report: Mapping[str, Any], name: str, place: int) -> None:
        self.report, self.name, self.place = report, name, place
        self.tag = f" ({name})" if name else ""
        self.prefix = f"{name}: " if name else ""
        self.hatch = "//" if place else None
        self.style = "--" if place else "-"

    def bars(self, its: list[int], runs: int) -> tuple[list[float], float]:
        """Where this run's bars stand, and their width (side by side when two)."""
        width = 0.9 / runs
        return [i + (self.place - (runs - 1) / 2) * width for i in its], width


def _limits(ax: Any, runs: list[_Run], title: str) -> None:
    """Each window's critical path stacked by kind (what its length waited on), titled
    with each run's verdict."""
    colors: dict[str, Any] = {}
    for run in runs:
        rows = [r for r in run.report["iterations"] if r.get("window_path_seconds")]
        xs, width = run.bars([r["iteration"] for r in rows], len(runs))
        bottom = [0.0] * len(rows)
        for kind in _PATH_KINDS:
            heights = [r["window_path_seconds"].get(kind) or 0.0 for r in rows]
            if any(heights):
                bars = ax.bar(xs, heights, bottom=bottom, width=width, hatch=run.hatch,
                              label=f"{run.prefix}{kind}", color=colors.get(kind))  # fmt: skip
                colors.setdefault(kind, bars.patches[0].get_facecolor())
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    verdicts = ", ".join(
        f"{run.prefix}{(run.report.get('limits') or {}).get('verdict', 'not known')}"
        for run in runs
    )
    ax.set(title=f"{title}: critical path per window ({verdicts})", xlabel="iteration",
           ylabel="seconds")  # fmt: skip
    if colors:
        _legend(ax)


def _throughput(ax: Any, runs: list[_Run], title: str) -> None:
    """Tokens/s/device per iteration (flagged windows hollow: not the steady state),
    each throughput phase's (over the time its work took), the steady state's line and
    the whole loop's, of each run."""
    for run in runs:
        rows, p = run.report["iterations"], run.prefix
        its = [r["iteration"] for r in rows]
        values = [r.get("tokens_per_s_per_device") for r in rows]
        line = ax.plot(its, values, linestyle=run.style, label=f"{p}iteration (its window)")[0]
        flagged = [r for r in rows if r.get("window_flags")]
        if flagged:
            ax.plot(
                [r["iteration"] for r in flagged],
                [r.get("tokens_per_s_per_device") for r in flagged],
                linestyle="none", marker="o", markerfacecolor="none", color=line.get_color(),
                label=f"{p}warm-up, drain or partial (not steady)",
            )  # fmt: skip
        for phase in run.report.get("throughput_phases", []):
            phased = [r.get("phase_tokens_per_s_per_device", {}).get(phase) for r in rows]
            ax.plot(its, phased, linewidth=0.8, alpha=0.7, linestyle=run.style,
                    label=f"{p}{phase} (its work's time)")  # fmt: skip
        window = run.report["window"]
        steady = window.get("steady_tokens_per_s_per_device")
        if steady is not None:
            ax.axhline(steady, color="black", linestyle=run.style,
                       label=f"{p}steady state ({steady:,.0f})")  # fmt: skip
        loop = window.get("tokens_per_s_per_device")
        if loop is not None:
            ax.axhline(loop, color="grey", linestyle=":" if run.place else "--",
                       label=f"{p}whole loop ({loop:,.0f})")  # fmt: skip
        starts = [s["first_iteration"] for s in run.report.get("segments", [])[1:]]
        for k, first in enumerate(x for x in starts if x is not None):
            label = f"{p}a segment starts (resumed)" if k == 0 else None
            ax.axvline(first - 0.5, color="red", linestyle=":", label=label)
    ax.set(title=f"{title}: throughput", xlabel="iteration", ylabel="tokens/s/device")
    _legend(ax)


def _time(ax: Any, runs: list[_Run], title: str) -> None:
    """Each iteration's window cut into parts that add up to its wall clock."""
    colors: dict[str, Any] = {}
    for run in runs:
        pair = run.report.get("streaming")
        timed = [r for r in run.report["iterations"] if "window_wall_seconds" in r]
        stacks = [time_parts(r, None if pair is None else tuple(pair)) for r in timed]
        xs, width = run.bars([r["iteration"] for r in timed], len(runs))
        bottom = [0.0] * len(timed)
        for part in dict.fromkeys(part for stack in stacks for part in stack):
            heights = [stack.get(part, 0.0) for stack in stacks]
            bars = ax.bar(xs, heights, bottom=bottom, width=width, hatch=run.hatch,
                          label=f"{run.prefix}{part}", color=colors.get(part))  # fmt: skip
            colors.setdefault(part, bars.patches[0].get_facecolor() if bars.patches else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(title=f"{title}: each iteration's window", xlabel="iteration", ylabel="seconds")
    _legend(ax)


def _memory(ax: Any, runs: list[_Run], title: str) -> None:
    """Each worker's peak memory per field (B's workers after A's, named so)."""
    peaks = {
        f"{run.prefix}{worker}": (run, fields)
        for run in runs
        for worker, fields in run.report["memory_peak_bytes"].items()
    }
    workers = list(peaks)
    fields = sorted({f for _, got in peaks.values() for f in got})
    width = 0.8 / max(1, len(fields))
    for k, field in enumerate(fields):
        values = [convert_bytes(peaks[w][1].get(field, 0), "MiB") for w in workers]
        hatches = [peaks[w][0].hatch for w in workers]
        bars = ax.bar([i + k * width for i in range(len(workers))], values, width, label=field)
        for bar, hatch in zip(bars.patches, hatches, strict=True):
            bar.set_hatch(hatch)
    ax.set_xticks([i + width * (len(fields) - 1) / 2 for i in range(len(workers))], workers)
    ax.set(title=f"{title}: peak memory per worker", ylabel="MiB")
    if fields:  # (a run without memory readings: an empty plot, no legend)
        _legend(ax)


def _reward(ax: Any, runs: list[_Run], title: str) -> None:
    for run in runs:
        rows = run.report["iterations"]
        rewards = [(r["iteration"], r["reward"]) for r in rows if r.get("reward") is not None]
        if rewards:
            ax.plot([i for i, _ in rewards], [v for _, v in rewards], marker=".",
                    linestyle=run.style, label=f"{run.prefix}{run.report['reward']}")  # fmt: skip
    ax.set(title=f"{title}: reward", xlabel="iteration", ylabel="reward")
    _legend(ax)


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


#: how an HTML page and a PNG image begin (what an earlier output may be replaced by)
HTML_START = b"<!doctype html"
PNG_START = b"\x89PNG\r\n\x1a\n"


def write_png(path: str | os.PathLike[str], data: bytes, *, flag: str) -> Path:
    """Write the PNG image ``data`` to the file option ``flag`` names, as
    :func:`write_file` does: never over a file that is not an earlier PNG."""
    return write_file(path, data, flag=flag, start=PNG_START)


def write_file(path: str | os.PathLike[str], data: bytes, *, flag: str, start: bytes) -> Path:
    """Write ``data`` to the file option ``flag`` names, whole. Refused, naming it, when
    it is a link, a directory or not a regular file, or a file that is not an earlier
    output of its kind (it begins, ignoring case, with ``start``): a run's
    ``events.jsonl`` given by mistake is never replaced."""
    out = Path(path)
    _check_replaceable(out, flag, start)
    _write_whole(out, data, flag)
    return out


def _check_replaceable(out: Path, flag: str, start: bytes) -> None:
    """Refuse, naming it, to write ``out`` when it is a link, a directory or not a
    regular file, or a file that does not begin (ignoring case) with ``start``."""
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise InvalidArgumentError(
            f"{flag} {str(out)!r} is a symbolic link, a directory or not a regular file: give the "
            "path of the file to write"
        )
    if out.exists():
        with out.open("rb") as existing:
            head = existing.read(len(start))
        if head and head.lower() != start.lower():
            raise InvalidArgumentError(
                f"{flag} {str(out)!r} holds something other than what {flag} writes (it "
                "would be replaced: a run's own file, say): give a new path, or remove it "
                "first"
            )


def _write_whole(path: Path, data: bytes, flag: str = "--plots") -> None:
    """Write ``path`` whole or not at all, never through a symlink planted there."""
    try:
        out = ReplacingFile(path)
    except ReporterError as exc:
        raise InvalidArgumentError(f"{flag}: {exc}") from None
    try:
        out.write(data)
    except BaseException:
        out.discard()
        raise
    out.commit()
