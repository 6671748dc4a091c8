"""RayCluster: a real local 2-CPU cluster (session fixture) and a fake ray module."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from twinkle.cluster import ClusterAdapter, RayCluster, RayNotInstalledError
from twinkle.errors import ConfigError


def test_counts_of_the_local_test_cluster(ray_cluster: Any) -> None:
    cluster = RayCluster(workers={"trainer": 1})
    assert isinstance(cluster, ClusterAdapter)
    res = cluster.resources()
    assert res.nodes == 1
    assert res.cpus == 2
    assert res.devices == {}
    assert res.custom == {"twinkle_test_slot": 3.0}
    assert res.workers == {"trainer": 1}


def test_workers_from_named_actors(ray_cluster: Any) -> None:
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Rollout:
        def ping(self) -> int:
            return 1

    actors = [Rollout.options(name=f"twinkle-test-rollout-{i}").remote() for i in range(2)]
    try:
        ray.get([a.ping.remote() for a in actors], timeout=60)
        res = RayCluster(
            workers={"rollout": 1, "trainer": 1},
            actor_roles={"rollout": "twinkle-test-rollout-", "reward": "twinkle-test-reward-"},
        ).resources()
        assert res.workers == {"reward": 0, "rollout": 3, "trainer": 1}
        wrong_namespace = RayCluster(
            actor_roles={"rollout": "twinkle-test-rollout-"}, namespace="not-this-one"
        ).resources()
        assert wrong_namespace.workers == {"rollout": 0}
    finally:
        for a in actors:
            ray.kill(a)


def fake_ray(initialised: bool = True) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: initialised  # type: ignore[attr-defined]
    ray.nodes = lambda: [{"Alive": True}, {"Alive": True}, {"Alive": False}]  # type: ignore[attr-defined]
    ray.cluster_resources = lambda: {  # type: ignore[attr-defined]
        "CPU": 192.0,
        "GPU": 16.0,
        "memory": 1e12,
        "object_store_memory": 1e11,
        "node:10.0.0.1": 1.0,
        "node:__internal_head__": 1.0,
        "accelerator_type:H100": 2.0,
        "engine_slot": 4.0,
    }
    return ray


def test_gpus_become_cuda_devices_and_bookkeeping_is_not_custom(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", fake_ray())
    res = RayCluster().resources()
    assert (res.nodes, res.cpus) == (2, 192)  # dead nodes are not counted
    assert res.devices == {"cuda": 16}
    assert res.device_count() == 16
    assert res.custom == {"engine_slot": 4.0}


def test_uninitialised_ray_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", fake_ray(initialised=False))
    with pytest.raises(ConfigError, match=r"ray.init"):
        RayCluster().resources()


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RayNotInstalledError, match=r"pip install 'twinkle\[ray\]'") as info:
        RayCluster()
    assert isinstance(info.value, ImportError)
