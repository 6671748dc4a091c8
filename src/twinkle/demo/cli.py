"""``twinkle demo``: options, progress bar, then the run's report (the same table and
figures as ``twinkle report``) and what the demo did."""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twinkle.demo.config import DemoConfig

from twinkle.demo._summary_text import format_summary
from twinkle.errors import ConfigError, FinishedRunError, InvalidArgumentError, ResumeConfigError
from twinkle.reporting import DEFAULT_BACKEND_TIMEOUT_S

__all__ = [
    "add_demo_arguments",
    "demo_run_dir",
    "format_summary",
    "make_out_dir",
    "run_demo_command",
]

RAW_FILE = "metrics_raw.jsonl"
#: the files the run's report reads besides summary.json, with the observer that writes each
_REPORTED = ((RAW_FILE, "metrics_raw"), ("events.jsonl", "events"))


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (defaults from :class:`~twinkle.demo.DemoConfig`)."""
    from twinkle.demo.config import BACKENDS, DEFAULT_LR, ENGINES, DemoConfig

    d = DemoConfig()
    p.add_argument(
        "--iterations",
        type=int,
        default=d.iterations,
        metavar="N",
        help=f"iterations this process runs (default {d.iterations}; a resumed run: N more)",
    )
    p.add_argument("--out", default="runs", metavar="DIR", help="the run goes to DIR/<run_id>/")
    p.add_argument("--run-id", default=None, help="default: time, pid and a random suffix")
    p.add_argument(
        "--prompts", type=int, default=d.prompts_per_iteration, help="prompts per iteration"
    )
    p.add_argument(
        "--completions",
        type=int,
        default=d.completions_per_prompt,
        help="completions per prompt (the GRPO group size)",
    )
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument(
        "--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer step"
    )
    p.add_argument("--engines", type=int, default=d.engines, help="rollout engines")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=d.engine,
        help="torch: in-process tiny decoders (default); vllm: real vLLM servers (make "
        "vllm-venv) and a transformers Llama trainer",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        metavar="PATH",
        help="the interpreter that runs the vLLM engines (default: $TWINKLE_VLLM_PYTHON, "
        "else .venv-vllm/bin/python)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=d.backend,
        help="local: engines and trainer in this process (default); ray: each one a Ray "
        "actor on a local Ray cluster bound to 127.0.0.1",
    )
    p.add_argument(
        "--train-workers",
        type=int,
        default=d.train_workers,
        metavar="N",
        help="trainer ranks: N > 1 trains with DDP over gloo on this host's CPU, this "
        "process rank 0 (default 1)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="AdamW learning rate (default: "
        + ", ".join(f"{lr:g} for {engine}" for engine, lr in DEFAULT_LR.items())
        + ")",
    )
    _add_schedule_arguments(p, d.overlap)
    _add_scenario_arguments(p)
    _add_run_arguments(p)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """What the run observes and writes, and how it goes on: observers, progress, MFU's
    peak, required plugins, resuming, a plugin backend's timeout."""
    p.add_argument(
        "--no-observers",
        action="store_true",
        help="run without any observer (for overhead comparison); writes no files",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--peak-flops",
        type=_peak_flops,
        default=None,
        metavar="FLOPS|measured",
        help="the CPU's dense peak FLOP/s per device for the run's MFU, or 'measured' (a "
        "timed matrix product, labelled as measured); without it MFU abstains (no "
        "datasheet covers a CPU) and the FLOPs are still reported",
    )
    p.add_argument(
        "--require-plugin",
        action="append",
        default=[],
        metavar="PLUGIN",
        help="stop if this observer plugin cannot set up (else it is left out and the run "
        "goes on; repeatable)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue run --run-id even though it finished ok (without it, a run that "
        "finished ok is refused; one that crashed or ended in error is continued; a run id "
        "that holds no run is refused); the "
        "run's numbering, timeline and figures go on, the tiny model starts again from its "
        "initial weights (the demo keeps no model checkpoint: the reward starts over)",
    )
    p.add_argument(
        "--backend-timeout",
        type=float,
        default=DEFAULT_BACKEND_TIMEOUT_S,
        metavar="SECONDS",
        help="cut off a plugin's record backend whose call takes longer (default "
        "%(default)s; the run's own files never wait for it)",
    )


def _add_schedule_arguments(p: argparse.ArgumentParser, overlap_default: bool) -> None:
    """Overlap, the lag and the simulated devices: how the loop is scheduled and run."""
    overlap = p.add_mutually_exclusive_group()
    overlap.add_argument(
        "--overlap",
        dest="overlap",
        action="store_true",
        default=None,  # (neither flag: the default, unless --lag 0)
        help="generate the next rollout while training" + (" (default)" if overlap_default else ""),
    )
    overlap.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="generate only with the newest weights (no streaming)",
    )
    p.add_argument(
        "--lag",
        type=_lag,
        default=None,
        metavar="N",
        help="the weight versions a rollout may lag the policy being trained (default: 1 "
        "with overlap; 0 is --no-overlap)",
    )
    p.add_argument(
        "--sim-device",
        action="store_true",
        help="simulated devices: generation, training and weight loads wait for device time "
        "instead of holding the host's CPU (a test bed for twinkle whatif; the policy "
        "learns nothing)",
    )


