"""Reporting benchmarks: the caller's cost of ``report()`` and sustained JSONL throughput.

Both are measured side by side, in turns, against the ways people write the same records
today:

* stdlib: ``f.write(json.dumps(d) + "\\n")`` per record dict on a buffered file;
* stdlib ``logging``: ``logger.info(d)`` to a ``FileHandler`` whose formatter returns
  ``json.dumps(record.msg)`` (a minimal JSON formatter; python-json-logger and friends
  do more per record). A ``FileHandler`` flushes after every record, as it ships.

* ``report() caller cost``: ns per record spent on the reporting thread with
  ``background=True`` (stamping ``seq`` and enqueueing; the writer thread runs at the
  same time, as it does in training). Baseline: the stdlib write on the caller's thread.
* ``JSONL throughput``: records/s from the first ``report()`` until ``flush()`` returned
  (every record in the OS). Baseline: the stdlib loop plus ``f.flush()``. Target >= 3x.

Files go to a RAM-backed directory (``/dev/shm``) when there is one, for every side:
the figures are the CPU cost of writing, not the disk's writeback speed (which would
throttle whichever side happened to run when the dirty-page limit was reached). The
``reporting (disk)`` rows repeat the records/s comparison in a directory on the real
disk (the system temp dir, or ``TWINKLE_BENCH_DISK_DIR``), fewer records, to show that
the ratio holds there too (or how far it does not).

The record is a realistic ``train`` record: throughput, phase-time and memory-reduction
values (30 numbers, one of them NaN) and a few attrs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import Row
from twinkle.reporting import (
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


class _JsonFormatter(logging.Formatter):
    """The least a JSON log formatter does: the message dict as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record.msg)


def _logging(path: Path, dicts: list[dict[str, Any]]) -> int:
    logger = logging.Logger(f"bench.reporting.{path.stem}", logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(_JsonFormatter())
    logger.addHandler(handler)
    try:
        info = logger.info
        t0 = time.perf_counter_ns()
        for d in dicts:
            info(d)
        handler.flush()
        return time.perf_counter_ns() - t0
    finally:
        logger.removeHandler(handler)
        handler.close()


def _tmp_parent() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _disk_parent() -> str | None:
    return os.environ.get("TWINKLE_BENCH_DISK_DIR") or None  # None: the system temp dir


def _measure(
    parent: str | None, records: list[MetricRecord], dicts: list[dict[str, Any]], repeats: int
) -> dict[str, float]:
    """Best ns/record of each writer, taking turns; files removed after each round."""
    n = len(records)
    best = dict.fromkeys(("caller", "twinkle", "stdlib", "logging"), float("inf"))
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-", dir=parent) as tmp:
        for k in range(repeats):
            paths = {name: Path(tmp, f"{name}-{k}.jsonl") for name in best}
            caller_ns, total_ns = _twinkle(paths["twinkle"], records)
            stdlib_ns = _stdlib(paths["stdlib"], dicts)
            logging_ns = _logging(paths["logging"], dicts)
            for path in paths.values():
                path.unlink(missing_ok=True)
            for name, value in (
                ("caller", caller_ns),
                ("twinkle", total_ns),
                ("stdlib", stdlib_ns),
                ("logging", logging_ns),
            ):
                best[name] = min(best[name], value / n)
    return best


def run(smoke: bool) -> list[Row]:
    n = 2_000 if smoke else 30_000
    repeats = 2 if smoke else 7
    records = [_record(i) for i in range(n)]
    # The baselines get the same records as plain dicts (NaN already null, as in the file).
    dicts = [record_to_dict(r) for r in records]
    shm = _measure(_tmp_parent(), records, dicts, repeats)
    disk_n = n // 3
    disk = _measure(_disk_parent(), records[:disk_n], dicts[:disk_n], 2 if smoke else 3)
    where = "/dev/shm" if _tmp_parent() else "temp dir"
    rows = [
        Row(
            benchmark="reporting",
            subject="report() caller cost, background=True",
            value=shm["caller"],
            unit="ns/record",
            ratio=shm["caller"] / shm["stdlib"],
            baseline="json.dumps+write on caller",
            note="seq stamp + enqueue; serialising and writing run on the writer thread",
        ),
        Row(
            benchmark="reporting",
            subject="report() caller cost vs logging.info",
            value=shm["caller"],
            unit="ns/record",
            ratio=shm["caller"] / shm["logging"],
            baseline="logging.info, JSON formatter",
        ),
    ]
    for label, best, target in (("reporting", shm, 3.0), ("reporting (disk)", disk, 3.0)):
        rate = 1e9 / best["twinkle"]
        vs_stdlib = best["stdlib"] / best["twinkle"]
        vs_logging = best["logging"] / best["twinkle"]
        place = where if label == "reporting" else "real disk"
        rows += [
            Row(
                benchmark=label,
                subject=f"JSONL records/s, reporter to flush ({place})",
                value=rate,
                unit="records/s",
                ratio=vs_stdlib,
                baseline="json.dumps+write per record",
                target=f">= {target:g}x (higher is better)",
                met=vs_stdlib >= target,
                note="" if label == "reporting" else f"{disk_n:,} records, page cache",
            ),
            Row(
                benchmark=label,
                subject=f"JSONL records/s vs logging ({place})",
                value=rate,
                unit="records/s",
                ratio=vs_logging,
                baseline="logging.info, JSON formatter",
                target=f">= {target:g}x (higher is better)",
                met=vs_logging >= target,
            ),
            Row(
                benchmark=label,
                subject=f"peer: stdlib json.dumps+write ({place})",
                value=1e9 / best["stdlib"],
                unit="records/s",
            ),
            Row(
                benchmark=label,
                subject=f"peer: logging.info + FileHandler + JSON formatter ({place})",
                value=1e9 / best["logging"],
                unit="records/s",
                note="FileHandler flushes every record",
            ),
        ]
    return rows
