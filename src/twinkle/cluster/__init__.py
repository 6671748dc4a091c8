"""Flow: resource counts of the cluster a run uses.

A :class:`ClusterAdapter` returns :class:`ClusterResources` (nodes, CPUs, devices by
type, workers per role) from the local machine (:class:`LocalCluster`), an initialised
``torch.distributed`` group (:class:`TorchDistributedCluster`) or a Ray cluster
(:class:`RayCluster`, extra ``twinkle[ray]``). torch and ray are imported lazily.
``ClusterResources.device_count()`` is the throughput denominator.
"""

from twinkle.cluster._dist import TorchDistributedCluster
from twinkle.cluster._local import LocalCluster, local_cpus, torch_device_counts
from twinkle.cluster._ray import RAY_DEVICE_TYPES, RayCluster
from twinkle.cluster._resources import ClusterAdapter, ClusterResources, RayNotInstalledError

__all__ = [
    "RAY_DEVICE_TYPES",
    "ClusterAdapter",
    "ClusterResources",
    "LocalCluster",
    "RayCluster",
    "RayNotInstalledError",
    "TorchDistributedCluster",
    "local_cpus",
    "torch_device_counts",
]
