"""ClusterResources and LocalCluster: counts of this machine, torch devices on request."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types

import pytest

from twinkle.cluster import ClusterAdapter, ClusterResources, LocalCluster, local_cpus
from twinkle.errors import ConfigError, InvalidArgumentError


def fake_torch(cuda: int = 0, mps: bool = False) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: cuda > 0, device_count=lambda: cuda
    )
    torch.backends = types.SimpleNamespace(  # type: ignore[attr-defined]
        mps=types.SimpleNamespace(is_available=lambda: mps)
    )
    return torch


def test_local_counts_cpus_of_this_process_and_no_devices_without_torch() -> None:
    res = LocalCluster(torch=False, workers={"trainer": 1, "rollout": 2}).resources()
    expected_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert res.nodes == 1
    assert res.cpus == local_cpus() >= 1
    if expected_cpus is not None:
        assert res.cpus == expected_cpus
    assert res.devices == {}
    assert res.workers == {"rollout": 2, "trainer": 1}
    assert list(res.workers) == ["rollout", "trainer"]  # sorted
    assert res.device_count() == 0
    assert isinstance(LocalCluster(), ClusterAdapter)


def test_local_does_not_import_torch_unless_asked() -> None:
    code = (
        "import sys; from twinkle.cluster import LocalCluster; "
        "r = LocalCluster().resources(); print('torch' in sys.modules, r.devices)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "{}"]


def test_local_counts_cuda_devices_of_an_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda=4))
    res = LocalCluster().resources()
    assert res.devices == {"cuda": 4}
    assert res.device_count() == res.device_count("cuda") == 4
    assert res.device_count("npu") == 0
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda=0, mps=True))
    assert LocalCluster(torch=True).resources().devices == {"mps": 1}
    assert LocalCluster(torch=False).resources().devices == {}


def test_local_with_real_torch_matches_torch_cuda() -> None:
    torch = pytest.importorskip("torch")
    res = LocalCluster(torch=True).resources()
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert res.devices.get("cuda", 0) == expected


def test_torch_requested_but_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match=r"pip install 'twinkle\[torch\]'"):
        LocalCluster(torch=True).resources()


def test_resources_are_frozen_validated_and_serialisable() -> None:
    res = ClusterResources(nodes=2, cpus=64, devices={"npu": 2, "cuda": 8}, workers={"trainer": 8})
    assert res.device_count() == 10
    assert res.to_dict() == {
        "nodes": 2,
        "cpus": 64,
        "devices": {"cuda": 8, "npu": 2},
        "workers": {"trainer": 8},
        "custom": {},
    }
    assert res == ClusterResources(2, 64, {"cuda": 8, "npu": 2}, {"trainer": 8})
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.nodes = 3  # type: ignore[misc]
    bad: list[tuple[dict[str, object], str]] = [
        ({"nodes": -1}, "nodes"),
        ({"cpus": 1.5}, "cpus"),
        ({"devices": {"cuda": -1}}, r"devices\['cuda'\]"),
        ({"workers": {"": 1}}, "workers keys"),
        ({"workers": [1]}, "workers must be a mapping"),
        ({"custom": {"slot": -1}}, r"custom\['slot'\]"),
    ]
    for kwargs, match in bad:
        args = {"nodes": 1, "cpus": 1, "devices": {}, "workers": {}, **kwargs}
        with pytest.raises(InvalidArgumentError, match=match):
            ClusterResources(**args)  # type: ignore[arg-type]  # the bad values are the point
    with pytest.raises(InvalidArgumentError, match="kind"):
        res.device_count("")


def test_local_cluster_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="torch"):
        LocalCluster(torch="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"workers\['rollout'\]"):
        LocalCluster(workers={"rollout": -2})
