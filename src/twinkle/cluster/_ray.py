"""``RayCluster``: resources of the Ray cluster this process is connected to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.cluster._resources import (
    ClusterResources,
    RayNotInstalledError,
    check_workers,
)
from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = ["RAY_DEVICE_TYPES", "RayCluster"]

#: Ray accelerator resource names -> torch device types.
RAY_DEVICE_TYPES = {"GPU": "cuda", "NPU": "npu", "HPU": "hpu", "TPU": "tpu"}
# Ray's bookkeeping entries, not resources a run schedules on.
_NOT_CUSTOM = ("CPU", "memory", "object_store_memory")
_NOT_CUSTOM_PREFIXES = ("node:", "accelerator_type:")


def import_ray() -> Any:
    """``ray``, or :class:`RayNotInstalledError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise RayNotInstalledError(
            "Ray is not installed; install the extra: pip install 'twinkle[ray]'"
        ) from exc
    return ray


class RayCluster:
    """The Ray cluster this process is connected to (``ray.init`` must have run).

    Nodes are the live nodes of ``ray.nodes()``; CPUs, devices (Ray's ``GPU`` is counted
    as ``cuda``, see :data:`RAY_DEVICE_TYPES`) and custom resources come from
    ``ray.cluster_resources()``.

    :param workers: ``{role: count}`` the caller knows.
    :param actor_roles: ``{role: name prefix}``: also count live named actors whose
        name starts with the prefix (e.g. ``{"rollout": "rollout-"}``), added to
        ``workers``.
    :param namespace: count named actors of this namespace only (default: all).
    """

    __slots__ = ("_actor_roles", "_namespace", "_workers")

    def __init__(
        self,
        *,
        workers: Mapping[str, int] | None = None,
        actor_roles: Mapping[str, str] | None = None,
        namespace: str | None = None,
    ) -> None:
        self._workers = check_workers(workers)
        roles = dict(actor_roles or {})
        for role, prefix in roles.items():
            if not isinstance(role, str) or not role or not isinstance(prefix, str) or not prefix:
                raise InvalidArgumentError(
                    f"actor_roles must map role names to non-empty actor name prefixes, got "
                    f"{role!r}: {prefix!r}"
                )
        self._actor_roles = roles
        self._namespace = namespace
        import_ray()  # fail at construction, where the fix is obvious

    def resources(self) -> ClusterResources:
        """Read the cluster's resources now."""
        ray = import_ray()
        if not ray.is_initialized():
            raise ConfigError(
                "Ray is not initialised in this process; call ray.init(address=...) first"
            )
        nodes = sum(1 for node in ray.nodes() if node.get("Alive", False))
        total: dict[str, float] = dict(ray.cluster_resources())
        devices: dict[str, int] = {}
        custom: dict[str, float] = {}
        for key, amount in total.items():
            if key in RAY_DEVICE_TYPES:
                devices[RAY_DEVICE_TYPES[key]] = int(amount)
            elif key not in _NOT_CUSTOM and not key.startswith(_NOT_CUSTOM_PREFIXES):
                custom[key] = float(amount)
        workers = dict(self._workers)
        if self._actor_roles:
            for role, count in self._count_actors(ray).items():
                workers[role] = workers.get(role, 0) + count
        return ClusterResources(
            nodes=nodes,
            cpus=int(total.get("CPU", 0)),
            devices={k: v for k, v in devices.items() if v > 0},
            workers=workers,
            custom=custom,
        )

    def _count_actors(self, ray: Any) -> dict[str, int]:
        from ray.util import list_named_actors

        counts = dict.fromkeys(self._actor_roles, 0)
        for entry in list_named_actors(all_namespaces=True):
            if self._namespace is not None and entry.get("namespace") != self._namespace:
                continue
            name = str(entry.get("name", ""))
            for role, prefix in self._actor_roles.items():
                if name.startswith(prefix):
                    counts[role] += 1
        return counts
