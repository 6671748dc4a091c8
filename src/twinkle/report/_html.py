"""``twinkle report RUN [RUN_B] --html FILE``: the report as one self-contained HTML file.

Everything is in the file: the styles, plotly.js (inlined once, ~4.7 MB: no network
request, it opens offline) and the data of each plot. It holds the run's status and
what limits it, its figures, the per-iteration table (the text report's cells), and
interactive plots (zoom, pan, hover values): tokens/s/device per iteration, each
window's time, its critical path, peak memory per worker, the reward, and a timeline
of each worker's spans over the last iterations (from ``trace.json``), a row per
thread, coloured by phase (:mod:`twinkle.report._timeline`). The run's names (its
workers', threads', phases', spans') are shown as written, in the plots too. With a
second run, B's plots are drawn over A's, and both runs' figures and tables are shown.

Every figure shown carries its exact value in ``data-value`` beside the name of the
report key it comes from (``data-key``): what the page says can be checked against
``summary.json`` (tests/test_html_report.py does, in headless Chromium).
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinkle.checks import printable
from twinkle.errors import InvalidArgumentError
from twinkle.report._format import error_line, highest_peaks, num, plotly_text
from twinkle.report._limits_text import limits_lines
from twinkle.report._plots import time_parts
from twinkle.report._text import iteration_cells, live_lines
from twinkle.report._timeline import timeline

__all__ = ["html_report", "write_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td.name { text-align: left; }
pre { background: #f7f7f7; padding: 0.8em; white-space: pre-wrap; overflow-wrap: anywhere; }
.runs { display: flex; gap: 3em; flex-wrap: wrap; }
.runs > section { flex: 1 1 30em; min-width: 0; }
.wide { overflow-x: auto; }
"""
#: the run's figures shown, each with the report key it reads
_FIGURES = (
    ("steady state tokens/s/device", ("window", "steady_tokens_per_s_per_device")),
    ("steady iterations", ("window", "steady_iterations")),
    ("whole loop tokens/s/device", ("window", "tokens_per_s_per_device")),
    ("tokens", ("window", "tokens")),
    ("wall s", ("seconds", "wall")),
    ("busy s", ("seconds", "busy")),
    ("idle s", ("seconds", "idle")),
    ("twinkle's own s", ("seconds", "overhead")),
)


def write_html(
    report: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    other: Mapping[str, Any] | None = None,
) -> Path:
    """Write :func:`html_report` of ``report`` (and ``other``) to ``path``, whole (an
    existing file only when it is an HTML page: :func:`write_file`)."""
    from twinkle.report._plots import HTML_START, write_file

    page = html_report(report, other=other).encode()
    return write_file(path, page, flag="--html", start=HTML_START)


