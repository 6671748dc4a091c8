"""What observing the vLLM demo costs: the same run with every observer and with none.

``twinkle demo --engine vllm`` (two real vLLM servers from ``.venv-vllm``, the tiny
Llama trainer) runs ``ITERATIONS`` iterations fully observed (the five files, the
engines' ``/metrics`` read per rollout, memory of every engine process) and without
observers (no files, no engine reads per rollout), alternately (machines are noisy). Both runs
generate the same tokens (seeded sampling on the same weights), so their loops do the
same work. The figure is the loop's wall time per iteration, timed here from the
first iteration's end to the last one's (the first iteration carries the engines'
warm-up, start-up is not in it); the best of each mode is kept. The observed run's own
account of its overhead (``overhead_seconds`` in its summary) is printed next to it.

Only run when asked (``python -m bench --only vllm``, ``make bench-vllm``): a round costs
this 2-core machine about two minutes. Without ``.venv-vllm`` it prints a row saying so.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import Row, has_module

BENCH = "vllm.demo"
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
ITERATIONS = 20


def _run(observers: bool, out: Path) -> tuple[float, dict[str, Any]]:
    """Loop seconds per iteration after the first, and the run's summary."""
    from twinkle.demo.config import DemoConfig
    from twinkle.demo.runner import run_demo

    ends: list[float] = []
    result = run_demo(
        DemoConfig(iterations=ITERATIONS, engine="vllm", observers=observers),
        out_dir=out,
        progress=lambda _result: ends.append(time.perf_counter()),
        autoload=False,
        vllm_python=VLLM_PYTHON,
    )
    return (ends[-1] - ends[0]) / (len(ends) - 1), result.summary


def run(smoke: bool) -> list[Row]:
    subject = f"vLLM demo ({ITERATIONS} iterations, 2 servers): loop s per iteration"
    if not VLLM_PYTHON.exists():
        why = f"skipped: {VLLM_PYTHON.parent.parent.name} missing (make vllm-venv)"
        return [Row(BENCH, subject, float("nan"), "", note=why)]
    if not has_module("transformers"):
        return [Row(BENCH, subject, float("nan"), "", note="skipped: pip install -e '.[demo]'")]
    repeats = 1 if smoke else 2
    per_iteration: dict[bool, list[float]] = {True: [], False: []}
    overhead_share: list[float] = []
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-vllm-demo-") as tmp:
        for _ in range(repeats):
            for observers in (False, True):
                seconds, summary = _run(observers, Path(tmp))
                per_iteration[observers].append(seconds)
                if observers:
                    timing = summary["seconds"]
                    overhead_share.append(timing["overhead_seconds"] / timing["wall_seconds"])
    bare, observed = min(per_iteration[False]), min(per_iteration[True])
    listing = {m: ", ".join(f"{s:.3f}" for s in v) for m, v in per_iteration.items()}
    return [
        Row(
            BENCH,
            subject + ", no observers",
            bare,
            "s",
            note=f"best of {repeats}; all: {listing[False]} s",
        ),
        Row(
            BENCH,
            subject + ", fully observed",
            observed,
            "s",
            ratio=observed / bare,
            baseline="no observers",
            note=f"best of {repeats}; all: {listing[True]} s; the run's own overhead_seconds: "
            + ", ".join(f"{100 * s:.1f}%" for s in overhead_share)
            + " of its wall",
        ),
    ]
