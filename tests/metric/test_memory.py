"""memory_metrics: binary units, reduction across workers, gathering over torch.distributed."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.metric import (
    BINARY_UNITS,
    MEMORY_FIELDS,
    MemoryMetrics,
    Reduction,
    convert_bytes,
    gather_readings,
    memory_metrics,
    memory_report,
    reduce_readings,
)
from twinkle.perf.stats import MemoryReading

GIB = 2**30


def reading(worker_id: str = "w0", *, rank: int | None = 0, **fields: int | None) -> MemoryReading:
    values: dict[str, Any] = {  # int or None by field, as MemoryReading checks
        "host_rss_bytes": GIB,
        "host_peak_rss_bytes": 2 * GIB,
        "device_allocated_bytes": None,
        "device_allocated_peak_bytes": None,
        "device_reserved_bytes": None,
        "device_reserved_peak_bytes": None,
    }
    values.update(fields)
    return MemoryReading(
        worker_id=worker_id,
        rank=rank,
        pid=1000 + (rank or 0),
        hostname="node0",
        device="cpu" if values["device_allocated_bytes"] is None else f"cuda:{rank or 0}",
        **values,
    )


def test_binary_units_are_powers_of_1024() -> None:
    assert dict(BINARY_UNITS) == {"B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (GIB, "GiB", 1.0),
        (3 * 2**19, "MiB", 1.5),
        (1536, "KiB", 1.5),
        (7, "B", 7.0),
        (0, "TiB", 0.0),
    ],
)
def test_convert_bytes_uses_binary_units(value: int, unit: str, expected: float) -> None:
    assert convert_bytes(value, unit) == expected


@pytest.mark.parametrize("unit", ["GB", "gib", "", None, "Gi"])
def test_convert_bytes_rejects_unknown_units(unit: str | None) -> None:
    with pytest.raises(InvalidArgumentError, match="unit") as info:
        convert_bytes(GIB, unit)  # type: ignore[arg-type]  # the None among them is the point
    assert "GiB" in str(info.value)


@pytest.mark.parametrize("value", [1.5, True, "1024", None])
def test_convert_bytes_rejects_non_int_values(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="value"):
        convert_bytes(value, "GiB")  # type: ignore[arg-type]  # the bad value is the point


def test_host_only_workers_are_skipped_for_device_fields_and_counted_out() -> None:
    readings = [
        reading("gpu0", rank=0, device_allocated_peak_bytes=3 * GIB),
        reading("host", rank=1),
        reading("gpu1", rank=2, device_allocated_peak_bytes=5 * GIB),
    ]
    out = reduce_readings(readings, fields=["device_allocated_peak_bytes", "host_rss_bytes"])
    assert list(out) == ["device_allocated_peak_bytes", "host_rss_bytes"]
    assert out["device_allocated_peak_bytes"] == Reduction(
        max=5 * GIB, min=3 * GIB, mean=4.0 * GIB, sum=8 * GIB, count=2, argmax_worker="gpu1"
    )
    assert out["host_rss_bytes"].count == 3


def test_field_no_worker_reported_has_nan_mean_and_no_argmax() -> None:
    out = reduce_readings([reading("a"), reading("b", rank=1)])
    empty = out["device_reserved_peak_bytes"]
    assert (empty.max, empty.min, empty.sum, empty.count, empty.argmax_worker) == (
        None,
        None,
        0,
        0,
        None,
    )
    assert math.isnan(empty.mean)


def test_argmax_tie_names_the_first_reading_holding_the_max() -> None:
    readings = [
        reading("a", host_rss_bytes=1),
        reading("b", host_rss_bytes=9),
        reading("c", host_rss_bytes=9),
    ]
    assert (
        reduce_readings(readings, fields=("host_rss_bytes",))["host_rss_bytes"].argmax_worker == "b"
    )


optional_bytes = st.one_of(st.none(), st.integers(0, 2**45))


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(st.tuples(st.integers(0, 2**45), optional_bytes), min_size=1, max_size=12))
def test_reduction_matches_the_definition_and_argmax_names_the_right_worker(
    columns: list[tuple[int, int | None]],
) -> None:
    readings = [
        reading(f"w{i}", rank=i, host_peak_rss_bytes=host, device_allocated_peak_bytes=device)
        for i, (host, device) in enumerate(columns)
    ]
    by_worker = {r.worker_id: r for r in readings}
    out = reduce_readings(readings)
    for field in ("host_peak_rss_bytes", "device_allocated_peak_bytes"):
        values = [getattr(r, field) for r in readings if getattr(r, field) is not None]
        r = out[field]
        assert r.count == len(values)
        if not values:
            assert r.max is None and r.argmax_worker is None
            continue
        assert (r.max, r.min, r.sum) == (max(values), min(values), sum(values))
        assert r.mean == sum(values) / len(values)
        assert r.argmax_worker is not None
        assert getattr(by_worker[r.argmax_worker], field) == r.max


def test_memory_metrics_keys_carry_the_unit_and_values_are_numbers() -> None:
    readings = [
        reading("w0", rank=0, device_allocated_peak_bytes=GIB, host_peak_rss_bytes=4 * GIB),
        reading("w1", rank=1, device_allocated_peak_bytes=3 * GIB, host_peak_rss_bytes=2 * GIB),
    ]
    values = memory_metrics(readings)
    assert values["device_allocated_peak_gib_max"] == 3.0
    assert values["device_allocated_peak_gib_min"] == 1.0
    assert values["device_allocated_peak_gib_mean"] == 2.0
    assert values["device_allocated_peak_gib_sum"] == 4.0
    assert values["device_allocated_peak_workers"] == 2
    assert values["host_peak_rss_gib_max"] == 4.0
    assert math.isnan(values["device_reserved_gib_max"])
    assert values["device_reserved_workers"] == 0
    assert all(type(v) in (int, float) for v in values.values())
    bases = [f.removesuffix("_bytes") for f in MEMORY_FIELDS]
    assert sorted(values) == sorted(
        [f"{b}_gib_{s}" for b in bases for s in ("max", "min", "mean", "sum")]
        + [f"{b}_workers" for b in bases]
    )


def test_memory_report_names_the_worker_holding_each_max() -> None:
    readings = [
        reading("w0", rank=0, device_allocated_peak_bytes=GIB, host_peak_rss_bytes=4 * GIB),
        reading("w1", rank=1, device_allocated_peak_bytes=3 * GIB, host_peak_rss_bytes=2 * GIB),
    ]
    report = memory_report(readings, unit="MiB")
    assert isinstance(report, MemoryMetrics)
    assert report.values["device_allocated_peak_mib_max"] == 3072.0
    assert report.attrs["device_allocated_peak_argmax_worker"] == "w1"
    assert report.attrs["host_peak_rss_argmax_worker"] == "w0"
    assert report.attrs["device_reserved_argmax_worker"] is None
    assert report.values == memory_metrics(readings, unit="MiB")


def test_memory_metrics_in_bytes_spell_the_unit_out() -> None:
    values = memory_metrics([reading()], unit="B", fields=["host_rss_bytes"])
    assert values == {
        "host_rss_bytes_max": float(GIB),
        "host_rss_bytes_min": float(GIB),
        "host_rss_bytes_mean": float(GIB),
        "host_rss_bytes_sum": float(GIB),
        "host_rss_workers": 1,
    }


@pytest.mark.parametrize(
    ("call", "argument"),
    [  # (the type: ignores: the wrong types are the point)
        (lambda: reduce_readings([]), "readings"),
        (lambda: reduce_readings(reading()), "readings"),  # type: ignore[arg-type]
        (lambda: reduce_readings([reading(), {"host_rss_bytes": 1}]), "readings"),  # type: ignore[list-item]
        (lambda: reduce_readings([reading()], fields=["host_rss"]), "fields"),
        (lambda: reduce_readings([reading()], fields="host_rss_bytes"), "fields"),
        (lambda: reduce_readings([reading()], fields=[]), "fields"),
        (lambda: reduce_readings([reading()], fields=["host_rss_bytes"] * 2), "fields"),
        (lambda: memory_metrics([]), "readings"),
        (lambda: memory_metrics([reading()], unit="GB"), "unit"),
        (lambda: memory_report([reading()], unit="mib"), "unit"),
        (lambda: gather_readings({"worker_id": "w0"}), "reading"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_are_rejected_by_name(call: Callable[[], object], argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=argument) as info:
        call()
    assert "got" in str(info.value)


def test_a_reading_with_a_non_int_byte_count_is_rejected() -> None:
    bad = reading("w0")
    msgspec.structs.force_setattr(bad, "host_rss_bytes", 1.5)  # a reading that bypassed checks
    with pytest.raises(InvalidArgumentError, match=r"readings\[1\]\.host_rss_bytes"):
        reduce_readings([reading("ok"), bad])


def test_gather_without_an_initialised_process_group_returns_the_reading() -> None:
    r = reading("solo")
    assert gather_readings(r) == [r]


def _gather_on_rank(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=30),
    )
    try:
        mine = reading(f"worker-{rank}", rank=rank, host_peak_rss_bytes=(rank + 1) * GIB)
        gathered = gather_readings(mine)
        report = memory_report(gathered, fields=["host_peak_rss_bytes"])
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "workers": [r.worker_id for r in gathered],
                    "equal": [
                        r
                        == reading(
                            r.worker_id, rank=r.rank, host_peak_rss_bytes=r.host_peak_rss_bytes
                        )
                        for r in gathered
                    ],
                    "max": report.values["host_peak_rss_gib_max"],
                    "argmax": report.attrs["host_peak_rss_argmax_worker"],
                }
            )
        )
    finally:
        dist.destroy_process_group()


def test_gather_readings_collects_every_rank_over_gloo(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    from torch.multiprocessing.spawn import ProcessContext
    from torch.multiprocessing.spawn import spawn as untyped_spawn

    spawn = cast("Callable[..., ProcessContext]", untyped_spawn)  # torch leaves it unannotated
    context = spawn(
        _gather_on_rank,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=False,
    )
    deadline = time.monotonic() + 60
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "gloo ranks did not finish in 60 s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {
            "workers": ["worker-0", "worker-1"],
            "equal": [True, True],
            "max": 2.0,
            "argmax": "worker-1",
        }
