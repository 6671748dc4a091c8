"""``memory_stats``: one worker's raw memory readings, in integer bytes.

A reading is what the process and its device allocator report right now: allocator
current and lifetime peak (allocated, reserved) for the worker's CUDA or NPU device, and
the host resident set (current and peak). Nothing is converted (bytes stay bytes), no
peak is reset and no device is synchronised unless asked; reduction across workers and
unit conversion live in ``twinkle.metric``.

torch is optional: it is imported only when a device is asked for explicitly, or looked
at when the caller already imported it (``sys.modules``); importing it here would cost
seconds and, on some set-ups, initialise a device as a side effect.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgspec

from twinkle.checks import INT64_MAX, convert_checked, is_integer, plain_number
from twinkle.errors import InvalidArgumentError
from twinkle.perf.dist import initialised_dist

__all__ = ["MemoryReading", "memory_stats"]

_DEVICE_RE = re.compile(r"(cpu|cuda|npu)(?::(\d+))?")
_STATUS_RE = re.compile(rb"^(VmRSS|VmHWM):\s*(\d+) kB", re.MULTILINE)
_DEVICE_FIELDS = (
    "device_allocated_bytes",
    "device_allocated_peak_bytes",
    "device_reserved_bytes",
    "device_reserved_peak_bytes",
)


def _check_rank(rank: object) -> int | None:
    """``rank`` (numpy or torch: its plain int) if it is an int >= 0 or None."""
    rank = plain_number(rank)
    if rank is not None and (not is_integer(rank) or rank < 0):
        raise InvalidArgumentError(f"rank must be an int >= 0 or None, got {rank!r}")
    return rank


class MemoryReading(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One worker's memory at one moment, raw integer bytes.

    Device fields are ``None`` on a host-only worker (``device == "cpu"``). Built
    directly, every field is checked (a reading comes from a caller); the same bounds
    are what a reading in the event log is checked against.
    """

    worker_id: str  # caller-chosen identity, default f"{hostname}:{pid}"
    rank: int | None  # torch.distributed rank, or the one given
    pid: int
    hostname: str
    device: str  # "cpu", "cuda:0", "npu:0"
    host_rss_bytes: int
    host_peak_rss_bytes: int
    device_allocated_bytes: int | None
    device_allocated_peak_bytes: int | None
    device_reserved_bytes: int | None
    device_reserved_peak_bytes: int | None

    def __post_init__(self) -> None:
        for name in ("worker_id", "hostname", "device"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{name} must be a non-empty str, got {value!r}")
        # Strict, unlike the readers' arguments: a reading holds plain ints only.
        if self.rank is not None and (not is_integer(self.rank) or self.rank < 0):
            raise InvalidArgumentError(f"rank must be an int >= 0 or None, got {self.rank!r}")
        if not is_integer(self.pid) or self.pid <= 0:
            raise InvalidArgumentError(f"pid must be a positive int, got {self.pid!r}")
        for name in ("host_rss_bytes", "host_peak_rss_bytes", *_DEVICE_FIELDS):
            value = getattr(self, name)
            if value is None and name in _DEVICE_FIELDS:
                continue
            if not is_integer(value) or not 0 <= value <= INT64_MAX:
                raise InvalidArgumentError(
                    f"{name} must be an int >= 0 (bytes){' or None' * (name in _DEVICE_FIELDS)}"
                    f", got {value!r}; readings are raw integer bytes, never converted"
                )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-able)."""
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryReading:
        """Rebuild a reading written by :meth:`to_dict`; every field is checked."""
        return convert_checked(data, cls)


@dataclass(frozen=True, slots=True)
class _Device:
    kind: str  # "cpu", "cuda" or "npu"
    index: int | None
    backend: ModuleType | None  # torch.cuda / torch.npu

    @property
    def label(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


_CPU = _Device("cpu", None, None)


def _bad_device(device: object, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"device={device!r} {why}; pass None (this worker's current device, if any), "
        "'cpu', 'cuda', 'cuda:N', 'npu' or 'npu:N'"
    )


def _import(module: str, device: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise _bad_device(device, f"needs {module}, which cannot be imported ({error})") from error


def _backend_if_initialised(torch: ModuleType, kind: str) -> ModuleType | None:
    backend = getattr(torch, kind, None)
    is_initialized = getattr(backend, "is_initialized", None)
    if backend is None or is_initialized is None:
        return None
    try:
        return backend if is_initialized() else None
    except Exception:  # a half-installed backend: treat the worker as host-only
        return None


def _resolve_device(device: str | None) -> _Device:
    if device is None:
        # Only a device this process already uses: asking torch for a "current device"
        # before that would initialise one as a side effect.
        torch = sys.modules.get("torch")
        if torch is None:
            return _CPU
        for kind in ("cuda", "npu"):
            backend = _backend_if_initialised(torch, kind)
            if backend is not None:
                return _Device(kind, int(backend.current_device()), backend)
        return _CPU
    if not isinstance(device, str):
        raise _bad_device(device, "is not a str (str(torch_device) gives one)")
    match = _DEVICE_RE.fullmatch(device)
    if match is None:
        raise _bad_device(device, "is not a device this reading knows")
    kind, index_text = match.group(1), match.group(2)
    if kind == "cpu":
        return _CPU
    torch = _import("torch", device)
    if kind == "npu":
        _import("torch_npu", device)  # registers torch.npu
    backend = getattr(torch, kind, None)
    if backend is None or not backend.is_available():
        raise _bad_device(device, f"asks for {kind}, but no {kind} device is available here")
    count = int(backend.device_count())
    index = int(backend.current_device()) if index_text is None else int(index_text)
    if index >= count:
        raise _bad_device(device, f"is out of range: this process sees {count} {kind} device(s)")
    return _Device(kind, index, backend)


def _distributed_rank() -> int | None:
    dist = initialised_dist()
    return None if dist is None else int(dist.get_rank())


def _host_memory_bytes(pid: int | None = None) -> tuple[int, int]:
    """(resident set, peak resident set) in bytes of this process, or of process ``pid``.

    Raises :class:`ProcessLookupError` when ``pid`` does not exist (or is a zombie, or a
    kernel thread: no resident set), :class:`PermissionError` when it may not be read."""
    if sys.platform.startswith("linux"):
        try:
            # os.read, not open(): a buffered file object costs more than the read.
            fd = os.open(f"/proc/{'self' if pid is None else pid}/status", os.O_RDONLY)
            try:
                text = os.read(fd, 65536)
            finally:
                os.close(fd)
        except FileNotFoundError:
            if pid is not None:
                raise ProcessLookupError(pid) from None
        except OSError:
            pass
        else:
            # VmRSS and VmHWM come from one snapshot, so peak >= current (the kernel
            # updates the high-water mark lazily); both are KiB. A zombie has neither.
            values = dict(_STATUS_RE.findall(text))
            if b"VmRSS" in values and b"VmHWM" in values:
                return int(values[b"VmRSS"]) * 1024, int(values[b"VmHWM"]) * 1024
            if pid is not None:
                raise ProcessLookupError(pid)
    import psutil

    try:
        info = psutil.Process(pid).memory_info()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(pid) from None
    except psutil.AccessDenied:
        raise PermissionError(pid) from None
    rss = int(info.rss)
    peak = getattr(info, "peak_wset", None)  # Windows
    if peak is None and pid is None:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is bytes on macOS and KiB on the other Unixes.
        peak = maxrss if sys.platform == "darwin" else maxrss * 1024
    # Another process's peak is unknown on macOS: its current set is all that is known.
    return rss, max(rss, int(peak or 0))


def process_memory_stats(pid: int, *, worker_id: str, rank: int | None = None) -> MemoryReading:
    """Read another process's host memory (an engine server, a worker this process
    started): resident set and its peak (Linux ``VmHWM``; elsewhere the peak is the
    current set, a lower bound), raw bytes, ``device`` ``"cpu"``.

    Raises:
        InvalidArgumentError: ``pid`` is not a running process, or an argument is
            malformed.
    """
    pid = plain_number(pid)  # type: ignore[assignment]
    if not is_integer(pid) or pid <= 0:
        raise InvalidArgumentError(f"pid must be a positive int, got {pid!r}")
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidArgumentError(f"worker_id must be a non-empty str, got {worker_id!r}")
    rank = _check_rank(rank)
    try:
        rss, peak_rss = _host_memory_bytes(pid)
    except ProcessLookupError:
        raise InvalidArgumentError(
            f"process {pid} (worker {worker_id!r}) is not running, or has no resident "
            "memory (a zombie, a kernel thread): read a live process's memory (has the "
            "worker exited?)"
        ) from None
    except PermissionError:
        raise InvalidArgumentError(
            f"process {pid} (worker {worker_id!r}): its memory may not be read by this "
            "user (another user's process, or /proc mounted hidepid): read it as its "
            "owner, or from inside that worker with memory_stats()"
        ) from None
    return MemoryReading(
        worker_id=worker_id,
        rank=rank,
        pid=pid,
        hostname=socket.gethostname(),
        device="cpu",
        host_rss_bytes=rss,
        host_peak_rss_bytes=peak_rss,
        device_allocated_bytes=None,
        device_allocated_peak_bytes=None,
        device_reserved_bytes=None,
        device_reserved_peak_bytes=None,
    )


def memory_stats(
    *,
    device: str | None = None,
    worker_id: str | None = None,
    rank: int | None = None,
    sync: bool = False,
) -> MemoryReading:
    """Read this worker's memory: raw integer bytes, nothing reset, nothing converted.

    Args:
        device: ``None`` reads the device this process already uses (CUDA or NPU, if
            torch is imported and the device initialised), else host only;
            ``"cpu"`` reads the host only; ``"cuda[:N]"`` / ``"npu[:N]"`` read that
            device (torch imported on demand).
        worker_id: identity of the worker; default ``f"{hostname}:{pid}"``.
        rank: the worker's rank; when ``torch.distributed`` is initialised its rank is
            used and a different ``rank`` is an error.
        sync: synchronise the device before reading (off by default: a reading must
            not change the timing it observes).

    Raises:
        InvalidArgumentError: an argument is malformed, or names a device that this
            process cannot read.
    """
    if not isinstance(sync, bool):
        raise InvalidArgumentError(f"sync must be True or False, got {sync!r}")
    if worker_id is not None and (not isinstance(worker_id, str) or not worker_id):
        raise InvalidArgumentError(
            f"worker_id must be a non-empty str or None, got {worker_id!r}; "
            "None gives 'hostname:pid'"
        )
    rank = _check_rank(rank)
    target = _resolve_device(device)
    dist_rank = _distributed_rank()
    if dist_rank is not None:
        if rank is not None and rank != dist_rank:
            raise InvalidArgumentError(
                f"rank={rank!r} differs from the torch.distributed rank {dist_rank}; "
                "omit rank to use the distributed one"
            )
        rank = dist_rank

    allocated = allocated_peak = reserved = reserved_peak = None
    backend = target.backend
    if backend is not None:
        if sync:
            backend.synchronize(target.index)
        allocated = int(backend.memory_allocated(target.index))
        allocated_peak = int(backend.max_memory_allocated(target.index))
        reserved = int(backend.memory_reserved(target.index))
        reserved_peak = int(backend.max_memory_reserved(target.index))
    rss, peak_rss = _host_memory_bytes()
    pid = os.getpid()
    hostname = socket.gethostname()
    return MemoryReading(
        worker_id=f"{hostname}:{pid}" if worker_id is None else worker_id,
        rank=rank,
        pid=pid,
        hostname=hostname,
        device=target.label,
        host_rss_bytes=rss,
        host_peak_rss_bytes=peak_rss,
        device_allocated_bytes=allocated,
        device_allocated_peak_bytes=allocated_peak,
        device_reserved_bytes=reserved,
        device_reserved_peak_bytes=reserved_peak,
    )
