"""A device's peak FLOP rate measured with a timed matrix product, for a device no
datasheet covers (a CPU): only when asked, and labelled as measured (docs/metrics.md,
"Model FLOPs utilisation")."""

from __future__ import annotations

import time
from typing import Any

from twinkle.errors import InvalidArgumentError

__all__ = ["measure_peak_flops"]


def measure_peak_flops(
    dtype: str = "float32", device: str = "cpu", *, size: int = 512, repeats: int = 5
) -> tuple[float, str]:
    """The best FLOP rate of ``repeats`` timed products of two ``size`` x ``size``
    matrices of ``dtype`` on ``device`` (after one untimed), and a label saying so: a
    measured rate, what this process's threads reach, not a datasheet's peak."""
    import torch

    kind = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
        raise InvalidArgumentError(f"dtype must name a torch floating-point type, got {dtype!r}")
    if type(size) is not int or size < 16 or type(repeats) is not int or repeats < 1:
        raise InvalidArgumentError(
            f"size must be an int >= 16 and repeats an int >= 1, got {size!r} and {repeats!r}"
        )
    a = torch.randn(size, size, dtype=kind, device=device)
    b = torch.randn(size, size, dtype=kind, device=device)
    sync: Any = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    torch.matmul(a, b)
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    rate = 2 * size**3 / best
    threads = torch.get_num_threads()
    label = (
        f"measured: best of {repeats} torch.matmul of {size}x{size} {kind} on {device} "
        f"({threads} thread(s)); not a datasheet peak"
    )
    return rate, label
