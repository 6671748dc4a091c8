"""``twinkle watch RUN``: a run followed while another process writes it, its view
refreshed in place in the terminal.

The view is the report of a :class:`~twinkle.run.Follower`'s snapshot: the same
figures ``twinkle report`` gives, of the log so far. In a terminal rich's
:class:`~rich.live.Live` redraws it in place as a
:class:`~twinkle.report._live_view.LiveView`, fitted to the terminal's size at each
redraw (its text wrapped, the table's newest rows in the height left); on a stream
that is no terminal (a pipe, a file) each new view is printed whole
(:func:`format_live`), once, after a rule. The watch ends when the run finishes (its
last segment's ``run_finished`` is in the log and its writer let go of the directory;
exit code 1 when it ended in error, its error shown under the run's line), on Ctrl-C,
or after one view with ``once``. A run whose writer died keeps being watched, as it
says: a restart with the same run id resumes it, and the view follows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from twinkle.errors import ReplayError
from twinkle.observers import EVENTS_FILE
from twinkle.report import live_report, log_emptied
from twinkle.report._limits_text import limits_lines
from twinkle.report._text import (
    as_text,
    head_lines,
    iteration_table,
    memory_lines,
    throughput_lines,
)
from twinkle.run import Follower

__all__ = ["format_live", "watch"]

#: rows of the terminal a printed view (no terminal) leaves to everything but the
#: table's iterations
_AROUND_TABLE = 30
_WATCHING_ON = "watching on: a restart with the same run id resumes it (Ctrl-C to stop)"


def watch(
    run_dir: str | Path,
    *,
    interval_s: float = 2.0,
    once: bool = False,
    reward: str | None = None,
    console: Any = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow ``run_dir``, showing its view on ``console`` (a :class:`rich.console.Console`;
    default: stdout) every ``interval_s`` seconds the log grew (or a terminal was
    resized); returns the exit code once the run finished, 1 when it ended in error,
    else 0 (and 0 after one view with ``once`` of a run not finished). A run directory
    without a log yet is waited for (with ``once``: :class:`~twinkle.errors.ReplayError`)."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    run = Path(run_dir)
    follower = _open(run, console, interval_s, sleep, once)
    with follower:
        shown: tuple[int, str, Any] | None = None
        # (a view taller than the terminal is cut with rich's "...": LiveView fits it)
        with Live(console=console, auto_refresh=False, vertical_overflow="ellipsis") as live:
            while True:
                follower.poll()
                report, state = _look(run, follower, reward)
                size = console.size if console.is_terminal else None
                if (follower.events, state, size) != shown:
                    shown = (follower.events, state, size)
                    _show(console, live, run, report, state, watching=not once)
                if state == "finished":
                    return 1 if report is not None and report["status"] == "error" else 0
                if once:
                    return 0
                sleep(interval_s)


def _show(
    console: Any,
    live: Any,
    run: Path,
    report: dict[str, Any] | None,
    state: str,
    *,
    watching: bool = True,
) -> None:
    """The view of ``report`` drawn in place on a terminal (:class:`LiveView`, fitted to
    it), else printed whole after a rule; a stopped run's says it is watched on, unless
    this is the one view (``watching`` false: ``--once``)."""
    from rich.text import Text

    from twinkle.report._live_view import LiveView  # (rich: imported once watching)

    trailer = ["", _WATCHING_ON] if state == "stopped" and watching else []
    if report is None:
        view: Any = Text(f"{run}: no event yet")
    elif console.is_terminal:
        view = LiveView(report, trailer=trailer)
    else:
        lines = format_live(report, rows=max(3, console.size.height - _AROUND_TABLE))
        view = Text("\n".join([lines, *trailer]))
    if console.is_terminal:
        live.update(view, refresh=True)
    else:
        console.rule()
        console.print(view, soft_wrap=True)


def _open(
    run: Path, console: Any, interval_s: float, sleep: Callable[[float], None], once: bool
) -> Follower:
    """A follower of ``run`` once its log holds a line: waited for (said once), or with
    ``once`` a :class:`~twinkle.errors.ReplayError` saying it is not there. What no
    wait mends (``run`` a file, its log not a regular file, a run that wrote its
    summary and whose log was emptied after) is raised at once."""
    said = False
    while True:
        try:
            follower = Follower(run)
        except ReplayError:
            log = run / EVENTS_FILE
            if once or run.is_file() or (os.path.lexists(log) and not log.is_file()):
                raise  # (a log made meanwhile is read next time round)
        else:
            follower.poll()
            if follower.events or once:
                return follower
            follower.close()  # (a log with no event yet: its run is starting, unless...)
        emptied = log_emptied(run)
        if emptied is not None:
            raise ReplayError(f"{str(run / EVENTS_FILE)!r} holds no event{emptied}")
        if not said:
            console.print(f"waiting for {run}/events.jsonl (Ctrl-C to stop) ...", markup=False)
            said = True
        sleep(interval_s)


def format_live(report: Mapping[str, Any], *, rows: int) -> str:
    """``twinkle watch``'s view: the run's state, what limits it, the last ``rows``
    iterations of the table, its throughput and memory (one vocabulary with
    :func:`format_report`)."""
    lines = [*head_lines(report), ""]
    lines += [*limits_lines(report), ""]
    table = iteration_table(report)
    shown = table[2:][-rows:] if rows > 0 else []
    if len(shown) < len(table) - 2:
        lines.append(f"(the last {len(shown)} of {len(table) - 2} iterations)")
    lines += [*table[:2], *shown, ""]
    lines += throughput_lines(report)
    lines += memory_lines(report)
    return as_text(lines)


def _look(run: Path, follower: Follower, reward: str | None) -> tuple[dict[str, Any] | None, str]:
    """The report of the log so far (None before its first event) and the run's state
    (``finished``, ``in progress`` or ``stopped``)."""
    if not follower.events:
        return None, "in progress"
    report = live_report(run, follower.snapshot(), reward=reward)
    state = report["live"]["state"]
    if state == "finished" and report["live"]["alive"]:
        state = "in progress"  # (its writer still closes its files: watched on)
    return report, state
