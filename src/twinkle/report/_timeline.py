"""The HTML page's timeline: the spans of ``trace.json`` over the run's last
:data:`TIMELINE_ITERATIONS` iterations, coloured by phase, a row per thread.

A row is named after its thread (the track's name before `` (…)``: ``trainer``,
``engine0``), and, when another process has a thread of that name too, after its
process as well: its worker (``rank1/trainer``), or the process's whole name (its host
and pid) when another process has that worker's name. Tracks of one name in one
process share a row (an engine's threads, a thread's lanes). At most
:data:`TIMELINE_ROWS` rows are drawn: the first in the trace's order of processes (the
run's own first), then of threads; the page says how many were left out, and which.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import orjson

from twinkle.report._format import plotly_text

__all__ = ["TIMELINE_ITERATIONS", "TIMELINE_ROWS", "Timeline", "row_names", "timeline"]

#: the iterations the timeline of spans shows (the last ones of the trace)
TIMELINE_ITERATIONS = 6
#: the rows drawn at most (a run of hundreds of workers: the page stays readable)
TIMELINE_ROWS = 48
#: the largest trace.json read for the timeline (a larger one is left out)
_TRACE_MAX_BYTES = 64 << 20
#: a track of ``trace.json``: its process and thread ids
Track = tuple[Any, Any]


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timeline's plotly figure, and what it left out (empty when nothing)."""

    figure: Any
    left_out: str


def timeline(
    go: Any, report: Mapping[str, Any], *, max_rows: int = TIMELINE_ROWS
) -> Timeline | None:
    """The timeline of the run of ``report`` (see the module docstring), drawn with
    plotly's ``graph_objects`` ``go``; None without a trace or a span to draw."""
    events = _trace_events(Path(report["run_dir"]) / "trace.json")
    if events is None:
        return None
    names = row_names(events)
    marks = sorted(e["ts"] for e in events if e.get("ph") == "i")
    since = marks[-TIMELINE_ITERATIONS] if len(marks) >= TIMELINE_ITERATIONS else 0.0
    spans = [
        (e, names.get((e["pid"], e["tid"]), f"{e['pid']}/{e['tid']}"))
        for e in events
        if e.get("ph") == "X" and e["ts"] + e.get("dur", 0) >= since
    ]
    order = _order(events)
    rows: dict[str, Track] = {}  # each row with a span, by name: its first track
    for e, name in spans:
        rows[name] = min(rows.get(name, (e["pid"], e["tid"])), (e["pid"], e["tid"]), key=order)
    ordered = sorted(rows, key=lambda name: order(rows[name]))
    drawn = set(ordered[:max_rows])
    phases = report.get("phase_patterns") or {}
    bars: dict[str, dict[str, list[Any]]] = {}
    for e, name in spans:
        if name not in drawn:
            continue
        phase = next((p for p, pats in phases.items()
                      if any(fnmatchcase(e["name"], pat) for pat in pats)), "other")  # fmt: skip
        bar = bars.setdefault(phase, {"x": [], "base": [], "y": [], "text": []})
        bar["x"].append(e.get("dur", 0) / 1e6)
        bar["base"].append(e["ts"] / 1e6)
        bar["y"].append(plotly_text(name))
        bar["text"].append(plotly_text(e["name"]))
    if not bars:
        return None
    return Timeline(_figure(go, bars, ordered[:max_rows]), _left_out(ordered, max_rows))


def row_names(events: list[Any]) -> dict[Track, str]:
    """Each thread track's row (see the module docstring), by its process and thread."""
    processes = {e["pid"]: e["args"]["name"] for e in events if _meta(e, "process_name")}
    threads = {(e["pid"], e["tid"]): _short(e["args"]["name"])
               for e in events if _meta(e, "thread_name")}  # fmt: skip
    pids_of: dict[str, set[Any]] = {}
    for (pid, _), thread in threads.items():
        pids_of.setdefault(thread, set()).add(pid)
    workers = {pid: _short(processes.get(pid, str(pid))) for pid, _ in threads}
    shared = Counter(workers.values())  # (a worker's name, by its processes)

    def process(pid: Any) -> str:
        worker = workers[pid]
        return worker if shared[worker] == 1 else str(processes.get(pid, pid))

    return {
        (pid, tid): thread if len(pids_of[thread]) == 1 else f"{process(pid)}/{thread}"
        for (pid, tid), thread in threads.items()
    }


def _figure(go: Any, bars: Mapping[str, Mapping[str, list[Any]]], rows: list[str]) -> Any:
    """Each phase's spans as horizontal bars on the rows, the first row at the top."""
    layout = {
        "height": max(420, 80 + 16 * len(rows)),
        "margin": {"t": 30},
        "barmode": "overlay",
        "xaxis": {"title": {"text": "seconds since the run started"}},
        "yaxis": {"categoryorder": "array", "autorange": "reversed",
                  "categoryarray": [plotly_text(row) for row in rows]},
    }  # fmt: skip
    fig = go.Figure(layout=layout)
    for phase, bar in bars.items():
        fig.add_bar(orientation="h", name=plotly_text(phase), x=bar["x"], base=bar["base"],
                    y=bar["y"], hovertext=bar["text"],
                    hovertemplate="%{hovertext}: %{x:.4f} s<extra></extra>")  # fmt: skip
    return fig


def _left_out(rows: list[str], max_rows: int) -> str:
    if len(rows) <= max_rows:
        return ""
    left = rows[max_rows:]
    which = left[0] if len(left) == 1 else f"{left[0]} … {left[-1]}"
    return (
        f"{len(rows)} threads' rows, the first {max_rows} drawn; {len(left)} left out "
        f"({which}): trace.json has them all"
    )


def _order(events: list[Any]) -> Any:
    """A track's place: its process's among the trace's named processes (unnamed ones
    last), then its thread's."""
    named = [e["pid"] for e in events if _meta(e, "process_name")]
    place = {pid: n for n, pid in reversed(list(enumerate(named)))}
    return lambda track: (place.get(track[0], len(place)), track[0], track[1])


def _trace_events(trace: Path) -> list[Any] | None:
    try:
        if trace.stat().st_size > _TRACE_MAX_BYTES:
            return None
        events = orjson.loads(trace.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None  # (none yet, or a run in progress: its trace is written at the end)
    return events if isinstance(events, list) else None


def _meta(event: Any, name: str) -> bool:
    return bool(event.get("ph") == "M" and event.get("name") == name)


def _short(name: str) -> str:
    return name.partition(" (")[0]
