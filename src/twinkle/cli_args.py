"""The ``twinkle`` command's subcommands and their options (the command itself, and
what each subcommand runs: :mod:`twinkle.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_commands"]


def _add_common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-autoload",
        action="store_true",
        help="do not load third-party observer plugins (also: TWINKLE_DISABLE_PLUGIN_AUTOLOAD=1)",
    )
    p.add_argument(
        "--block",
        action="append",
        default=[],
        metavar="PLUGIN",
        help="never load the observer plugin of this name (repeatable)",
    )
    p.add_argument(
        "--traceback",
        action="store_true",
        help="on an unexpected error show its traceback, not the one-line message",
    )


def _add_reward_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reward",
        metavar="NAME.KEY",
        help="the scalar to show as the reward (default: the first reward_mean or reward)",
    )


def _add_report_commands(sub: Any) -> None:
    """``twinkle report`` and ``twinkle watch`` (:mod:`twinkle.report._commands`)."""
    rep = sub.add_parser(
        "report",
        help="a run's figures from its files: per iteration and for the run; with a second "
        "run, the two side by side with B / A",
    )
    rep.add_argument("run", metavar="RUN_DIR", help="a run's directory (runs/<run_id>/)")
    rep.add_argument("other", nargs="?", metavar="RUN_B", help="a second run to compare with")
    rep.add_argument("--json", action="store_true", help="the figures as JSON")
    rep.add_argument(
        "--plots",
        metavar="DIR",
        help="also draw PNG plots into DIR: throughput, each window's time, peak memory "
        "per worker, reward (matplotlib, headless)",
    )
    rep.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML file (interactive plots, "
        "no network request; with RUN_B, both runs overlaid)",
    )
    rep.add_argument(
        "--whatif",
        action="store_true",
        help="also predict what would help (twinkle whatif): +1 engine, +1 trainer rank, "
        "2x faster generation, 2x faster training, lag +1; a streaming run only",
    )
    _add_reward_option(rep)
    _add_common_options(rep)

    wp = sub.add_parser(
        "watch",
        help="follow a run while it runs (another process writing it): its figures so far, "
        "refreshed in place, fitted to the terminal; ends when the run finishes: exit code 0, "
        "or 1 when it ended in error",
        description="Follow a run while another process writes it: its figures so far "
        "(twinkle report's), redrawn in place every --interval seconds the log grew. In a "
        "terminal the view fits its size: the text wraps, what limits the run shortens to "
        "its headline when rows are short, and the table shows its newest iterations (twinkle "
        "report has them all). Exit status: 0 once the run finished well, or when stopped "
        "(Ctrl-C) or after --once of a run not finished; 1 when the run ended in error (its "
        "error is shown under the run's line).",
    )
    wp.add_argument("run", metavar="RUN_DIR", help="the run's directory (runs/<run_id>/)")
    wp.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="how often to look (2)"
    )
    wp.add_argument("--once", action="store_true", help="show the view once and exit")
    _add_reward_option(wp)
    _add_common_options(wp)


def _speed(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--speed {text!r}: write PHASE=K or WORKER=K, e.g. train=2 (twice as fast) or "
            "engine0=0.5 (twice as slow)"
        ) from None


def _add_whatif_arguments(p: argparse.ArgumentParser) -> None:
    """``twinkle whatif``'s arguments (the command: :mod:`twinkle.whatif._cli`)."""
    p.add_argument("run", metavar="RUN_DIR", help="a finished streaming run's directory")
    p.add_argument("--engines", type=int, metavar="N", help="rollout engines (shares the work)")
    p.add_argument("--ranks", type=int, metavar="N", help="trainer ranks (splits training)")
    p.add_argument("--lag", type=int, metavar="N", help="the staleness bound: 0 = no overlap")
    over = p.add_mutually_exclusive_group()
    over.add_argument(
        "--overlap", action="store_true", help="generate ahead while training (lag >= 1)"
    )
    over.add_argument("--no-overlap", action="store_true", help="no overlap (lag 0)")
    p.add_argument("--buffer", type=int, metavar="N", help="rollouts the buffer holds")
    p.add_argument(
        "--speed",
        type=_speed,
        action="append",
        default=[],
        metavar="NAME=K",
        help="a phase or worker K times as fast (train=2, rollout=0.5, engine1=0.8); repeatable",
    )
    p.add_argument("--out", metavar="DIR", help="keep the predicted run in DIR (new or empty)")
    p.add_argument("--json", action="store_true", help="the prediction as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw each iteration's seconds, recorded and predicted, into a .png",
    )


def add_commands(sub: Any) -> None:
    """Every subcommand of ``twinkle``, on the subparsers ``sub``."""
    rp = sub.add_parser("replay", help="recompute a run's records from its events.jsonl")
    rp.add_argument(
        "events", metavar="EVENTS_JSONL", help="the run's events.jsonl, or its run directory"
    )
    rp.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory: new or empty (see --force); written only when the replay succeeds",
    )
    rp.add_argument(
        "--force",
        action="store_true",
        help="replay into a non-empty --out: its files of the replay's names are replaced, "
        "others are kept (never another run's events.jsonl)",
    )
    _add_common_options(rp)

    from twinkle.demo.cli import add_demo_arguments

    dp = sub.add_parser("demo", help="run the tiny GRPO training demo, fully observed")
    add_demo_arguments(dp)
    _add_common_options(dp)

    _add_report_commands(sub)

    wi = sub.add_parser(
        "whatif",
        help="predict another configuration of a recorded streaming run (engines, trainer "
        "ranks, lag, buffer, a phase's speed) by re-simulating its loop, side by side",
    )
    _add_whatif_arguments(wi)
    _add_common_options(wi)

    pp = sub.add_parser(
        "plugins",
        help="list the installed observer plugins: built-in or third party, and whether a "
        "run loads, blocks or fails on each",
    )
    pp.add_argument("--json", action="store_true", help="one JSON object per plugin, a list")
    _add_common_options(pp)

    sp = sub.add_parser(
        "swift-plugin",
        help="print the ms-swift plugin file: swift rlhf ... --external_plugins "
        '"$(twinkle swift-plugin)" --callbacks twinkle',
    )
    _add_common_options(sp)