def _add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario knobs: one side slower on purpose."""
    scenario = p.add_argument_group(
        "scenario knobs", "make one side slower on purpose, to see what twinkle says limits the run"
    )
    for side, what in (
        ("generation", "every engine's generation"),
        ("training", "the trainer"),
        ("publish", "every engine's weight load"),
    ):
        scenario.add_argument(
            f"--slow-{side}",
            type=float,
            default=1.0,
            metavar="K",
            help=f"{what} K times slower (default 1)",
        )
    scenario.add_argument(
        "--slow-engine",
        default=None,
        metavar="NAME:K",
        help="one engine K times slower than the others, a straggler (e.g. engine1:4)",
    )


def _lag(text: str) -> int:
    """``--lag``: a whole number of weight versions in [0, MAX_LAG]."""
    from twinkle.demo.config import MAX_LAG

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_LAG:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of weight versions in [0, {MAX_LAG}]"
        )
    return value


def _peak_flops(text: str) -> float | str:
    if text == "measured":
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of FLOP/s > 0 (e.g. 1.2e11) nor 'measured'"
        )
    return value


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a directory"


def make_out_dir(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Create the output directory ``path`` (and its parents) now, before anything runs;
    :class:`~twinkle.errors.InvalidArgumentError` naming ``option``, the path and the
    fix when it cannot be a writable directory (a file, a device, a read-only mount)."""
    out = Path(path)
    fix = f"give {option} a writable directory (it is created if missing)"
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "" if existing == out else f" (its ancestor {str(existing)!r} is {_kind(existing)})"
        own = f" is {_kind(out)}" if existing == out else " cannot be a directory"
        raise InvalidArgumentError(f"{option} {str(out)!r}{own}{what}: {fix}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"{option} {str(out)!r}: cannot create the directory ({exc.strerror or exc}): {fix}"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"{option} {str(out)!r}: the directory is not writable (permissions or a "
            f"read-only mount): {fix}"
        )
    return out


def demo_run_dir(args: argparse.Namespace) -> Path | None:
    """Where the demo command writes its run (``--out``/``--run-id``), None without
    observers; the run id is chosen here when ``--run-id`` is not given."""
    if args.run_id is None:
        from twinkle.run import new_run_id

        args.run_id = new_run_id(time.time_ns())
    return None if args.no_observers else Path(args.out) / args.run_id


#: the demo's options that shape its observers' configuration beyond total_steps and x_
#: keys (its phases and its workers' placement), as DemoConfig names them
_SHAPING_OPTIONS = {
    "engine": "--engine",
    "backend": "--backend",
    "train_workers": "--train-workers",
    "engines": "--engines",
    "sim_device": "--sim-device",
}


def _resume_fix(exc: ResumeConfigError) -> str:
    """What the demo's user does about a run that cannot resume with these options."""
    logged = exc.logged.get("x_demo")
    was = logged if isinstance(logged, dict) else {}
    flags = " ".join(
        _flag(option, was[key]) for key, option in _SHAPING_OPTIONS.items() if key in was
    )
    same = (
        f"the options it was started with ({flags})" if flags else "the options it was started with"
    )
    return (
        f"the demo's phases and workers follow {', '.join(_SHAPING_OPTIONS.values())}: "
        f"resume run {exc.run_id!r} with {same} (--iterations and the others may change), "
        "or give --run-id a new id to start a new run"
    )


def _flag(option: str, value: object) -> str:
    """``option`` as the command line gives ``value`` (a switch: itself, or without)."""
    if isinstance(value, bool):
        return option if value else f"without {option}"
    return f"{option} {value}"


#: the flags whose names are not their configuration field's (``--micro-batch`` sets
#: ``micro_batch``)
_FLAG_OF = {
    "prompts_per_iteration": "--prompts",
    "completions_per_prompt": "--completions",
    "staleness": "--lag",
}


def config_from(args: argparse.Namespace) -> DemoConfig:
    """The demo's configuration from its parsed arguments (``--lag 0`` is no overlap); a
    refused value is named by its flag."""
    try:
        return _config(args)
    except ConfigError as exc:
        one = re.match(r"(\w+) must ", str(exc))  # (a value refused on its own)
        flag = None if one is None else _FLAG_OF.get(one[1], "--" + one[1].replace("_", "-"))
        if flag is not None and hasattr(args, flag[2:].replace("-", "_")):
            raise ConfigError(f"{flag}: {exc}") from None
        raise


def _config(args: argparse.Namespace) -> DemoConfig:
    from twinkle.demo.config import DemoConfig

    return DemoConfig(
        iterations=args.iterations,
        prompts_per_iteration=args.prompts,
        completions_per_prompt=args.completions,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        engines=args.engines,
        seed=args.seed,
        lr=args.lr,
        overlap=(
            DemoConfig().overlap and (args.lag is None or args.lag > 0)
            if args.overlap is None
            else args.overlap  # (given with --lag: DemoConfig says when they disagree)
        ),
        staleness=args.lag,
        sim_device=args.sim_device,
        observers=not args.no_observers,
        engine=args.engine,
        backend=args.backend,
        train_workers=args.train_workers,
        slow_generation=args.slow_generation,
        slow_training=args.slow_training,
        slow_publish=args.slow_publish,
        slow_engine=args.slow_engine,
    )


def _check_run_flags(args: argparse.Namespace) -> None:
    """The flags that name the run name one the demo writes (``--no-observers`` writes
    none); ``--resume`` one that ``--out``/``--run-id`` hold (a mistyped id would
    otherwise start a new run without a word)."""
    if args.no_observers and args.run_id is not None and not args.resume:
        raise InvalidArgumentError(
            "--run-id names the run to write, and --no-observers writes none: leave one out"
        )
    if not args.resume:
        return
    if args.no_observers or args.run_id is None:
        why = "--no-observers writes no run" if args.no_observers else "no --run-id names it"
        raise InvalidArgumentError(
            f"--resume continues a run, and {why}: give --run-id ID (and --out DIR) of the "
            "run to continue, or leave --resume out"
        )
    log = Path(args.out) / args.run_id / "events.jsonl"
    if not log.is_file() or log.stat().st_size == 0:
        raise InvalidArgumentError(
            f"--resume: {str(log.parent)!r} holds no run to continue (no events.jsonl): "
            "check --run-id and --out, or leave --resume out to start a new run"
        )


def _check_run_dir(args: argparse.Namespace) -> None:
    """Check the flags naming the run and its directory (none without observers), and
    make ``--out``."""
    _check_run_flags(args)
    run_dir = demo_run_dir(args)
    if run_dir is not None:
        make_out_dir(args.out)
        if run_dir.exists() and not run_dir.is_dir():
            raise InvalidArgumentError(
                f"the run directory {str(run_dir)!r} (--out/--run-id) is {_kind(run_dir)}: "
                "choose another --run-id or --out"
            )


def run_demo_command(args: argparse.Namespace, show_run: Callable[[Path], str]) -> int:
    """Run the demo from parsed arguments; prints ``show_run(run_dir)`` (the run's
    report: ``twinkle report``'s table and figures) and what the demo did."""
    cfg = config_from(args)
    if cfg.engine == "vllm":  # said now, before anything is created
        from twinkle.demo.hf import check_vllm_python

        args.vllm_python = check_vllm_python(args.vllm_python)
    _check_run_dir(args)  # (a bad --out is said now, not after torch has loaded)
    from twinkle.demo.runner import run_demo

    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.iterations, desc="GRPO", unit="it", file=sys.stderr)

    def progress(result: Any) -> None:
        if bar is not None:
            bar.set_postfix(reward=f"{result.reward_mean:.3f}")
            bar.update(1)

    try:
        result = run_demo(
            cfg,
            out_dir=args.out,
            run_id=args.run_id,
            progress=progress,
            autoload=False if args.no_autoload else None,
            blocked=args.block,
            required_plugins=args.require_plugin,
            backend_timeout_s=args.backend_timeout,
            resume=True if args.resume else None,
            vllm_python=args.vllm_python,
            peak_flops=args.peak_flops,
        )
    except BaseException as exc:
        if bar is not None:
            bar.leave = False  # the error's one line stands alone
            bar.close()
        if isinstance(exc, ResumeConfigError):
            raise exc.with_fix(_resume_fix(exc)) from exc
        if isinstance(exc, FinishedRunError):
            raise exc.with_fix(
                "pass --resume to continue it (--iterations more), or give --run-id a new "
                "id (or none) for a new run"
            ) from exc
        raise
    if bar is not None:
        bar.close()
    if result.run_dir is None:
        first, last = result.iterations[0], result.iterations[-1]
        print(
            f"ran {len(result.iterations)} iterations without observers in "
            f"{result.wall_seconds:.1f} s; reward mean {first.reward_mean:.3f} -> "
            f"{last.reward_mean:.3f}"
        )
        return 0
    run_dir = Path(result.run_dir)
    missing = [(f, name) for f, name in _REPORTED if not (run_dir / f).is_file()]
    if missing:
        print(f"(no report: the run wrote no {missing[0][0]}; is {missing[0][1]} blocked?)")
    else:
        print(show_run(run_dir))
    print()
    print(format_summary(result.summary))
    print(f"  files                   {result.run_dir}/")
    return 0
