"""Devices' peak FLOP rates, dense, by the name a device reports and the data type
(docs/metrics.md, "Device peaks").

Every figure is its vendor's datasheet figure *without* structured sparsity (NVIDIA's
tables mark the sparse figures with an asterisk, twice the dense rate: 1,979 "BF16
TFLOPS" for an H100 SXM is 989.5 dense; where a datasheet prints the dense figure too,
that one). A name the table does not know gets
no peak and a reason, never a guess: MFU is then not reported (pass the peak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DTYPES", "Peak", "device_peak"]

#: the data types the table has rates for: the tensor cores' (float32 is the CUDA
#: cores' rate, tf32 the tensor cores' for float32 matmuls)
DTYPES = ("float8", "bfloat16", "float16", "tf32", "float32")
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
            "float": "float32", "fp8": "float8", "float8_e4m3fn": "float8",
            "float8_e5m2": "float8", "float8_e4m3fnuz": "float8",
            "float8_e5m2fnuz": "float8"}  # fmt: skip

_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (datasheet)"
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (datasheet)"
_NVIDIA_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NVIDIA_L40S = "https://www.nvidia.com/en-us/data-center/l40s/ (datasheet)"
_NVIDIA_HGX = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, 8 GPUs: / 8)"
_NVIDIA_GB200 = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (NVL72: / 72)"
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"

T = 10**12


def _rates(float8: float | None, bf16: float, tf32: float, float32: float) -> dict[str, float]:
    """Dense rates (FLOP/s) from TFLOPS; bfloat16 and float16 share theirs."""
    rates = {"bfloat16": bf16 * T, "float16": bf16 * T, "tf32": tf32 * T, "float32": float32 * T}
    return rates if float8 is None else {"float8": float8 * T, **rates}


# Hopper's and Blackwell's datasheets print the sparse tensor-core figures only: their
# halves. A100's, L40S's and MI300X's print the dense ones too: those.
_HOPPER_SXM = _rates(3958 / 2, 1979 / 2, 989 / 2, 67)
_HOPPER_NVL = _rates(3341 / 2, 1671 / 2, 835 / 2, 60)

#: (device, a pattern its reported name matches, in this order, rates, source)
_TABLE: tuple[tuple[str, str, dict[str, float], str], ...] = (
    ("NVIDIA H200 NVL", r"\bh200\b.*\bnvl\b", _HOPPER_NVL, _NVIDIA_H200),
    ("NVIDIA H200 SXM", r"\bh200\b", _HOPPER_SXM, _NVIDIA_H200),
    ("NVIDIA H100 NVL", r"\bh100\b.*\bnvl\b", _HOPPER_NVL, _NVIDIA_H100),
    (
        "NVIDIA H100 PCIe",
        r"\bh100\b.*\bpcie\b",
        _rates(3026 / 2, 1513 / 2, 756 / 2, 51),
        _NVIDIA_H100,
    ),
    # (an SXM H100 reports its memory: "NVIDIA H100 80GB HBM3")
    ("NVIDIA H100 SXM", r"\bh100\b", _HOPPER_SXM, _NVIDIA_H100),
    # SXM4 and PCIe, 40 and 80 GB: one rate
    ("NVIDIA A100", r"\ba100\b", _rates(None, 312, 156, 19.5), _NVIDIA_A100),
    ("NVIDIA L40S", r"\bl40s\b", _rates(733, 362.05, 183, 91.6), _NVIDIA_L40S),
    ("NVIDIA GB200", r"\bgb200\b", _rates(10_000 / 2, 5_000 / 2, 2_500 / 2, 80), _NVIDIA_GB200),
    ("NVIDIA B200", r"\bb200\b", _rates(9_000 / 2, 4_500 / 2, 2_250 / 2, 75), _NVIDIA_HGX),
    ("AMD Instinct MI300X", r"\bmi300x\b", _rates(2614.9, 1307.4, 653.7, 163.4), _AMD_MI300X),
)


@dataclass(frozen=True, slots=True)
class Peak:
    """A device's dense peak for a data type: ``flops_per_s``, or None with ``reason``
    saying why there is none; ``device`` is the table's name for it, ``source`` where
    the figure comes from (None with no figure)."""

    reported_name: str
    dtype: str
    flops_per_s: float | None
    device: str | None = None
    source: str | None = None
    reason: str | None = None


def _normal(name: str) -> str:
    return " ".join(re.sub(r"[-_/]", " ", name.lower()).split())


def device_peak(reported_name: str, dtype: str) -> Peak:
    """The dense peak of the device that reports ``reported_name`` (as
    ``torch.cuda.get_device_name`` gives it) for ``dtype`` (``bfloat16``, ``torch.float16``,
    ``tf32``...)."""
    kind = str(dtype).removeprefix("torch.")
    kind = _ALIASES.get(kind, kind)
    name = _normal(reported_name)
    if re.search(r"\bmig\b", name):
        return Peak(
            reported_name,
            kind,
            None,
            reason=(
                f"{reported_name!r} is a MIG slice: a fraction of the device's compute "
                "that its name does not say; pass the slice's peak"
            ),
        )
    for device, pattern, rates, source in _TABLE:
        if re.search(pattern, name):
            rate = rates.get(kind)
            if rate is None:
                return Peak(
                    reported_name,
                    kind,
                    None,
                    device,
                    reason=f"{device} has no {kind} rate in its datasheet ({source}: it "
                    f"has {', '.join(rates)}); pass the peak",
                )
            return Peak(reported_name, kind, rate, device, source)
    return Peak(
        reported_name,
        kind,
        None,
        reason=(
            f"device {reported_name!r} is not in twinkle's table of peaks (H100, H200, "
            "A100, L40S, B200, GB200, MI300X); pass its dense peak (peak_flops=), from "
            "its datasheet without sparsity"
        ),
    )
