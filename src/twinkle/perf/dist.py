"""Small ``torch.distributed`` helpers shared by the layers above (memory readings,
cluster resources). torch is imported inside the functions, never at import."""

from __future__ import annotations

from typing import Any, cast

import orjson

__all__ = ["all_gather_json", "collective_device"]


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

    The objects travel as JSON bytes in uint8 tensors: unlike ``all_gather_object`` this
    needs no numpy and unpickles nothing a peer sent.
    """
    import torch

    device = collective_device(dist, group)
    world = dist.get_world_size(group)
    payload = orjson.dumps(obj)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8, device=device)
    buffers = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(buffers, padded, group=group)
    return [
        orjson.loads(bytes(buf[:n].cpu().tolist())) for buf, n in zip(buffers, lengths, strict=True)
    ]
