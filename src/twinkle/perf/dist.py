"""Small ``torch.distributed`` helpers shared by the layers above (memory readings,
cluster resources). torch is imported inside the functions, never at import."""

from __future__ import annotations

import sys
from typing import Any, cast

import orjson

from twinkle.errors import InvalidArgumentError

__all__ = [
    "all_gather_bytes",
    "all_gather_json",
    "broadcast_bytes",
    "collective_device",
    "gather_bytes",
    "initialised_dist",
]


def initialised_dist() -> Any:
    """``torch.distributed`` when a process group is initialised, else None. An
    initialised group means torch is imported already: torch is never imported here
    just to find out there is none."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def collective_device(dist: Any, group: Any) -> Any:
    """The device a collective of ``group`` runs on (NCCL: the current CUDA device,
    HCCL: the current NPU, else the CPU)."""
    import torch

    backend = str(dist.get_backend(group)).lower()
    if "gloo" not in backend and "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" not in backend and "hccl" in backend:
        return torch.device("npu", cast(Any, torch).npu.current_device())  # torch_npu
    return torch.device("cpu")


def all_gather_json(dist: Any, group: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (JSON-able), in rank order: a collective every rank of
    ``group`` must call.

    The objects travel as JSON bytes in uint8 tensors (:func:`all_gather_bytes`): unlike
    ``all_gather_object`` this needs no numpy and unpickles nothing a peer sent.
    """
    return [orjson.loads(b) for b in all_gather_bytes(dist, group, orjson.dumps(obj))]


def all_gather_bytes(dist: Any, group: Any, payload: bytes) -> list[bytes]:
    """Every rank's ``payload``, in rank order (a collective): the sizes first, then the
    payloads padded to the longest, in uint8 tensors."""
    import torch

    lengths, padded = _padded(dist, group, payload)
    buffers = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(buffers, padded, group=group)
    return [_to_bytes(buf[:n]) for buf, n in zip(buffers, lengths, strict=True)]


def gather_bytes(dist: Any, group: Any, payload: bytes, *, dst: int = 0) -> list[bytes] | None:
    """Every rank's ``payload`` on rank ``dst`` of ``group``, in rank order (None on the
    other ranks; a collective): the sizes to every rank, then the payloads, padded to
    the longest, to ``dst`` only."""
    import torch

    lengths, padded = _padded(dist, group, payload)
    mine = dist.get_rank(group) == dst
    buffers = [torch.empty_like(padded) for _ in lengths] if mine else None
    root = dst if group is None else dist.get_global_rank(group, dst)
    dist.gather(padded, gather_list=buffers, dst=root, group=group)
    if buffers is None:
        return None
    return [_to_bytes(buf[:n]) for buf, n in zip(buffers, lengths, strict=True)]


def _padded(dist: Any, group: Any, payload: bytes) -> tuple[list[int], Any]:
    """Every rank's payload size (a collective), and ``payload`` in a uint8 tensor as
    long as the longest, on the group's collective device."""
    import torch

    device = collective_device(dist, group)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    if payload:
        padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    return lengths, padded


def broadcast_bytes(dist: Any, group: Any, payload: bytes | None, *, src: int = 0) -> bytes:
    """``payload`` of rank ``src``, on every rank of ``group`` (a collective; the other
    ranks pass None): its size first, then the bytes in a uint8 tensor."""
    import torch

    device = collective_device(dist, group)
    mine = dist.get_rank(group) == src
    if mine and payload is None:
        raise InvalidArgumentError(
            f"broadcast_bytes: rank {src} is the source and must pass the payload (bytes), got None"
        )
    length = len(payload) if mine and payload is not None else 0
    size = torch.tensor([length], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    n = int(size.item())
    buffer = torch.empty(n, dtype=torch.uint8, device=device)
    if mine and payload:
        buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device))
    if n:
        dist.broadcast(buffer, src=src, group=group)
    return payload if mine and payload is not None else _to_bytes(buffer)


def _to_bytes(tensor: Any) -> bytes:
    """A uint8 tensor's bytes (through a Python list: no numpy needed)."""
    return bytes(tensor.cpu().tolist())
