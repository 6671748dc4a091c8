"""``ClusterResources`` and the ``ClusterAdapter`` protocol every backend implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = ["ClusterAdapter", "ClusterResources", "RayNotInstalledError", "check_workers"]


class RayNotInstalledError(ConfigError, ImportError):
    """Ray was asked for but is not installed in this interpreter."""


def _count(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{where} must be an int >= 0, got {value!r}")
    return value


def _counts(where: str, mapping: object) -> dict[str, int]:
    if not isinstance(mapping, Mapping):
        raise InvalidArgumentError(
            f"{where} must be a mapping of names to counts, got {type(mapping).__name__}"
        )
    out: dict[str, int] = {}
    for key in sorted(mapping, key=str):
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"{where} keys must be non-empty strings, got {key!r}")
        out[key] = _count(f"{where}[{key!r}]", mapping[key])
    return out


def check_workers(workers: Mapping[str, int] | None) -> dict[str, int]:
    """A validated copy of a caller's ``{role: worker count}`` mapping."""
    return {} if workers is None else _counts("workers", workers)


@dataclass(frozen=True, slots=True)
class ClusterResources:
    """What a run has to work with.

    ``nodes``: machines; ``cpus``: logical CPUs over all nodes; ``devices``: accelerators
    by torch device type (``{"cuda": 8}``; CPUs are not devices); ``workers``: workers per
    caller-defined role (``{"rollout": 4, "trainer": 8}``); ``custom``: a scheduler's
    other resources (Ray custom resources), as reported. Mappings are copied with sorted
    keys, so equal resources compare and serialise equal.
    """

    nodes: int
    cpus: int
    devices: dict[str, int]
    workers: dict[str, int]
    custom: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _count("nodes", self.nodes)
        _count("cpus", self.cpus)
        object.__setattr__(self, "devices", _counts("devices", self.devices))
        object.__setattr__(self, "workers", _counts("workers", self.workers))
        if not isinstance(self.custom, Mapping):
            raise InvalidArgumentError(
                f"custom must be a mapping of resource names to amounts, got {self.custom!r}"
            )
        custom: dict[str, float] = {}
        for key in sorted(self.custom):
            value = self.custom[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidArgumentError(f"custom[{key!r}] must be a number >= 0, got {value!r}")
            custom[key] = float(value)
        object.__setattr__(self, "custom", custom)

    def device_count(self, kind: str | None = None) -> int:
        """Accelerators of ``kind`` (``"cuda"``, ``"npu"``...), or of every kind when
        ``None``: the physical device budget to divide throughput by. ``0`` means none
        (a CPU-only run): choosing a denominator then is the caller's decision."""
        if kind is None:
            return sum(self.devices.values())
        if not isinstance(kind, str) or not kind:
            raise InvalidArgumentError(
                f"kind must be a device type such as 'cuda' or None, got {kind!r}"
            )
        return self.devices.get(kind, 0)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (e.g. for a run's configuration)."""
        return {
            "nodes": self.nodes,
            "cpus": self.cpus,
            "devices": dict(self.devices),
            "workers": dict(self.workers),
            "custom": dict(self.custom),
        }


@runtime_checkable
class ClusterAdapter(Protocol):
    """Counts the resources of one kind of cluster (local machine, torch.distributed, Ray)."""

    def resources(self) -> ClusterResources:
        """Read the resources now (may be a collective call: see the implementation)."""
        ...
