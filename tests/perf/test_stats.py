"""twinkle.perf.stats: raw memory readings of one worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.perf import MemoryReading, memory_stats, process_memory_stats

GiB = 2**30


class FakeAllocator:
    """Stands in for ``torch.cuda`` / ``torch.npu``; logs every call."""

    def __init__(
        self, *, initialised: bool = True, available: bool = True, count: int = 2, current: int = 1
    ) -> None:
        self.initialised, self.available = initialised, available
        self.count, self.current = count, current
        self.calls: list[Any] = []

    def is_initialized(self) -> bool:
        self.calls.append("is_initialized")
        return self.initialised

    def is_available(self) -> bool:
        self.calls.append("is_available")
        return self.available

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        self.calls.append("current_device")
        return self.current

    def synchronize(self, index: int) -> None:
        self.calls.append(("synchronize", index))

    def memory_allocated(self, index: int) -> int:
        return 1 * GiB + index

    def max_memory_allocated(self, index: int) -> int:
        return 2 * GiB + index

    def memory_reserved(self, index: int) -> int:
        return 3 * GiB + index

    def max_memory_reserved(self, index: int) -> int:
        return 4 * GiB + index

    def reset_peak_memory_stats(self, *args: Any) -> None:  # must never be called
        self.calls.append("reset_peak_memory_stats")


class FakeDistributed(types.ModuleType):
    def __init__(self, rank: int | None) -> None:
        super().__init__("torch.distributed")
        self._rank = rank

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self._rank is not None

    def get_rank(self) -> int:
        assert self._rank is not None
        return self._rank


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fake ``torch`` in sys.modules (with CUDA), so no test imports the real one."""
    torch = types.ModuleType("torch")
    torch.cuda = FakeAllocator()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    return torch


def test_memory_stats_on_a_host_only_worker_reads_host_bytes_and_no_device() -> None:
    reading = memory_stats(device="cpu")
    assert isinstance(reading.host_rss_bytes, int)
    assert reading.host_rss_bytes > 0
    assert reading.host_peak_rss_bytes >= reading.host_rss_bytes
    assert reading.device == "cpu"
    assert reading.device_allocated_bytes is None
    assert reading.device_allocated_peak_bytes is None
    assert reading.device_reserved_bytes is None
    assert reading.device_reserved_peak_bytes is None


def test_memory_stats_identifies_the_worker() -> None:
    reading = memory_stats()
    assert reading.pid == os.getpid()
    assert reading.hostname == socket.gethostname()
    assert reading.worker_id == f"{socket.gethostname()}:{os.getpid()}"
    assert memory_stats(worker_id="rollout-3", rank=3).worker_id == "rollout-3"
    assert memory_stats(rank=3).rank == 3


def test_memory_stats_host_rss_grows_with_allocation() -> None:
    before = memory_stats().host_rss_bytes
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = memory_stats()
    assert after.host_rss_bytes >= before + 32 * 2**20
    assert after.host_peak_rss_bytes >= after.host_rss_bytes
    del block


def test_memory_stats_does_not_import_torch() -> None:
    code = (
        "import sys, twinkle.perf\n"
        "twinkle.perf.memory_stats()\n"
        "twinkle.perf.memory_stats(device='cpu')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_twinkle_perf_does_not_import_torch() -> None:
    code = "import sys, twinkle.perf\nassert 'torch' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_stats_reads_the_device_allocator_without_reset_or_sync(
    fake_torch: types.ModuleType,
) -> None:
    reading = memory_stats(device="cuda:0")
    assert reading.device == "cuda:0"
    assert (
        reading.device_allocated_bytes,
        reading.device_allocated_peak_bytes,
        reading.device_reserved_bytes,
        reading.device_reserved_peak_bytes,
    ) == (1 * GiB, 2 * GiB, 3 * GiB, 4 * GiB)
    calls = fake_torch.cuda.calls
    assert "reset_peak_memory_stats" not in calls
    assert not any(isinstance(call, tuple) and call[0] == "synchronize" for call in calls)


def test_memory_stats_synchronises_only_when_asked(fake_torch: types.ModuleType) -> None:
    memory_stats(device="cuda:1", sync=True)
    assert ("synchronize", 1) in fake_torch.cuda.calls


