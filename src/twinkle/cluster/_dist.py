"""``TorchDistributedCluster``: resources of an initialised ``torch.distributed`` group."""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

from twinkle.cluster._local import local_cpus
from twinkle.cluster._resources import ClusterResources
from twinkle.errors import ConfigError, InvalidArgumentError
from twinkle.perf.dist import all_gather_json, collective_device

__all__ = ["TorchDistributedCluster"]


def _default_device(dist: Any, group: Any) -> str:
    device = collective_device(dist, group)
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
        gathered = all_gather_json(dist, self._group, mine)
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
