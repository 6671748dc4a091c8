"""The ``twinkle`` command.

``twinkle replay LOG --out DIR [--force]``  recompute a run's records from its event log
``twinkle demo [options]``                  the tiny GRPO run, fully observed
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from twinkle.errors import TwinkleError

__all__ = ["build_parser", "main"]


def _add_plugin_options(p: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``twinkle`` command."""
    parser = argparse.ArgumentParser(
        prog="twinkle",
        description="How fast your RL run really is: replay a run's event log, or run the demo.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
        "others are kept",
    )
    _add_plugin_options(rp)

    from twinkle.demo.cli import add_demo_arguments

    dp = sub.add_parser("demo", help="run the tiny GRPO training demo, fully observed")
    add_demo_arguments(dp)
    _add_plugin_options(dp)
    return parser


def _replay(args: argparse.Namespace) -> int:
    from twinkle.run import replay

    result = replay(
        args.events,
        args.out,
        autoload=False if args.no_autoload else None,
        blocked=args.block,
        force=args.force,
    )
    summary = result.summary
    print(
        f"replayed {result.events} events of run {summary['run_id']!r} into {result.out_dir} "
        f"(status {summary['status']}, observer failures "
        f"{sum(summary['observer_failures'].values())})"
    )
    if result.torn_line is not None:
        print(
            f"twinkle: warning: passed over the torn last line {result.torn_line} of "
            f"{result.log} ({result.torn_bytes} byte(s): the run was killed while writing it)",
            file=sys.stderr,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "replay":
            return _replay(args)
        if getattr(args, "run_id", None) is not None:
            from twinkle.checks import safe_name

            safe_name(args.run_id, "--run-id")  # before anything heavy starts
        from twinkle.demo.cli import run_demo_command

        return run_demo_command(args)
    except TwinkleError as exc:
        print(f"twinkle: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
