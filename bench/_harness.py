"""Shared harness: timing loops, machine description and the ratio table every benchmark prints.

Benchmarks measure twinkle and its baselines *interleaved in one run* (machines are
noisy: only ratios measured side by side mean anything) and take the best of several
repeats. A peer that is not installed (the ``bench`` extra brings them) gives a row that
says so instead of failing the run.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import util as importlib_util

Loop = Callable[[int], None]
"""A timed loop: runs its subject ``n`` times."""


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the results table."""

    benchmark: str
    subject: str
    value: float
    unit: str
    ratio: float | None = None  # subject / baseline (lower is better unless noted)
    baseline: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""  # why a target is not met, what a figure includes


def _nothing() -> None:
    pass


def best_ns_per_call(fn: Loop, n: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` nanoseconds per iteration of ``fn(n)`` (fn runs an n-step loop)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def interleaved(fns: Mapping[str, Loop], n: int, repeats: int = 7) -> dict[str, float]:
    """Best ns/iteration of each loop, the loops taking turns in every repeat."""
    return interleaved_with_cleanup({k: (f, _nothing) for k, f in fns.items()}, n, repeats)


def interleaved_with_cleanup(
    subjects: Mapping[str, tuple[Loop, Callable[[], object]]],
    n: int,
    repeats: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    """Best ns/iteration of each loop; loops take turns; each ``cleanup`` runs untimed.

    The cleanup keeps state bounded between rounds (a recorder drained, a peer's
    registry of timings cleared) without charging it to the timed loop. ``clock``:
    wall time by default; ``time.thread_time_ns`` measures the calling thread's CPU
    (what a claim about the caller's cost needs: background writers do not count).
    """
    best = dict.fromkeys(subjects, float("inf"))
    for _ in range(repeats):
        for name, (loop, cleanup) in subjects.items():
            start = clock()
            loop(n)
            elapsed = clock() - start
            cleanup()
            best[name] = min(best[name], elapsed / n)
    return best


def median(values: Sequence[float]) -> float:
    """The median (``nan`` for no values)."""
    return statistics.median(values) if values else float("nan")


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported (a peer from the ``bench`` extra)."""
    try:
        return importlib_util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_peer(benchmark: str, subject: str, package: str) -> Row:
    """The row a benchmark prints when a peer package is not installed."""
    return Row(
        benchmark,
        subject,
        float("nan"),
        "",
        note=f"peer not installed: pip install -c constraints.txt '.[bench]' ({package})",
    )


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1- and 5-minute load averages (other work on the machine), or ``""``."""
    if not hasattr(os, "getloadavg"):
        return ""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def machine_lines() -> list[str]:
    """What the figures were measured on: CPU, cores, Python, OS."""
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return [
        f"machine: {cpu_model()}, nproc {usable} ({cores} logical CPUs)",
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()} {platform.machine()}",
    ]


def _format_value(value: float, unit: str) -> str:
    if value != value:  # nan: nothing measured
        return "n/a"
    if 0 < abs(value) < 0.01:
        return f"{value:.1e} {unit}".rstrip()
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 1000 else 0
    return f"{value:,.{digits}f} {unit}".rstrip()


def format_table(rows: Sequence[Row]) -> str:
    """Render rows as a Markdown table (the same text goes into docs/performance.md)."""
    head = "| benchmark | subject | value | ratio | vs | target | met | note |"
    sep = "|---|---|---:|---:|---|---|---|---|"
    lines = [head, sep]
    for r in rows:
        ratio = "" if r.ratio is None or r.ratio != r.ratio else f"{r.ratio:.2f}x"
        met = "" if r.met is None else ("yes" if r.met else "**NO**")
        cells = (
            r.benchmark,
            r.subject,
            _format_value(r.value, r.unit),
            ratio,
            r.baseline,
            r.target,
            met,
            r.note,
        )
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
