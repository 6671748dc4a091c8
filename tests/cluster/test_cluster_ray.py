"""RayCluster: a real local 2-CPU cluster (session fixture) and a fake ray module."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from twinkle.cluster import (
    LOOPBACK_ENV,
    ClusterAdapter,
    RayCluster,
    RayNotInstalledError,
    check_loopback,
    init_ray,
)
from twinkle.errors import ConfigError


def test_the_local_test_cluster_binds_loopback_only(ray_cluster: Any) -> None:
    ray = ray_cluster
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    gcs = ray.get_runtime_context().gcs_address
    assert gcs.startswith("127.0.0.1:"), gcs
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    check_loopback(ray)  # the library's own check agrees


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

    class Rollout:
        def ping(self) -> int:
            return 1

    rollout = ray.remote(num_cpus=0)(Rollout)  # the actor class (Ray's types: Any)
    actors = [rollout.options(name=f"twinkle-test-rollout-{i}").remote() for i in range(2)]
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


def _recording_ray(node_ip: str, manager_ips: list[str]) -> tuple[types.ModuleType, list[Any]]:
    calls: list[Any] = []
    ray = types.ModuleType("ray")
    ray.init = lambda **kw: calls.append(("init", kw))  # type: ignore[attr-defined]
    ray.shutdown = lambda: calls.append(("shutdown",))  # type: ignore[attr-defined]
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: node_ip)  # type: ignore[attr-defined]
    ray.nodes = lambda: [  # type: ignore[attr-defined]
        {"NodeID": f"n{i}", "NodeManagerAddress": ip} for i, ip in enumerate(manager_ips)
    ]
    return ray, calls


@pytest.mark.parametrize("address", ["auto", "ray://head:10001", "10.0.0.1:6379"])
def test_an_explicit_cluster_address_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    ray, calls = _recording_ray("10.0.0.1", ["10.0.0.1"])
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    assert init_ray(address, num_cpus=4) is ray
    assert calls == [("init", {"address": address, "num_cpus": 4})]
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ


def test_sigterm_handled_by_the_caller_stays_so_after_ray_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ray.init sets SIGTERM to sys.exit(15) whatever handled it: inside
    finish_on_signals() a kill would then end the run as a SystemExit, not as the
    signal it is. The guard's handler is set back; a default one is left to Ray."""
    from twinkle.run import finish_on_signals

    def ray_exit(signum: int, frame: object) -> None:  # (what ray.init installs)
        sys.exit(signum)

    def init(**kw: Any) -> None:
        signal.signal(signal.SIGTERM, ray_exit)

    ray, _ = _recording_ray("10.0.0.1", ["10.0.0.1"])
    ray.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (an earlier real Ray's, maybe)
    try:
        with finish_on_signals() as guard:
            assert signal.SIGTERM in guard.handled
            handler = signal.getsignal(signal.SIGTERM)
            init_ray("auto")
            assert signal.getsignal(signal.SIGTERM) == handler
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        init_ray("auto")
        assert signal.getsignal(signal.SIGTERM) is ray_exit
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (Ray's unix sockets go below it)."""
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_local_cluster_off_loopback_is_refused_and_shut_down(
    monkeypatch: pytest.MonkeyPatch, short_dir: Path
) -> None:
    monkeypatch.setenv("TWINKLE_RUNTIME_DIR", str(short_dir))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    ray, calls = _recording_ray("127.0.0.1", ["127.0.0.1", "172.17.0.2"])
    ray_private = types.ModuleType("ray._private")
    constants = types.ModuleType("ray._private.ray_constants")
    constants.ENABLE_RAY_CLUSTER = True  # type: ignore[attr-defined]
    ray_private.ray_constants = constants  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray._private", ray_private)
    monkeypatch.setitem(sys.modules, "ray._private.ray_constants", constants)
    for key in LOOPBACK_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=r"not on loopback.*172\.17\.0\.2.*init_ray"):
        init_ray(num_cpus=2)
    # A local cluster's session directories go under twinkle's private runtime dir.
    temp = str(short_dir / "ray")
    assert calls == [
        ("init", {"address": "local", "num_cpus": 2, "_temp_dir": temp}),
        ("shutdown",),
    ]
    # the switch was set for the processes Ray starts and for the imported constant
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert constants.ENABLE_RAY_CLUSTER is False


def test_check_loopback_names_the_node_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    ray, _ = _recording_ray("10.1.2.3", ["127.0.0.1"])
    with pytest.raises(ConfigError, match=r"get_node_ip_address.*10\.1\.2\.3"):
        check_loopback(ray)