def test_memory_stats_defaults_to_the_device_the_process_already_uses(
    fake_torch: types.ModuleType,
) -> None:
    reading = memory_stats()
    assert reading.device == "cuda:1"
    assert reading.device_allocated_bytes == 1 * GiB + 1


def test_memory_stats_never_initialises_a_device_by_default(
    fake_torch: types.ModuleType,
) -> None:
    fake_torch.cuda.initialised = False
    reading = memory_stats()
    assert reading.device == "cpu"
    assert reading.device_allocated_bytes is None
    assert fake_torch.cuda.calls == ["is_initialized"]


def test_memory_stats_plain_cuda_means_the_current_device(fake_torch: types.ModuleType) -> None:
    assert memory_stats(device="cuda").device == "cuda:1"


def test_memory_stats_reads_an_npu_through_torch_npu(
    fake_torch: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch.npu = FakeAllocator(current=0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    reading = memory_stats(device="npu:1")
    assert reading.device == "npu:1"
    assert reading.device_reserved_peak_bytes == 4 * GiB + 1


def test_memory_stats_takes_the_rank_from_torch_distributed(
    fake_torch: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDistributed(rank=5))
    assert memory_stats(device="cpu").rank == 5
    assert memory_stats(device="cpu", rank=5).rank == 5
    with pytest.raises(InvalidArgumentError, match=r"rank=2 differs from the torch\.distributed"):
        memory_stats(device="cpu", rank=2)


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("gpu", "is not a device this reading knows"),
        ("CUDA:0", "is not a device this reading knows"),
        ("cuda:x", "is not a device this reading knows"),
        ("cuda:-1", "is not a device this reading knows"),
        ("mps", "is not a device this reading knows"),
        (0, "is not a str"),
        ("cuda:2", "out of range"),
        ("npu:0", "needs torch_npu"),
    ],
)
def test_memory_stats_rejects_devices_it_cannot_read(
    fake_torch: types.ModuleType, monkeypatch: pytest.MonkeyPatch, device: Any, match: str
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # as if not installed
    with pytest.raises(InvalidArgumentError, match=match) as raised:
        memory_stats(device=device)
    assert "device=" in str(raised.value)
    assert "'cuda:N'" in str(raised.value)  # the fix


def test_memory_stats_rejects_cuda_where_there_is_none(fake_torch: types.ModuleType) -> None:
    fake_torch.cuda.available = False
    with pytest.raises(InvalidArgumentError, match="no cuda device is available"):
        memory_stats(device="cuda:0")


def test_memory_stats_rejects_a_device_when_torch_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    with pytest.raises(InvalidArgumentError, match="needs torch"):
        memory_stats(device="cuda:0")
    assert memory_stats().device == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_id": ""}, "worker_id must be a non-empty str"),
        ({"worker_id": 3}, "worker_id must be a non-empty str"),
        ({"rank": -1}, "rank must be an int >= 0"),
        ({"rank": True}, "rank must be an int >= 0"),
        ({"sync": 1}, "sync must be True or False"),
    ],
)
def test_memory_stats_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        memory_stats(**kwargs)


# -- MemoryReading --------------------------------------------------------------------------

byte_counts = st.integers(0, 2**50)
readings = st.builds(
    MemoryReading,
    worker_id=st.text(min_size=1, max_size=20),
    rank=st.none() | st.integers(0, 1024),
    pid=st.integers(1, 2**22),
    hostname=st.text(min_size=1, max_size=20),
    device=st.sampled_from(["cpu", "cuda:0", "npu:3"]),
    host_rss_bytes=byte_counts,
    host_peak_rss_bytes=byte_counts,
    device_allocated_bytes=st.none() | byte_counts,
    device_allocated_peak_bytes=st.none() | byte_counts,
    device_reserved_bytes=st.none() | byte_counts,
    device_reserved_peak_bytes=st.none() | byte_counts,
)


@given(readings)
def test_memory_reading_round_trips_through_a_dict(reading: MemoryReading) -> None:
    data = reading.to_dict()
    assert all(type(v) in (int, str, type(None)) for v in data.values())
    assert MemoryReading.from_dict(data) == reading


