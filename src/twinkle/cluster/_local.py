"""``LocalCluster``: this machine's CPUs and torch devices."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from twinkle.cluster._resources import ClusterResources, check_workers
from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = ["LocalCluster", "local_cpus", "torch_device_counts"]


def local_cpus() -> int:
    """Logical CPUs this process may run on (its affinity where the OS has one, which is
    what a container or ``taskset`` grants), else the machine's logical CPU count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        pass
    try:
        import psutil

        count = psutil.cpu_count(logical=True)
    except Exception:  # pragma: no cover - psutil cannot read the machine
        count = None
    return int(count or os.cpu_count() or 1)


def _optional_count(module: Any, name: str) -> int:
    backend = getattr(module, name, None)
    if backend is None:
        return 0
    try:
        if not backend.is_available():
            return 0
        return int(backend.device_count())
    except Exception:  # a half-installed vendor extension: report no such devices
        return 0


def torch_device_counts(torch: bool | None = None) -> dict[str, int]:
    """Accelerators visible to torch on this machine, by device type (zeros left out).

    ``torch=None`` counts only if torch is already imported (counting never pays torch's
    import time by surprise); ``True`` imports it; ``False`` counts nothing.
    """
    if torch is False or (torch is None and "torch" not in sys.modules):
        return {}
    try:
        import torch as torch_module
    except ImportError as exc:
        raise ConfigError(
            "torch devices were requested but torch is not installed: "
            "pip install 'twinkle[torch]', or pass torch=False"
        ) from exc
    counts: dict[str, int] = {}
    if torch_module.cuda.is_available():
        counts["cuda"] = int(torch_module.cuda.device_count())
    for kind in ("xpu", "npu"):
        counts[kind] = _optional_count(torch_module, kind)
    mps = getattr(torch_module.backends, "mps", None)
    if mps is not None and mps.is_available():
        counts["mps"] = 1
    return {kind: n for kind, n in counts.items() if n > 0}


class LocalCluster:
    """The local machine: one node, its CPUs, and its torch devices.

    :param torch: count torch devices — ``None`` (default) only when torch is already
        imported, ``True`` always (imports torch), ``False`` never.
    :param workers: ``{role: count}`` of the workers the caller runs here.
    """

    __slots__ = ("_torch", "_workers")

    def __init__(self, *, torch: bool | None = None, workers: Mapping[str, int] | None = None):
        if torch is not None and not isinstance(torch, bool):
            raise InvalidArgumentError(f"torch must be None, True or False, got {torch!r}")
        self._torch = torch
        self._workers = check_workers(workers)

    def resources(self) -> ClusterResources:
        """Read the CPU and device counts now."""
        return ClusterResources(
            nodes=1,
            cpus=local_cpus(),
            devices=torch_device_counts(self._torch),
            workers=dict(self._workers),
        )
