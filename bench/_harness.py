"""Shared harness: timing loops and the ratio table every benchmark prints.

Benchmarks measure twinkle and its baseline *interleaved in one run* (machines are noisy:
only ratios measured side by side mean anything) and take the best of several repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


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


def best_ns_per_call(fn: Callable[[int], None], n: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` nanoseconds per iteration of ``fn(n)`` (fn runs an n-step loop)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def interleaved(
    fns: dict[str, Callable[[int], None]], n: int, repeats: int = 7
) -> dict[str, float]:
    """Best ns/iteration of each loop, the loops taking turns in every repeat."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn(n)
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / n)
    return best


def format_table(rows: list[Row]) -> str:
    """Render rows as a Markdown table (the same text goes into docs/performance.md)."""
    head = "| benchmark | subject | value | ratio | vs | target | met |"
    sep = "|---|---|---:|---:|---|---|---|"
    lines = [head, sep]
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        met = "" if r.met is None else ("yes" if r.met else "NO")
        lines.append(
            f"| {r.benchmark} | {r.subject} | {r.value:,.1f} {r.unit} | {ratio} | "
            f"{r.baseline} | {r.target} | {met} |"
        )
    return "\n".join(lines)
