"""The demo's MFU: its model's shape against torch's own FLOP count, the CPU's peak
only when asked (measured, labelled so), and a continued run that keeps its first
segment's section."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from twinkle.demo.config import DemoConfig
from twinkle.demo.hf import tiny_llama
from twinkle.demo.mfu import tiny_decoder_shape
from twinkle.demo.model import TinyDecoder
from twinkle.demo.runner import run_demo
from twinkle.demo.task import VOCAB
from twinkle.errors import InvalidArgumentError
from twinkle.integrations.flops import check_flops, measured_forward_flops, meta_copy
from twinkle.integrations.peak import measure_peak_flops
from twinkle.metric import forward_flops, model_shape

SMALL = DemoConfig(
    iterations=3, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=5, grad_accum=1
)


def test_the_tiny_decoders_shape_counts_what_torch_counts() -> None:
    """With the math kernel of scaled_dot_product_attention (whose matrix products the
    counter sees; it has no formula for the CPU's fused kernel), torch counts the
    attention scores over every L x L pair (the causal mask is no arithmetic skipped);
    the shape counts the keys each position sees: the difference is exactly 4·d per
    masked pair and layer."""
    cfg = DemoConfig(d_model=64, layers=2, heads=4)
    model = TinyDecoder(VOCAB, cfg.d_model, cfg.layers, cfg.heads, max_len=32)
    length = 20
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, length, dtype=torch.long))
    masked = length * length - length * (length + 1) // 2
    unmasked = forward_flops(tiny_decoder_shape(cfg), [length]) + 4 * 64 * masked * cfg.layers
    assert counter.get_total_flops() == unmasked


def test_a_measured_peak_says_it_is_measured() -> None:
    rate, label = measure_peak_flops("float32", size=64, repeats=2)
    assert rate > 0 and label.startswith("measured: best of 2 torch.matmul of 64x64")
    assert "not a datasheet peak" in label
    with pytest.raises(InvalidArgumentError, match="floating-point"):
        measure_peak_flops("int8")


def _mfu(run_dir: Path) -> dict[str, object]:
    section: dict[str, object] = orjson.loads((run_dir / "summary.json").read_bytes())["mfu"]
    return section


def test_the_demo_abstains_on_a_cpu_unless_asked_and_a_continued_run_keeps_its_peak(
    tmp_path: Path,
) -> None:
    run_demo(SMALL, out_dir=tmp_path, run_id="plain")
    plain = _mfu(tmp_path / "plain")
    assert plain["peak_flops_per_s"] is None and "'cpu' is not in" in str(plain["abstained"])
    run_demo(SMALL, out_dir=tmp_path, run_id="m", peak_flops="measured")
    measured = _mfu(tmp_path / "m")
    assert str(measured["peak_source"]).startswith("measured: ")
    run = measured["run"]
    assert isinstance(run, dict) and 0 < run["train_mfu"] < 1 and 0 < run["rollout_mfu"] < 1
    run_demo(SMALL, out_dir=tmp_path, run_id="m", peak_flops="measured", resume=True)
    again = _mfu(tmp_path / "m")  # (the first segment's peak: a resume may not change it)
    assert again["peak_flops_per_s"] == measured["peak_flops_per_s"]


def test_a_meta_copy_counts_what_the_model_counts_without_its_weights() -> None:
    model = tiny_llama(seed=0)
    ghost = meta_copy(model)
    assert {p.device.type for p in ghost.parameters()} == {"meta"}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.zeros(1, 20, dtype=torch.long))
    assert measured_forward_flops(model, 20) == counter.get_total_flops()
    check = check_flops(model, model_shape(model.config), 20)
    assert check["relative_difference"] == 0 and check["analytic"] < check["measured"]
    decoder = TinyDecoder(VOCAB, 64, 2, 4, max_len=32)
    shape = tiny_decoder_shape(DemoConfig(d_model=64, layers=2, heads=4))
    assert check_flops(decoder, shape, 20)["relative_difference"] == 0
    with pytest.raises(InvalidArgumentError, match="length must be an int >= 1"):
        measured_forward_flops(decoder, 0)
