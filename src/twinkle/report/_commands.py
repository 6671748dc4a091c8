"""The ``twinkle report`` and ``twinkle watch`` commands (their arguments are parsed by
:mod:`twinkle.cli`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from twinkle.checks import printable
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.report import (
    compare,
    format_compare,
    format_report,
    load_report,
    phases_differ,
    streaming_effect,
    write_plots,
)
from twinkle.report._html import write_html
from twinkle.report._watch import watch

__all__ = ["report_command", "watch_command"]


#: what would help a run, and its text: ``twinkle.whatif``'s (above this layer: the
#: command line passes them in for ``--whatif``)
Helps = tuple[Callable[[str], list[dict[str, Any]]], Callable[[list[dict[str, Any]]], str]]


def report_command(args: argparse.Namespace, helps: Helps | None = None) -> int:
    """``twinkle report``: one run's report, or two side by side (text or JSON), and
    the plots and the HTML page it was asked for; with ``helps`` (``--whatif``), one
    run's report ends with what would help it."""
    # Both runs first: one that cannot be reported stops the command before any output.
    first = load_report(args.run, reward=args.reward)
    second = None if args.other is None else load_report(args.other, reward=args.reward)
    if args.plots is not None:
        for path in write_plots(first, args.plots, other=second):
            print(printable(f"wrote {path}"), file=sys.stderr)
    if args.html is not None:
        print(printable(f"wrote {write_html(first, args.html, other=second)}"), file=sys.stderr)
    if second is None:
        extra = ""
        if helps is not None:
            find, show = helps
            try:
                rows = find(args.run)
            except TwinkleError as exc:  # (a run it cannot predict: its report still stands)
                first["what_would_help"] = {"error": str(exc)}
                extra = f"\n\nwhat would help: not predicted: {exc}"
            else:
                first["what_would_help"], extra = rows, "\n\n" + show(rows)
        print(_json(first) if args.json else format_report(first) + extra)
        return 0
    if args.json:
        both: dict[str, Any] = {"a": first, "b": second, "compare": compare(first, second)}
        both["streaming_effect"] = streaming_effect(first, second)
        both["phases_differ"] = phases_differ(first, second)
        print(_json(both))
    else:
        print(format_compare(first, second))
    return 0


def _json(report: Any) -> str:
    """``report`` as strict JSON, in ASCII: a value that is not finite is null, as in
    ``summary.json`` (``json.dumps`` alone writes ``NaN`` or ``Infinity``, which JSON
    readers refuse; orjson, which writes null, refuses a path that is not UTF-8, as a
    run directory's name may be, where ``json`` escapes it)."""
    return json.dumps(_finite(report), indent=1, allow_nan=False)


def _finite(value: Any) -> Any:
    """``value`` with each float that is not finite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


#: the longest wait between two looks of ``twinkle watch`` (an hour)
MAX_INTERVAL_S = 3600.0


def watch_command(args: argparse.Namespace) -> int:
    """``twinkle watch``: 0 once the run finished well, or when the watch is stopped; 1
    once it finished in error."""
    if not 0 < args.interval <= MAX_INTERVAL_S:
        raise InvalidArgumentError(
            f"--interval must be a number of seconds in (0, {MAX_INTERVAL_S:g}], got "
            f"{args.interval}"
        )
    try:
        return watch(args.run, interval_s=args.interval, once=args.once, reward=args.reward)
    except KeyboardInterrupt:
        return 0  # (stopped watching: the run goes on)
