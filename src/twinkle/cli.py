"""The ``twinkle`` command.

``twinkle replay LOG --out DIR [--force]``  recompute a run's records from its event log
``twinkle demo [options]``                  the tiny GRPO run, fully observed
``twinkle plugins [--json]``                the installed observer plugins, and what a
                                            run would do with each
``twinkle report RUN [RUN_B] [--json]``     a run's figures (or two runs side by side)
``twinkle watch RUN``                       a run's figures while it runs
``twinkle whatif RUN [changes]``            another configuration of the run, predicted
``twinkle --version``

Errors are one line on stderr, ``twinkle: error: ...``, naming the culprit and the fix:
exit status 2 when what the command was given is wrong (an option, ``--out``, the log,
the plugin set), 1 when the run itself failed. ``--traceback`` shows the traceback of an
unexpected error instead.

SIGINT (Ctrl-C), SIGTERM and SIGHUP finish the run as an ``error`` (its ``run_finished``,
``summary.json`` and ``trace.json`` are written) and exit 130, 143 and 129, the shell's
``128 + signal``; a second signal while the run finishes is ignored with a message. A
trainer of your own gets the same with :func:`twinkle.run.finish_on_signals`::

    with finish_on_signals(), RunSession(out_dir="runs", config=config) as run:
        ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from twinkle.cli_args import add_commands
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    PluginError,
    ReplayError,
    TwinkleError,
)

if TYPE_CHECKING:
    from twinkle.run import ReplayResult

__all__ = ["EXIT_RUN_FAILED", "EXIT_USAGE", "build_parser", "main"]

#: exit status when the command's input is wrong: options, --out, the log, plugins
EXIT_USAGE = 2
#: exit status when the run itself failed
EXIT_RUN_FAILED = 1
#: errors that say the command was given something unusable (exit status 2)
_USAGE_ERRORS = (InvalidArgumentError, ConfigError, ReplayError, PluginError)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``twinkle`` command."""
    parser = argparse.ArgumentParser(
        prog="twinkle",
        description="How fast your RL run really is: replay a run's event log, or run the demo.",
        epilog=(
            "Ctrl-C, SIGTERM and SIGHUP finish the run as an error (summary and trace "
            "written) and exit 130, 143, 129. Your own trainer gets the same with "
            "'with twinkle.run.finish_on_signals(), RunSession(...) as run:'."
        ),
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_commands(sub)
    return parser


def _version() -> str:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("twinkle")
    except PackageNotFoundError:  # src/ on sys.path, not installed
        mine = "(not installed)"
    return f"twinkle {mine} (Python {platform.python_version()})"


def _plugins(args: argparse.Namespace) -> int:
    from twinkle.checks import printable
    from twinkle.plugins import PluginStatus, describe_plugins

    found = describe_plugins(autoload=False if args.no_autoload else None, blocked=args.block)
    failing = [p.name for p in found if p.status is PluginStatus.FAILS]
    if args.json:
        print(json.dumps([p.to_dict() for p in found], indent=1))
        return EXIT_USAGE if failing else 0
    rows = [("plugin", "kind", "status", "from")]
    for p in found:
        status = p.status.value if p.error is None else f"{p.status.value}: {p.error}"
        origin = f"{p.distribution or '?'} ({p.value})"
        # (a plugin's name and error are its package's strings: shown, never obeyed)
        kind = "built-in" if p.builtin else "third party"
        rows.append((printable(p.name), kind, printable(status), printable(origin)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3]]))
    if failing:
        names = printable(", ".join(failing))
        print(
            f"twinkle: {len(failing)} plugin(s) fail to load ({names}): a run "
            f"with them stops before it starts; fix or uninstall them, or --block them",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0


def _check_plugin_options(args: argparse.Namespace) -> None:
    from twinkle.plugins import check_blocked

    check_blocked(args.block)  # a typo is said now, not after torch has loaded


def _replay(args: argparse.Namespace) -> int:
    from twinkle.run import replay

    with _progress_on_stderr():
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
    if result.plugins_differ:
        _warn_plugins(result)
    if result.torn_line is not None:
        print(
            f"twinkle: warning: passed over the torn last line {result.torn_line} of "
            f"{result.log} ({result.torn_bytes} byte(s): the run stopped while writing it, "
            "killed or its disk full)",
            file=sys.stderr,
        )
    if result.log_changed is not None:
        print(
            f"twinkle: warning: {result.log} changed since the run wrote it "
            f"({result.log_changed}): these figures are the log's as it is now, not the "
            "run's own (its summary.json)",
            file=sys.stderr,
        )
    return 0


@contextlib.contextmanager
def _progress_on_stderr() -> Iterator[None]:
    """A long feed's progress (logger ``twinkle.progress``) printed on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("twinkle: %(message)s"))
    progress = logging.getLogger("twinkle.progress")
    level, propagate = progress.level, progress.propagate
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False  # (said once, whatever the application's logging)
    try:
        yield
    finally:
        progress.removeHandler(handler)
        progress.setLevel(level)
        progress.propagate = propagate


def _demo(args: argparse.Namespace) -> int:
    from twinkle.checks import safe_name

    if args.run_id is not None:
        safe_name(args.run_id, "--run-id")  # before anything heavy starts
    from twinkle.demo.cli import run_demo_command
    from twinkle.report import format_report, load_report

    return run_demo_command(args, lambda run_dir: format_report(load_report(run_dir)))


def _interrupted(args: argparse.Namespace, exc: KeyboardInterrupt) -> int:
    from twinkle.run import SignalInterrupt

    if isinstance(exc, SignalInterrupt):
        name, code = exc.signal_name, exc.exit_code
    else:
        name, code = "SIGINT", 128 + signal.SIGINT
    if args.command == "replay":
        what = f"the replay stopped; --out {args.out!r} was left as it was"
    elif args.command != "demo":  # (report, watch, whatif: they write no run)
        what = f"the {args.command} stopped"
    else:
        from twinkle.demo.cli import demo_run_dir

        run_dir = demo_run_dir(args)
        if run_dir is None:
            what = "the run stopped (without observers: nothing was written)"
        else:
            status = _summary_status(run_dir)
            if status is None:
                what = "stopped before the run started"
            elif status == "error":
                what = f"the run finished as an error; its summary and trace are in {run_dir}/"
            else:  # it had finished when the signal came (printing its table)
                what = f"the run had finished ({status}); its files are in {run_dir}/"
    print(f"twinkle: interrupted by {name}: {what}", file=sys.stderr)
    return code


def _summary_status(run_dir: Path) -> str | None:
    """The status in the run's summary.json; None when it has none (yet)."""
    try:
        status = json.loads((run_dir / "summary.json").read_bytes()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def _error(message: str, code: int) -> int:
    from twinkle.checks import printable

    one_line = re.sub(r"\s*\n\s*", " ", message.strip())  # a quoted error may hold newlines
    # (an error may quote a log's or a plugin's string: escape sequences are shown)
    print(f"twinkle: error: {printable(one_line)}", file=sys.stderr)
    return code


def _helps() -> Any:
    from twinkle.whatif._helps import format_helps, what_would_help

    return what_would_help, format_helps


def _run(args: argparse.Namespace) -> int:
    try:
        _check_plugin_options(args)
        if args.command == "plugins":
            return _plugins(args)
        if args.command in ("report", "watch"):
            from twinkle.report._commands import report_command, watch_command

            if args.command == "watch":
                return watch_command(args)
            if args.whatif and args.other:
                raise InvalidArgumentError(
                    "--whatif predicts what would help one run: drop RUN_B, or run "
                    "twinkle report RUN --whatif for each"
                )
            return report_command(args, _helps() if args.whatif else None)
        if args.command == "whatif":
            from twinkle.whatif._cli import whatif_command

            return whatif_command(args)
        if args.command == "swift-plugin":
            from twinkle.integrations import swift_plugin_file

            print(swift_plugin_file())
            return 0
        return _replay(args) if args.command == "replay" else _demo(args)
    except _USAGE_ERRORS as exc:
        return _error(str(exc), EXIT_USAGE)
    except TwinkleError as exc:
        return _error(str(exc), EXIT_RUN_FAILED)
    except BrokenPipeError:  # the reader left (`twinkle plugins | head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if args.traceback:
            raise
        where = f" ({exc.filename!r})" if exc.filename else ""
        fix = (
            "it was removed or moved while the command ran: give its new path"
            if isinstance(exc, FileNotFoundError)
            else "free disk space or fix the permissions of the files named, and run again"
        )
        return _error(f"{exc.strerror or exc}{where}: {fix}", EXIT_RUN_FAILED)
    except Exception as exc:
        if args.traceback:
            raise
        return _error(
            f"the {args.command} failed: {type(exc).__qualname__}: {exc}; run again with "
            "--traceback to see where (and report it if twinkle is at fault)",
            EXIT_RUN_FAILED,
        )


def _warn_plugins(result: ReplayResult) -> None:
    """Say, per segment of the run, which observer plugins it loaded that this replay
    did not, and the other way round."""
    segments = result.plugins_by_segment
    now = set(result.plugins_now)
    for number, plugins in enumerate(segments):
        if not plugins or set(plugins) == now:
            continue
        who = "the run" if len(segments) == 1 else f"segment {number} of the run"
        if missing := sorted(set(plugins) - now):
            print(
                f"twinkle: warning: {who} loaded observer plugins {missing} that this replay "
                "did not: their records are missing (install or unblock them to replay "
                "them too)",
                file=sys.stderr,
            )
        if extra := sorted(now - set(plugins)):
            print(
                f"twinkle: warning: this replay loaded observer plugins {extra} that {who} "
                "did not: their records are not the run's (--block them, or --no-autoload)",
                file=sys.stderr,
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    guard: Any = contextlib.nullcontext()
    if threading.current_thread() is threading.main_thread():
        from twinkle.run import finish_on_signals

        guard = finish_on_signals()
    with guard:
        try:
            code = _run(args)
        except KeyboardInterrupt as exc:
            code = _interrupted(args, exc)
            if argv is None:
                _exit_now(code)
            return code
        except BaseException as exc:  # (--traceback): the interpreter prints it, then exits
            if argv is None:
                _exit_despite_threads(_exit_status(exc))
            raise
    if argv is None:
        _exit_despite_threads(code)
    return code


def _exit_status(exc: BaseException) -> int:
    """The status the interpreter exits with when ``exc`` ends it."""
    if not isinstance(exc, SystemExit) or exc.code is None:
        return 0 if isinstance(exc, SystemExit) else 1
    return exc.code if isinstance(exc.code, int) else 1


#: how long the ``twinkle`` process, its work done, lets the interpreter wait for the
#: threads some library left running before it names them and exits anyway
LEFTOVER_THREADS_S = 2.0


def _exit_despite_threads(code: int, grace_s: float = LEFTOVER_THREADS_S) -> None:
    """Make sure the command ends, with ``code``, even when a plugin or a library (Ray,
    torch) left a non-daemon thread running: the interpreter joins every such thread
    at exit, forever for one that never ends. When any is alive now, a daemon watchdog
    gives the interpreter's own exit ``grace_s`` (it also stops what it knows how to
    stop, e.g. idle thread pools); threads still alive then are named on stderr and the
    process ends (:func:`_exit_now`: the run and its files are closed already)."""
    if not _leftover_threads():
        return  # nothing to wait for: the usual exit, atexit handlers and all
    watchdog = threading.Thread(
        target=_end_if_threads_stay, args=(code, grace_s), name="twinkle-exit", daemon=True
    )
    watchdog.start()


def _leftover_threads() -> list[threading.Thread]:
    main = threading.main_thread()
    return [t for t in threading.enumerate() if not t.daemon and t is not main and t.is_alive()]


def _end_if_threads_stay(code: int, grace_s: float) -> None:
    time.sleep(grace_s)
    left = _leftover_threads()
    if not left:
        return  # (the interpreter is in its atexit handlers: let it finish)
    frames = sys._current_frames()
    named = "; ".join(_describe_thread(t, frames.get(t.ident or -1)) for t in left)
    print(
        f"twinkle: warning: exiting without waiting for {len(left)} thread(s) left "
        f"running {grace_s:g} s after the command was done (not daemon threads: a "
        f"plugin or a library started them and never stopped them): {named}",
        file=sys.stderr,
    )
    _exit_now(code)


def _describe_thread(thread: threading.Thread, frame: FrameType | None) -> str:
    """``'name' (at file:line in function)``: where the thread is now."""
    if frame is None:
        return repr(thread.name)
    code = frame.f_code
    return f"{thread.name!r} (at {code.co_filename}:{frame.f_lineno} in {code.co_name})"


def _exit_now(code: int) -> NoReturn:
    """End the ``twinkle`` process now: the run is finished and its files are closed,
    so skip the interpreter's teardown (torch's alone takes half a second), in which a
    second Ctrl-C would abort the process. Only the command itself (``main()`` without
    ``argv``) gets here, never a caller of ``main([...])``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
