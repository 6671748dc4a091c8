"""``TorchDistributedCluster``: resources of an initialised ``torch.distributed`` group."""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any, cast

import orjson

from twinkle.cluster._local import local_cpus
from twinkle.cluster._resources import ClusterResources
from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = ["TorchDistributedCluster"]


def _collective_device(dist: Any, group: Any) -> Any:
    """The device a collective of ``group`` runs on (NCCL: the current CUDA device)."""
    import torch

    backend = str(dist.get_backend(group)).lower()
    if "gloo" not in backend and "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" not in backend and "hccl" in backend:
        return torch.device("npu", cast(Any, torch).npu.current_device())  # torch_npu
    return torch.device("cpu")


def _all_gather_json(dist: Any, group: Any, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``obj``, in rank order, as JSON bytes in uint8 tensors.

    Unlike ``all_gather_object`` this needs no numpy and unpickles nothing a peer sent.
    """
    import torch

    device = _collective_device(dist, group)
    world = dist.get_world_size(group)
    payload = orjson.dumps(obj)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8, device=device)
    buffers = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(buffers, padded, group=group)
    return [
        orjson.loads(bytes(buf[:n].cpu().tolist())) for buf, n in zip(buffers, lengths, strict=True)
    ]


def _default_device(dist: Any, group: Any) -> str:
    device = _collective_device(dist, group)
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index}"


class TorchDistributedCluster:
    """Every rank of a ``torch.distributed`` group describes itself; the counts are the
    union.

    :meth:`resources` is a collective (an all-gather of JSON bytes): every rank of
    ``group`` must call it (on NCCL with its CUDA device selected, as for any
    collective). Each rank contributes its hostname, CPU count, device and role:

    :param group: the process group (``None``: the default group).
    :param role: this rank's role; ``workers`` counts ranks per role.
    :param device: this rank's device (``"cuda:0"``, ``"cpu"``); default: the current
        CUDA device for an NCCL group with CUDA available, else ``"cpu"``. Devices are
        counted once per (host, device), so ranks sharing a GPU count it once; CPU ranks
        add no devices.
    """

    __slots__ = ("_device", "_group", "_role")

    def __init__(self, group: Any = None, *, role: str = "trainer", device: str | None = None):
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"role must be a non-empty string, got {role!r}")
        if device is not None and (not isinstance(device, str) or not device):
            raise InvalidArgumentError(
                f"device must be None or a device string such as 'cuda:0', got {device!r}"
            )
        self._group = group
        self._role = role
        self._device = device

    def resources(self) -> ClusterResources:
        """Gather every rank's description (collective) and count."""
        try:
            import torch.distributed as dist
        except ImportError as exc:
            raise ConfigError(
                "TorchDistributedCluster needs torch: pip install 'twinkle[torch]'"
            ) from exc
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "torch.distributed is not initialised; call "
                "torch.distributed.init_process_group(...) on every rank first, or use "
                "LocalCluster"
            )
        mine = {
            "host": socket.gethostname(),
            "cpus": local_cpus(),
            "device": self._device or _default_device(dist, self._group),
            "role": self._role,
        }
        gathered = _all_gather_json(dist, self._group, mine)
        cpus_by_host: dict[str, int] = {}
        devices: set[tuple[str, str]] = set()
        for info in gathered:
            host = str(info["host"])
            # Ranks of one host may be pinned to different CPU sets; the host has at
            # least the most any of them sees.
            cpus_by_host[host] = max(cpus_by_host.get(host, 0), int(info["cpus"]))
            device = str(info["device"])
            if device.split(":", 1)[0] != "cpu":
                devices.add((host, device))
        by_type = Counter(device.split(":", 1)[0] for _, device in devices)
        return ClusterResources(
            nodes=len(cpus_by_host),
            cpus=sum(cpus_by_host.values()),
            devices=dict(by_type),
            workers=dict(Counter(str(info["role"]) for info in gathered)),
        )
