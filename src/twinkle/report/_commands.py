"""The ``twinkle report`` and ``twinkle watch`` commands (their arguments are parsed by
:mod:`twinkle.cli`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import orjson

from twinkle.checks import printable
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.report import (
    compare,
    format_compare,
    format_report,
    load_report,
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
        print(_json(both))
    else:
        print(format_compare(first, second))
    return 0


def _json(report: Any) -> str:
    """``report`` as strict JSON (orjson: a value that is not finite is null, as in
    ``summary.json``; ``json.dumps`` would write ``NaN`` or ``Infinity``, which JSON
    readers refuse)."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def watch_command(args: argparse.Namespace) -> int:
    """``twinkle watch``: 0 once the run finished, or when the watch is stopped."""
    if not args.interval > 0:
        raise InvalidArgumentError(
            f"--interval must be a positive number of seconds, got {args.interval}"
        )
    try:
        return watch(args.run, interval_s=args.interval, once=args.once, reward=args.reward)
    except KeyboardInterrupt:
        return 0  # (stopped watching: the run goes on)