def html_report(report: Mapping[str, Any], *, other: Mapping[str, Any] | None = None) -> str:
    """The report page (see the module docstring)."""
    try:
        import plotly.graph_objects as go
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise InvalidArgumentError("--html needs plotly: pip install 'twinkle[report]'") from exc
    runs = [("A", report), ("B", other)] if other is not None else [("", report)]
    title = " vs ".join(f"run {r['run_id']}" for _, r in runs if r is not None)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>twinkle: {_e(title)}</title><style>{_STYLE}</style>",
        f"<script>{get_plotlyjs()}</script></head><body>",
        f"<h1>twinkle: {_e(title)}</h1>",
    ]
    parts.append("<div class='runs'>")
    for tag, r in runs:
        assert r is not None
        parts.append(_run_section(tag, r))
    parts.append("</div>")
    plots = _plots(go, [(t, r) for t, r in runs if r is not None])
    for name, fig, left_out in plots:
        parts.append(f"<h2>{_e(name)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=_id(name)))
        if left_out:
            parts.append(f"<p class='left-out'>{_e(left_out)}</p>")
    for tag, r in runs:
        assert r is not None
        parts.append(f"<h2>{_e(_tagged(tag, 'per iteration'))}</h2>")
        parts.append(_table(r))
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_section(tag: str, report: Mapping[str, Any]) -> str:
    limits = report.get("limits") or {}
    rows = []
    for name, (group, key) in _FIGURES:
        value = (report.get(group) or {}).get(key)
        shown = num(value)
        rows.append(
            f"<tr><td class='name'>{_e(name)}</td><td data-key='{group}.{key}' "
            f"data-value='{_e(repr(value))}'>{shown}</td></tr>"
        )
    live = "".join(f"<p>{_e(line)}</p>" for line in live_lines(report))
    if report.get("error"):  # (a run that ended in error: why)
        live = f"<p>error <b data-key='error'>{_e(error_line(str(report['error'])))}</b></p>" + live
    return (
        f"<section><h2>{_e(_tagged(tag, 'run ' + report['run_id']))}</h2>"
        f"<p>status <b data-key='status'>{_e(report['status'])}</b> · "
        f"verdict <b data-key='limits.verdict'>{_e(str(limits.get('verdict', 'not known')))}"
        f"</b></p>{live}<table>{''.join(rows)}</table>"
        f"<pre>{chr(10).join(map(_e, limits_lines(report)))}</pre></section>"
    )


def _table(report: Mapping[str, Any]) -> str:
    header, rows = iteration_cells(report)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        f"<tr data-iteration='{_e(row[0])}'>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<div class='wide'><table class='iterations'><tr>{head}</tr>{body}</table></div>"


def _plots(go: Any, runs: list[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, Any, str]]:
    """The page's plotly figures: each one's title, figure and what it left out."""
    layout = {"height": 420, "margin": {"t": 30}, "hovermode": "closest"}
    rate, time_, path, memory, reward = (go.Figure(layout=layout) for _ in range(5))
    left_out = ""
    for tag, r in runs:
        dash = "dash" if tag == "B" else "solid"
        rows = r["iterations"]
        its = [row["iteration"] for row in rows]
        overall = [row.get("tokens_per_s_per_device") for row in rows]
        rate.add_scatter(x=its, y=overall, name=_label(tag, "iteration (its window)"),
                         line={"dash": dash})  # fmt: skip
        for phase in r.get("throughput_phases", []):
            values = [row.get("phase_tokens_per_s_per_device", {}).get(phase) for row in rows]
            rate.add_scatter(x=its, y=values, name=_label(tag, f"{phase} (its work's time)"),
                             line={"dash": dash, "width": 1})  # fmt: skip
        pair = r.get("streaming")
        timed = [row for row in rows if "window_wall_seconds" in row]
        stacks = [time_parts(row, None if pair is None else tuple(pair)) for row in timed]
        for part in dict.fromkeys(p for stack in stacks for p in stack):
            time_.add_bar(x=[row["iteration"] for row in timed],
                          y=[stack.get(part, 0.0) for stack in stacks],
                          name=_label(tag, part), offsetgroup=tag or "A")  # fmt: skip
        windows = [row for row in rows if row.get("window_path_seconds")]
        kinds = dict.fromkeys(k for row in windows for k in row["window_path_seconds"])
        for kind in kinds:
            path.add_bar(x=[row["iteration"] for row in windows],
                         y=[row["window_path_seconds"].get(kind) or 0.0 for row in windows],
                         name=_label(tag, kind), offsetgroup=tag or "A")  # fmt: skip
        left_out += _memory_bars(memory, tag, r["memory_peak_bytes"])
        rewards = [
            (row["iteration"], row["reward"]) for row in rows if row.get("reward") is not None
        ]
        if rewards:
            reward.add_scatter(x=[i for i, _ in rewards], y=[v for _, v in rewards],
                               name=_label(tag, r["reward"]), line={"dash": dash})  # fmt: skip
    rate.update_layout(xaxis_title="iteration", yaxis_title="tokens/s/device")
    time_.update_layout(barmode="stack", xaxis_title="iteration", yaxis_title="seconds")
    path.update_layout(barmode="stack", xaxis_title="iteration", yaxis_title="seconds")
    memory.update_layout(barmode="group", yaxis_title="MiB")
    reward.update_layout(xaxis_title="iteration", yaxis_title="reward")
    plots = [("throughput", rate, ""), ("each iteration's window", time_, ""),
             ("critical path per window (what its length waited on)", path, ""),
             ("peak memory per worker", memory, left_out.strip())]  # fmt: skip
    if reward.data:
        plots.append(("reward", reward, ""))
    for tag, r in runs:
        drawn = timeline(go, r)
        if drawn is not None:
            title = _tagged(tag, "each worker's spans, the last iterations")
            plots.append((title, drawn.figure, drawn.left_out))
    return plots


#: the most workers the peak memory plot draws (those with the highest peaks)
MEMORY_WORKERS = 48


def _memory_bars(memory: Any, tag: str, peaks: Mapping[str, Mapping[str, int]]) -> str:
    """Each field's bars of peak memory per worker, the :data:`MEMORY_WORKERS` with the
    highest peaks (their order kept); what it left out, in words."""
    drawn = set(highest_peaks(peaks)[:MEMORY_WORKERS])
    workers = [w for w in peaks if w in drawn]
    for field in sorted({f for p in peaks.values() for f in p}):
        memory.add_bar(x=[_label(tag, w) for w in workers],
                       y=[peaks[w].get(field, 0) / 2**20 for w in workers],
                       name=_label("", field))  # fmt: skip
    if len(peaks) <= MEMORY_WORKERS:
        return ""
    return (
        f" {_tagged(tag, '')}{len(peaks) - MEMORY_WORKERS} of {len(peaks)} workers with lower "
        "peaks are left out (report --json has every one)."
    )


def _tagged(tag: str, name: str) -> str:
    return f"{tag}: {name}" if tag else name


def _label(tag: str, name: str) -> str:
    """A figure's label (a trace's name, a tick, a hover text): the run's text shown as
    written, never as plotly's HTML (every label of a figure is made here)."""
    return plotly_text(_tagged(tag, name))


def _id(name: str) -> str:
    return "plot-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def _e(text: str) -> str:
    """``text`` (one line) as HTML, its control characters escaped as the text report
    escapes them (a name from a log may hold a terminal's escape or a bidi override)."""
    return html.escape(printable(str(text)), quote=True)
