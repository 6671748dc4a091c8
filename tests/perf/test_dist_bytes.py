"""Bytes over torch.distributed (two real gloo ranks on 127.0.0.1, in two processes):
``broadcast_bytes``, ``all_gather_bytes`` and ``gather_bytes`` (to rank 0 only), empty
payloads included, and
``gather_reports`` carrying each rank's WorkerReport to every rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

RANK = r"""
import os, sys
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
import torch.distributed as dist
from twinkle.errors import InvalidArgumentError
from twinkle.perf import WorkerRecorder, gather_reports
from twinkle.perf.dist import all_gather_bytes, broadcast_bytes, gather_bytes

rank, rendezvous = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
try:
    assert broadcast_bytes(dist, None, b"from rank 0" if rank == 0 else None) == b"from rank 0"
    assert broadcast_bytes(dist, None, b"" if rank == 0 else None) == b""
    assert all_gather_bytes(dist, None, b"x" * (rank * 3)) == [b"", b"xxx"]
    gathered = gather_bytes(dist, None, b"y" * (2 - rank))  # (rank 0's the longer)
    assert gathered == ([b"yy", b"y"] if rank == 0 else None)
    apart = dist.new_group(backend="gloo")  # (a group of its own, as the TRL ranks use)
    assert gather_bytes(dist, apart, b"z" * rank) == ([b"", b"z"] if rank == 0 else None)
    worker = WorkerRecorder(f"rank{rank}", rank=rank)
    with worker.span("train.step", iteration=rank):
        pass
    reports = gather_reports(worker.report())
    assert [r.worker for r in reports] == ["rank0", "rank1"]
    assert [r.spans[0].attrs["iteration"] for r in reports] == [0, 1]
    assert [r.readings[0].rank for r in reports] == [0, 1]
    if rank == 0:
        try:
            broadcast_bytes(dist, None, None)
        except InvalidArgumentError as exc:
            assert "must pass the payload" in str(exc)
        else:
            raise AssertionError("the source rank's None was not refused")
finally:
    dist.destroy_process_group()
print("ok")
"""


def test_two_ranks_exchange_bytes_and_reports(tmp_path: Path) -> None:
    rendezvous = str(tmp_path / "rendezvous")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), rendezvous],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for rank, proc in enumerate(ranks):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", f"rank {rank}: {err[-2000:]}"
