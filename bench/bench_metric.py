"""Cost of ThroughputMetric per training step: accumulate 64 sample lengths, then calculate.

No peer yet (the Lightning ``Throughput`` comparison comes later), so the rows carry
absolute figures with ``ratio=None``.
"""

from __future__ import annotations

import random

from bench._harness import Row, best_ns_per_call
from twinkle.metric import ThroughputMetric

SAMPLES_PER_STEP = 64


def _steps(count: int) -> list[list[int]]:
    # Prompt + response lengths of a long-reasoning RL run: most below 4096 tokens
    # (exact buckets), a tail up to 32k (log buckets).
    rng = random.Random(0)
    return [
        [min(32_768, int(rng.lognormvariate(7.3, 0.9))) for _ in range(SAMPLES_PER_STEP)]
        for _ in range(count)
    ]


def run(smoke: bool) -> list[Row]:
    n = 200 if smoke else 20_000
    repeats = 2 if smoke else 5
    steps = _steps(256)
    metric = ThroughputMetric()

    def accumulate_only(k: int) -> None:
        for i in range(k):
            metric.accumulate(lengths=steps[i & 255], seconds=1.25, devices=8)

    def accumulate_and_calculate(k: int) -> None:
        for i in range(k):
            metric.accumulate(lengths=steps[i & 255], seconds=1.25, devices=8)
            metric.calculate()

    both = best_ns_per_call(accumulate_and_calculate, n, repeats)
    accumulate = best_ns_per_call(accumulate_only, n, repeats)
    return [
        Row(
            benchmark="metric",
            subject=f"ThroughputMetric accumulate+calculate ({SAMPLES_PER_STEP} samples/step)",
            value=both,
            unit="ns/step",
        ),
        Row(
            benchmark="metric",
            subject=f"ThroughputMetric accumulate ({SAMPLES_PER_STEP} samples/step)",
            value=accumulate,
            unit="ns/step",
        ),
    ]
