"""Flow: resource counts of the cluster a run uses.

A :class:`ClusterAdapter` returns :class:`ClusterResources` (nodes, CPUs, devices by
type, workers per role) from the local machine (:class:`LocalCluster`), an initialised
``torch.distributed`` group (:class:`TorchDistributedCluster`) or a Ray cluster
(:class:`RayCluster`, extra ``twinkle[ray]``). torch and ray are imported lazily.

Ray: :func:`init_ray` starts a local cluster bound to 127.0.0.1 only. Ray ignores
``_node_ip_address="127.0.0.1"`` for a local cluster and binds the host's network
interface; its switch ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set in the environment
before ``ray.init``, keeps the node, raylet and GCS on loopback, and :func:`init_ray`
checks that they are. An explicit cluster address is passed to ``ray.init`` untouched.
``ClusterResources.device_count()`` is the throughput denominator.
"""

from twinkle.cluster._dist import TorchDistributedCluster
from twinkle.cluster._local import LocalCluster, local_cpus, torch_device_counts
from twinkle.cluster._ray import (
    LOOPBACK_ENV,
    RAY_DEVICE_TYPES,
    RayCluster,
    check_loopback,
    import_ray,
    init_ray,
)
from twinkle.cluster._resources import ClusterAdapter, ClusterResources, RayNotInstalledError

__all__ = [
    "LOOPBACK_ENV",
    "RAY_DEVICE_TYPES",
    "ClusterAdapter",
    "ClusterResources",
    "LocalCluster",
    "RayCluster",
    "RayNotInstalledError",
    "TorchDistributedCluster",
    "check_loopback",
    "import_ray",
    "init_ray",
    "local_cpus",
    "torch_device_counts",
]
