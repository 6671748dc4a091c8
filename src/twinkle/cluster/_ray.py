"""Ray: :func:`init_ray` (a local cluster on 127.0.0.1 only) and ``RayCluster``, the
resources of the Ray cluster this process is connected to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from twinkle.cluster._resources import (
    ClusterResources,
    RayNotInstalledError,
    check_workers,
)
from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = [
    "LOOPBACK_ENV",
    "RAY_DEVICE_TYPES",
    "RayCluster",
    "check_loopback",
    "import_ray",
    "init_ray",
]

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


LOOPBACK = "127.0.0.1"
#: Ray's own switch: false makes a local cluster bind and advertise the loopback address.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def init_ray(address: str | None = None, **init_kwargs: Any) -> Any:
    """Start (or join) Ray for this process; returns the ``ray`` module.

    ``address`` ``None`` or ``"local"`` starts a **local cluster bound to 127.0.0.1
    only**. Ray does not honour ``_node_ip_address="127.0.0.1"`` for a local cluster:
    the node, its raylet and the GCS still bind and advertise the host's network
    interface. Ray's own switch does it: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    (``ray_constants.ENABLE_RAY_CLUSTER`` false) a local node uses the loopback
    address. The variable is set in ``os.environ`` before ``ray.init`` (the processes
    Ray starts inherit it and read it at import), and the constant of an
    already-imported ``ray`` is set to match, so the order of imports does not matter.
    The cluster that comes up is checked: :class:`~twinkle.errors.ConfigError` if the
    node or any node's ``NodeManagerAddress`` is not 127.0.0.1 (it is shut down first).

    Any other ``address`` (``"auto"``, ``"ray://host:10001"``, ``"10.0.0.1:6379"``) is
    a cluster the caller chose: ``ray.init(address=address, **init_kwargs)`` runs
    unchanged and the environment is left alone.
    """
    ray = import_ray()
    if address not in (None, "local"):
        ray.init(address=address, **init_kwargs)
        return ray
    os.environ.update(LOOPBACK_ENV)
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(address="local", **init_kwargs)
    try:
        check_loopback(ray)
    except BaseException:
        ray.shutdown()
        raise
    return ray


def check_loopback(ray: Any) -> None:
    """:class:`~twinkle.errors.ConfigError` unless this process's Ray node and every
    node of the cluster are on 127.0.0.1."""
    addresses = {"ray.util.get_node_ip_address()": ray.util.get_node_ip_address()}
    for node in ray.nodes():
        addresses[f"node {node.get('NodeID', '?')} NodeManagerAddress"] = node.get(
            "NodeManagerAddress"
        )
    wrong = {where: ip for where, ip in addresses.items() if ip != LOOPBACK}
    if wrong:
        raise ConfigError(
            f"the local Ray cluster is not on loopback only: {wrong}; a local cluster must "
            f"bind {LOOPBACK} (test and demo traffic stays on this machine). Start it with "
            "twinkle.cluster.init_ray(), which sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
            "before ray.init, or set that variable in the environment before importing ray"
        )


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