def test_memory_reading_dict_keeps_raw_bytes_and_unit_named_keys() -> None:
    data = memory_stats().to_dict()
    assert set(data) == {
        "worker_id",
        "rank",
        "pid",
        "hostname",
        "device",
        "host_rss_bytes",
        "host_peak_rss_bytes",
        "device_allocated_bytes",
        "device_allocated_peak_bytes",
        "device_reserved_bytes",
        "device_reserved_peak_bytes",
    }


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"host_rss_bytes": 1.5}, r"data.host_rss_bytes = 1.5: expected `int`, got `float`"),
        ({"host_rss_bytes": None}, r"data.host_rss_bytes = None: expected `int`, got `null`"),
        ({"device_reserved_bytes": -1}, "device_reserved_bytes must be an int >= 0"),
        ({"pid": 0}, "pid must be a positive int"),
        ({"rank": -2}, "rank must be an int >= 0"),
        ({"device": ""}, "device must be a non-empty str"),
        ({"extra": 1}, r"data has unknown field\(s\) \['extra'\]"),
    ],
)
def test_memory_reading_from_dict_rejects_malformed_data(
    change: dict[str, Any], match: str
) -> None:
    data = {**memory_stats().to_dict(), **change}
    with pytest.raises(InvalidArgumentError, match=match):
        MemoryReading.from_dict(data)


def test_memory_reading_from_dict_names_missing_keys() -> None:
    data = memory_stats().to_dict()
    del data["host_peak_rss_bytes"]
    with pytest.raises(
        InvalidArgumentError, match=r"data lacks field\(s\) \['host_peak_rss_bytes'\]"
    ):
        MemoryReading.from_dict(data)


def test_memory_stats_with_real_torch_reads_the_host_only_unless_a_device_is_in_use() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: see the CUDA test")
    reading = memory_stats()
    assert reading.device == "cpu"
    assert reading.device_allocated_bytes is None
    with pytest.raises(InvalidArgumentError, match="no cuda device is available"):
        memory_stats(device="cuda:0")


def test_memory_stats_reads_real_cuda_peaks_without_resetting_them() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    held = memory_stats(device="cuda:0", sync=True)
    del block
    freed = memory_stats(device="cuda:0")
    assert held.device_allocated_bytes is not None
    assert held.device_allocated_bytes >= 256 * 2**20
    assert held.device_reserved_bytes is not None
    assert held.device_reserved_bytes >= held.device_allocated_bytes
    assert freed.device_allocated_peak_bytes is not None
    assert freed.device_allocated_peak_bytes >= held.device_allocated_bytes  # not reset
    assert memory_stats().device == "cuda:0"  # the device this process now uses


def test_another_processs_memory_is_its_own_resident_set_and_peak() -> None:
    # The child touches 64 MiB, frees it, says so and waits: its peak stays above its
    # current set.
    code = (
        "b = bytearray(64 << 20); del b; import sys; print('freed', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "freed\n"
        reading = process_memory_stats(child.pid, worker_id="engine-0")
        assert reading.worker_id == "engine-0" and reading.pid == child.pid != os.getpid()
        assert reading.device == "cpu" and reading.device_allocated_bytes is None
        if sys.platform.startswith("linux"):  # VmHWM: the peak, not the current set
            assert reading.host_peak_rss_bytes >= 64 << 20
            assert reading.host_rss_bytes < reading.host_peak_rss_bytes - (32 << 20)
        else:  # elsewhere another process's peak is its current set
            assert reading.host_peak_rss_bytes == reading.host_rss_bytes > 0
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(timeout=30)
        child.stdout.close()


def test_reading_a_process_that_is_gone_names_it() -> None:

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    with pytest.raises(
        InvalidArgumentError, match=rf"process {child.pid} \(worker 'w'\) is not running"
    ):
        process_memory_stats(child.pid, worker_id="w")


@pytest.mark.parametrize(
    ("pid", "worker_id", "match"),
    [(0, "w", "pid must be a positive int"), (True, "w", "pid must"), (1, "", "worker_id must")],
)
def test_process_memory_refuses_bad_arguments(pid: object, worker_id: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        process_memory_stats(pid, worker_id=worker_id)  # type: ignore[arg-type]
