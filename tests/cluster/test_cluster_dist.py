"""TorchDistributedCluster over two gloo ranks on CPU (spawned processes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from twinkle.cluster import LocalCluster, TorchDistributedCluster
from twinkle.errors import ConfigError, InvalidArgumentError

torch = pytest.importorskip("torch")


def _rank_main(rank: int, tmp: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2)
    try:
        by_role = TorchDistributedCluster(role="rollout" if rank == 0 else "trainer")
        declared = TorchDistributedCluster(device=f"cuda:{rank}")
        shared = TorchDistributedCluster(device="cuda:0")
        out = {
            "by_role": by_role.resources().to_dict(),
            "declared": declared.resources().to_dict(),
            "shared": shared.resources().to_dict(),
        }
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_count_one_node_and_their_roles(tmp_path: Path) -> None:
    from torch.multiprocessing.spawn import spawn as untyped_spawn

    spawn = cast("Callable[..., None]", untyped_spawn)  # torch leaves it unannotated
    spawn(_rank_main, args=(str(tmp_path),), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]  # every rank sees the same counts
    got = results[0]
    cpus = LocalCluster(torch=False).resources().cpus
    assert got["by_role"] == {
        "nodes": 1,
        "cpus": cpus,
        "devices": {},  # gloo ranks on CPU hold no accelerator
        "workers": {"rollout": 1, "trainer": 1},
        "custom": {},
    }
    assert got["declared"]["devices"] == {"cuda": 2}
    assert got["declared"]["workers"] == {"trainer": 2}
    assert got["shared"]["devices"] == {"cuda": 1}  # one device shared by two ranks


def test_uninitialised_group_says_how_to_fix() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this test process")
    with pytest.raises(ConfigError, match="init_process_group"):
        TorchDistributedCluster().resources()


def test_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="role"):
        TorchDistributedCluster(role="")
    with pytest.raises(InvalidArgumentError, match="device"):
        TorchDistributedCluster(device="")
