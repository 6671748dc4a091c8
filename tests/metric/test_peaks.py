"""Device peaks: the names devices report, dense rates, and no peak (with why) rather
than a guess."""

from __future__ import annotations

import pytest

from twinkle.metric.peaks import device_peak

T = 10**12


@pytest.mark.parametrize(
    ("reported", "dtype", "device", "tflops"),
    [
        # as torch.cuda.get_device_name() gives them
        ("NVIDIA H100 80GB HBM3", "bfloat16", "NVIDIA H100 SXM", 989.5),
        ("NVIDIA H100 PCIe", "torch.bfloat16", "NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "bf16", "NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", "bfloat16", "NVIDIA H200 SXM", 989.5),
        ("NVIDIA H200 NVL", "bfloat16", "NVIDIA H200 NVL", 835.5),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", "NVIDIA A100", 312),
        ("NVIDIA A100-SXM4-40GB", "float16", "NVIDIA A100", 312),
        ("NVIDIA A100-PCIE-40GB", "tf32", "NVIDIA A100", 156),
        ("NVIDIA A100 80GB PCIe", "float32", "NVIDIA A100", 19.5),
        ("NVIDIA L40S", "bfloat16", "NVIDIA L40S", 362.05),
        ("NVIDIA B200", "bfloat16", "NVIDIA B200", 2250),
        ("NVIDIA GB200", "bfloat16", "NVIDIA GB200", 2500),
        ("AMD Instinct MI300X", "bfloat16", "AMD Instinct MI300X", 1307.4),
        ("NVIDIA H100 80GB HBM3", "float8_e4m3fn", "NVIDIA H100 SXM", 1979),
        ("AMD Instinct MI300X", "torch.float8_e4m3fnuz", "AMD Instinct MI300X", 2614.9),
        ("NVIDIA H100 94GB NVL", "bfloat16", "NVIDIA H100 NVL", 835.5),
    ],
)
def test_reported_names_get_their_dense_peak_and_its_source(
    reported: str, dtype: str, device: str, tflops: float
) -> None:
    peak = device_peak(reported, dtype)
    assert peak.device == device
    assert peak.flops_per_s == pytest.approx(tflops * T)
    assert peak.source and peak.source.startswith("https://")
    assert peak.reason is None


def test_the_sparse_datasheet_figure_is_never_the_peak() -> None:
    """An H100 SXM's datasheet says 1,979 BF16 TFLOPS: with 2:4 sparsity. Dense: half."""
    assert device_peak("NVIDIA H100 80GB HBM3", "bfloat16").flops_per_s == 1979 / 2 * T


@pytest.mark.parametrize(
    ("reported", "dtype", "why"),
    [
        ("NVIDIA GeForce RTX 4090", "bfloat16", "'NVIDIA GeForce RTX 4090' is not in"),
        ("cpu", "float32", "'cpu' is not in twinkle's table"),
        ("NVIDIA A100-SXM4-80GB", "float8", "NVIDIA A100 has no float8 rate"),
        ("NVIDIA GH100", "bfloat16", "'NVIDIA GH100' is not in"),  # no H100 inside a word
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bfloat16", "is a MIG slice"),
    ],
)
def test_an_unknown_device_or_type_gets_no_peak_and_why(
    reported: str, dtype: str, why: str
) -> None:
    peak = device_peak(reported, dtype)
    assert peak.flops_per_s is None and peak.source is None
    assert peak.reason is not None and why in peak.reason
    assert "pass" in peak.reason  # the fix
