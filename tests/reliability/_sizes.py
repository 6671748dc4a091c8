"""Sizes of the reliability suite: the default (fast, part of ``make test``) and the soak
scale (``pytest -m soak tests/reliability`` or ``TWINKLE_SOAK=1``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

SOAK_ENV = "TWINKLE_SOAK"


def soak_enabled() -> bool:
    return os.environ.get(SOAK_ENV, "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class Sizes:
    """Counts of one scale (default or soak)."""

    name: str
    kill_points: int  # SIGKILLs of a record writer (several write modes)
    session_kills: int  # SIGKILLs of a RunSession writing events.jsonl
    cut_points: int  # byte offsets a log is cut at (deterministic torn lines)
    threads: int
    records_per_thread: int
    processes: int
    records_per_process: int
    fuzz_examples: int  # hypothesis examples per fuzz test
    hung_backend_iterations: int  # iterations of a run beside a hung and a failing backend


DEFAULT = Sizes(
    name="default",
    kill_points=24,
    session_kills=20,
    cut_points=40,
    threads=8,
    records_per_thread=50_000,
    processes=4,
    records_per_process=20_000,
    fuzz_examples=150,
    hung_backend_iterations=2_000,
)
SOAK = Sizes(
    name="soak",
    kill_points=200,
    session_kills=100,
    cut_points=400,
    threads=8,
    records_per_thread=500_000,
    processes=4,
    records_per_process=250_000,
    fuzz_examples=2_000,
    hung_backend_iterations=20_000,
)
