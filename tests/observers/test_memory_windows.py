"""Memory per window (issue 27, item 5), on a manual clock: each iteration's memory
record reduces the readings of its own window, whatever order and grouping they came
in; a reading without an iteration joins the window its time falls in; the flat file's
line of an iteration is the whole reduction, never a part.

Boundaries at 10, 100 and 200 ms, the finish at 260 ms. Readings (worker, host RSS
in bytes, published at):

* ``setup``  100 at 5 ms, no iteration: in the set-up window, in no record;
* ``engine`` 200 at 50 ms, then 210 at 95 ms, no iteration: window 0 (the latest, 210);
* ``trainer`` 300 at 60 ms for iteration 0, and 320 at 150 ms for iteration 1;
* ``engine`` 230 at 150 ms, no iteration: window 1;
* ``engine`` 250 at 160 ms for iteration 2 (not started yet): iteration 2's;
* ``trainer`` 999 at 210 ms for iteration 0, finalised at 200 ms: late;
* ``engine`` 777 at 220 ms for iteration 9, which never starts: late.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import check_replay
from observers.test_scripted_run import manual_session
from twinkle.perf.stats import MemoryReading

MS = 1_000_000
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
}


def _reading(worker: str, rss: int) -> MemoryReading:
    return MemoryReading(worker, None, 1, "h", "cpu", rss, rss, None, None, None, None)


#: (at ms, iteration, worker, host RSS)
READINGS: list[tuple[int, int | None, str, int]] = [
    (5, None, "setup", 100),
    (50, None, "engine", 200),
    (60, 0, "trainer", 300),
    (95, None, "engine", 210),
    (150, 1, "trainer", 320),
    (150, None, "engine", 230),
    (160, 2, "engine", 250),
    (210, 0, "trainer", 999),
    (220, 9, "engine", 777),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run, clock = manual_session(tmp_path_factory.mktemp("memory"), "memory", CONFIG)
    bus = run.bus
    events: list[tuple[int, str, tuple[Any, ...]]] = [
        (at, "reading", (it, w, rss)) for at, it, w, rss in READINGS
    ]
    events += [(at, "boundary", (i,)) for i, at in enumerate([10, 100, 200])]
    for at, what, args in sorted(events, key=lambda e: (e[0], e[1] != "boundary")):
        clock.set(at * MS)
        if what == "boundary":
            bus.iteration_started(args[0])
        else:
            iteration, worker, rss = args
            bus.memory([_reading(worker, rss)], iteration=iteration)
    clock.set(260 * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def _memory_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    return {r["iteration"]: r for r in records if r["kind"] == "memory"}


def test_each_iteration_reduces_the_readings_of_its_own_window(run_dir: Path) -> None:
    memory = _memory_records(run_dir)
    assert sorted(memory) == [0, 1, 2]
    zero, one, two = memory[0], memory[1], memory[2]
    assert zero["attrs"]["workers"] == ["engine", "trainer"]
    assert (zero["values"]["host_rss_bytes_min"], zero["values"]["host_rss_bytes_max"]) == (
        210,  # the engine's latest in window 0, not its 200 nor window 1's 230
        300,  # the trainer's for iteration 0, not the late 999
    )
    assert zero["values"]["host_rss_bytes_sum"] == 510
    assert one["attrs"]["workers"] == ["engine", "trainer"]
    assert one["values"]["host_rss_bytes_sum"] == 230 + 320
    assert two["attrs"]["workers"] == ["engine"]
    assert two["values"]["host_rss_bytes_max"] == 250


def test_the_flat_file_carries_each_whole_reduction_once(run_dir: Path) -> None:
    lines = [orjson.loads(x) for x in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1, 2]
    assert [line["memory/host_rss_workers"] for line in lines] == [2, 2, 1]
    assert [line["memory/host_rss_bytes_sum"] for line in lines] == [510, 550, 250]


def test_late_readings_are_counted_and_every_reading_is_in_the_peaks(
    run_dir: Path, tmp_path: Path
) -> None:
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["memory_readings"] == len(READINGS)
    assert summary["memory_late_readings"] == 2  # 999 (iteration 0, finalised), 777 (9)
    assert summary["memory_max"]["host_rss_bytes"] == {"bytes": 999, "worker": "trainer"}
    check_replay(run_dir, tmp_path / "replayed")


def test_a_worker_reading_two_devices_counts_each_device_and_its_process_once(
    tmp_path: Path,
) -> None:
    """Iteration 0: worker ``two`` (one process on two GPUs) reads cuda:0 (10 B
    allocated, RSS 50) then cuda:1 (20 B, RSS 60), then cuda:0 again (12 B, RSS 70);
    worker ``one`` reads cuda:0 (5 B, RSS 40). Device fields: each device's latest,
    12 + 20 + 5 = 37 over 3 devices (max 20, ``two``); host fields: each worker's latest
    reading, 70 + 40 = 110 over 2 workers."""

    def gpu(worker: str, device: str, allocated: int, rss: int) -> MemoryReading:
        return MemoryReading(worker, None, 1, "h", device, rss, rss, allocated, allocated, 0, 0)

    run, clock = manual_session(tmp_path, "devices", CONFIG)
    clock.set(10 * MS)
    run.bus.iteration_started(0)
    clock.set(20 * MS)
    run.bus.memory([gpu("two", "cuda:0", 10, 50), gpu("two", "cuda:1", 20, 60)], iteration=0)
    run.bus.memory([gpu("one", "cuda:0", 5, 40), gpu("two", "cuda:0", 12, 70)], iteration=0)
    clock.set(100 * MS)
    run.bus.iteration_started(1)
    clock.set(200 * MS)
    run.finish()
    assert run.out_dir is not None
    record = _memory_records(run.out_dir)[0]
    values = record["values"]
    assert (values["device_allocated_bytes_sum"], values["device_allocated_workers"]) == (37, 3)
    assert values["device_allocated_bytes_max"] == 20
    assert record["attrs"]["device_allocated_argmax_worker"] == "two"
    assert (values["host_rss_bytes_sum"], values["host_rss_workers"]) == (110, 2)
    assert record["attrs"]["workers"] == ["one", "two"]
    check_replay(run.out_dir, tmp_path / "replayed")


def test_a_sum_past_a_64_bit_integer_is_a_float_and_no_record_is_lost(tmp_path: Path) -> None:
    """Iteration 0: three workers each read 2**63 - 1 bytes (a reading's bound); iteration
    1: one reads 1. The sum, 3 * (2**63 - 1), fits no record's int: the observer failed
    and both iterations' records were lost. It is written as a float (2.767e19); the
    max, min and mean stay ints, and iteration 1's record is whole."""
    big = 2**63 - 1
    run, clock = manual_session(tmp_path, "huge", CONFIG)
    clock.set(10 * MS)
    run.bus.iteration_started(0)
    clock.set(20 * MS)
    run.bus.memory([_reading(w, big) for w in ("a", "b", "c")], iteration=0)
    clock.set(100 * MS)
    run.bus.iteration_started(1)
    clock.set(120 * MS)
    run.bus.memory([_reading("a", 1)], iteration=1)
    clock.set(200 * MS)
    run.finish()
    assert run.out_dir is not None and run.summary is not None
    assert run.summary["observer_failures"] == {}
    records = _memory_records(run.out_dir)
    assert sorted(records) == [0, 1]
    values = records[0]["values"]
    assert values["host_rss_bytes_sum"] == float(3 * big)
    assert type(values["host_rss_bytes_sum"]) is float
    assert (values["host_rss_bytes_max"], values["host_rss_bytes_mean"]) == (big, big)
    assert records[1]["values"]["host_rss_bytes_sum"] == 1
    check_replay(run.out_dir, tmp_path / "replayed")
