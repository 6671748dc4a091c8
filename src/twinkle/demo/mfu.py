"""The demo's model FLOPs utilisation: its models' shapes and its ``config.mfu``.

The torch engine's policy is :class:`~twinkle.demo.model.TinyDecoder` (GPT-2-like: a
fused q/k/v projection and an output projection, a two-matrix GELU MLP of width
``4·d``, a tied LM head), the vLLM engine's the tiny Llama of :mod:`twinkle.demo.hf`.
Both run in float32 on the CPU, which no datasheet covers: the demo's MFU abstains
unless asked for a peak (``--peak-flops``: a number, or ``measured``, a timed matrix
product labelled as measured). A resumed demo keeps the section its run began with
(a measured peak is the first segment's), since a resume may not change it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinkle.demo.config import DemoConfig
from twinkle.demo.hf import TinyLlamaSpec
from twinkle.demo.task import VOCAB
from twinkle.metric import ModelShape, model_shape
from twinkle.observers import EVENTS_FILE, mfu_config
from twinkle.run import started_config

__all__ = ["MEASURED", "demo_mfu", "tiny_decoder_shape"]

#: ``--peak-flops measured``
MEASURED = "measured"


def tiny_decoder_shape(cfg: DemoConfig) -> ModelShape:
    """The torch demo's :class:`~twinkle.demo.model.TinyDecoder` as a model shape."""
    d, heads = cfg.d_model, cfg.heads
    return ModelShape(
        model_type="twinkle_tiny_decoder",
        hidden=d,
        vocab=VOCAB,
        heads=heads,
        kv_heads=heads,
        head_dim=d // heads,
        layer_types=("full_attention",) * cfg.layers,
        mlp=(2 * 2 * d * 4 * d,) * cfg.layers,  # d -> 4d -> d
    )


def demo_mfu(
    cfg: DemoConfig, peak_flops: float | str | None, logged: Path | None
) -> dict[str, Any] | None:
    """The demo's ``config.mfu``: a continued run's as its first segment had it (none
    when it had none), else one for ``cfg``'s model on the CPU in float32, with
    ``peak_flops`` (a number, :data:`MEASURED` or None: no peak)."""
    began = None if logged is None else started_config(logged)
    if began is not None:
        section = began.get("mfu")
        return section if isinstance(section, dict) else None
    shape = (
        model_shape(TinyLlamaSpec().config_dict())
        if cfg.engine == "vllm"
        else tiny_decoder_shape(cfg)
    )
    source = None
    if peak_flops == MEASURED:
        from twinkle.integrations.peak import measure_peak_flops

        peak_flops, source = measure_peak_flops("float32", "cpu")
    return mfu_config(
        shape,
        dtype="float32",
        device="cpu",
        peak_flops=None if peak_flops is None else float(peak_flops),
        peak_source=source,
    )


def logged_events(out_dir: str | os.PathLike[str] | None, run_id: str | None) -> Path | None:
    """The run's event log, when the demo writes one."""
    return None if out_dir is None or run_id is None else Path(out_dir) / run_id / EVENTS_FILE
