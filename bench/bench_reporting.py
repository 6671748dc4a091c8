"""Reporting benchmarks: the caller's cost of ``report()`` and sustained JSONL throughput.

Both are measured side by side, in turns, against the stdlib way of writing the same
records: ``f.write(json.dumps(d) + "\\n")`` per record dict on a buffered file.

* ``report() caller cost``: ns per record spent on the reporting thread with
  ``background=True`` (stamping ``seq`` and enqueueing; the writer thread runs at the
  same time, as it does in training). Baseline: the stdlib write on the caller's thread.
* ``JSONL throughput``: records/s from the first ``report()`` until ``flush()`` returned
  (every record in the OS). Baseline: the stdlib loop plus ``f.flush()``. Target >= 3x.

Files go to a RAM-backed directory (``/dev/shm``) when there is one, for both sides:
the figures are the CPU cost of writing, not the disk's writeback speed (which would
throttle whichever side happened to run when the dirty-page limit was reached).

The record is a realistic ``train`` record: throughput, phase-time and memory-reduction
values (30 numbers, one of them NaN) and a few attrs.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import Row
from twinkle.metric.reporting import (
    JsonlBackend,
    MetricRecord,
    MetricsReporter,
    make_record,
    record_to_dict,
)

RUN_ID = "bench-reporting"

_KEYS = (
    # ThroughputMetric
    "samples",
    "tokens",
    "seconds",
    "device_seconds",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "length_mean",
    "length_min",
    "length_max",
    "length_p50",
    "length_p95",
    # per-iteration phase accounting
    "prompt_tokens",
    "response_tokens",
    "effective_tokens",
    "generation_seconds",
    "training_seconds",
    "logical_seconds",
    "observer_seconds",
    "phase_union_seconds",
    "phase_overlap_seconds",
    # memory reductions across workers (GiB)
    "device_allocated_peak_gib_max",
    "device_allocated_peak_gib_min",
    "device_allocated_peak_gib_mean",
    "device_allocated_peak_gib_sum",
    "device_reserved_peak_gib_max",
    "device_reserved_peak_gib_min",
    "device_reserved_peak_gib_mean",
    "device_reserved_peak_gib_sum",
    "host_peak_rss_gib_max",
    "host_peak_rss_gib_mean",
)


def _record(i: int) -> MetricRecord:
    values: dict[str, int | float] = {k: (i % 97) * 1.37 + n / 7 for n, k in enumerate(_KEYS)}
    values["samples"] = 256
    values["tokens"] = 256 * 731 + i
    values["length_p95"] = float("nan")  # a window too small for a p95: named, never dropped
    return make_record(
        kind="train",
        scope="iteration",
        run_id=RUN_ID,
        step=i,
        iteration=i,
        wall_ns=1_715_000_000_000_000_000 + i * 1_000_000,
        monotonic_ns=5_000_000_000 + i * 1_000_000,
        values=values,
        attrs={"phase": "train", "devices": 8, "argmax_worker": "node0:4242"},
    )


def _twinkle(path: Path, records: list[MetricRecord]) -> tuple[int, int]:
    """(caller ns, ns until flushed) for reporting ``records`` in the background."""
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN_ID, background=True)
    try:
        report = reporter.report
        t0 = time.perf_counter_ns()
        for record in records:
            report(record)
        t1 = time.perf_counter_ns()
        reporter.flush()
        t2 = time.perf_counter_ns()
    finally:
        reporter.close()
    return t1 - t0, t2 - t0


def _stdlib(path: Path, dicts: list[dict[str, Any]]) -> int:
    with path.open("w", encoding="utf-8") as f:
        t0 = time.perf_counter_ns()
        for d in dicts:
            f.write(json.dumps(d) + "\n")
        f.flush()
        return time.perf_counter_ns() - t0


def _tmp_parent() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def run(smoke: bool) -> list[Row]:
    n = 2_000 if smoke else 50_000
    repeats = 2 if smoke else 7
    records = [_record(i) for i in range(n)]
    # The baseline gets the same records as plain dicts (NaN already null, as in the file).
    dicts = [record_to_dict(r) for r in records]
    best_caller = best_twinkle = best_stdlib = float("inf")
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-", dir=_tmp_parent()) as tmp:
        for k in range(repeats):
            twinkle_path, stdlib_path = Path(tmp, f"twinkle-{k}.jsonl"), Path(tmp, "stdlib.jsonl")
            caller_ns, total_ns = _twinkle(twinkle_path, records)
            stdlib_ns = _stdlib(stdlib_path, dicts)
            twinkle_path.unlink()
            stdlib_path.unlink()
            best_caller = min(best_caller, caller_ns / n)
            best_twinkle = min(best_twinkle, total_ns / n)
            best_stdlib = min(best_stdlib, stdlib_ns / n)
    twinkle_rate = 1e9 / best_twinkle
    stdlib_rate = 1e9 / best_stdlib
    speedup = twinkle_rate / stdlib_rate
    return [
        Row(
            benchmark="reporting",
            subject="report() caller cost, background=True",
            value=best_caller,
            unit="ns/record",
            ratio=best_caller / best_stdlib,
            baseline="json.dumps+write on caller",
        ),
        Row(
            benchmark="reporting",
            subject="JSONL records/s, reporter to flush",
            value=twinkle_rate,
            unit="records/s",
            ratio=speedup,
            baseline="json.dumps+write per record",
            target=">= 3x (higher is better)",
            met=speedup >= 3.0,
        ),
        Row(
            benchmark="reporting",
            subject="stdlib json.dumps+write (baseline)",
            value=stdlib_rate,
            unit="records/s",
        ),
    ]
