"""``config.mfu``: what model FLOPs utilisation needs from the caller (docs/metrics.md,
"Model FLOPs utilisation").

Its shape::

    "mfu": {
      "model": {...},              # twinkle.metric.model_shape(hf_config).to_dict()
      "dtype": "bfloat16",         # what the matrix products run in
      "device": "NVIDIA H200",     # as torch.cuda.get_device_name() reports it
      "peak_flops": null,          # or the dense peak per device, FLOP/s (wins)
      "peak_source": null,         # with peak_flops: where it comes from
      "recompute": false,          # activation recomputation: training's figure is HFU
      "logits": "all",             # or "completion": training's LM head runs on the
                                   # tokens after the prompt only (GRPO's log-probs)
      "training": "train",         # the phases; default: config.streaming's
      "generation": "rollout"
    }

Each phase named must have a ``config.throughput`` entry: its samples' tag gives the
tokens, its devices the denominator, the timeline its seconds. A model, device or dtype
twinkle has no figure for is not an error: MFU abstains, saying why (the FLOPs and
FLOP/s per device are still reported).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twinkle.errors import ConfigError, InvalidArgumentError
from twinkle.metric import ModelShape, Peak, device_peak, model_shape

__all__ = ["MfuConfig", "mfu_config"]

_KEYS = (
    "model",
    "dtype",
    "device",
    "peak_flops",
    "peak_source",
    "recompute",
    "logits",
    "training",
    "generation",
)


@dataclass(frozen=True, slots=True)
class MfuConfig:
    """Parsed ``config.mfu``: the model's shape (None: not readable, ``reason`` says
    why), the peak per device (its ``flops_per_s`` None: none, its ``reason`` says why),
    whether training recomputes activations, whether its LM head runs on the completion
    tokens only, and each phase's work (``"training"`` or ``"generation"``)."""

    shape: ModelShape | None
    peak: Peak
    recompute: bool
    phases: dict[str, str]
    reason: str | None = None
    completion_logits: bool = False

    @classmethod
    def parse(
        cls,
        raw: Any,
        throughput: Mapping[str, Any],
        streaming: tuple[str, str] | None,
    ) -> MfuConfig | None:
        """``raw`` (``config.mfu``) checked; None when it is absent."""
        if raw is None:
            return None
        if not isinstance(raw, Mapping) or not set(raw) <= set(_KEYS):
            raise ConfigError(
                f"config.mfu must be an object with keys among {', '.join(_KEYS)}, got {raw!r:.200}"
            )
        shape, reason = None, None
        try:
            shape = ModelShape.from_dict(raw.get("model"), "config.mfu.model")
        except InvalidArgumentError as exc:
            reason = str(exc)
        recompute = raw.get("recompute", False)
        if type(recompute) is not bool:
            raise ConfigError(f"config.mfu.recompute must be true or false, got {recompute!r}")
        logits = raw.get("logits", "all")
        if logits not in ("all", "completion"):
            raise ConfigError(
                f'config.mfu.logits must be "all" (training computes every token\'s '
                f'logits) or "completion" (only the completion\'s), got {logits!r:.100}'
            )
        phases = _phases(raw, throughput, streaming)
        return cls(shape, _peak(raw), recompute, phases, reason, logits == "completion")

    def abstention(self) -> str | None:
        """Why there is no MFU (no model shape, no peak), or None."""
        return self.reason if self.shape is None else self.peak.reason

    def key(self, phase: str) -> str:
        """The figure's name for ``phase``: ``mfu``, or ``hfu`` for training that
        recomputes activations (its FLOPs are the hardware's, not the model's)."""
        return "hfu" if self.recompute and self.phases[phase] == "training" else "mfu"


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config.mfu.{key} must be a non-empty string, got {value!r:.100}")
    return value


def _peak(raw: Mapping[str, Any]) -> Peak:
    dtype = _text("dtype", raw.get("dtype"))
    device = raw.get("device")
    given, source = raw.get("peak_flops"), raw.get("peak_source")
    if device is not None:
        _text("device", device)
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int | float) or not given > 0:
            raise ConfigError(
                f"config.mfu.peak_flops must be a number > 0 (the dense peak per device, "
                f"FLOP/s), got {given!r:.100}"
            )
        source = "given (config.mfu.peak_flops)" if source is None else source
        return Peak(device or "", dtype, float(given), device, _text("peak_source", source))
    if source is not None:
        raise ConfigError("config.mfu.peak_source says where peak_flops comes from: give both")
    if device is None:
        raise ConfigError(
            "config.mfu needs the device (as torch.cuda.get_device_name() reports it) or "
            "peak_flops (the dense peak per device, FLOP/s)"
        )
    return device_peak(device, dtype)


def _phases(
    raw: Mapping[str, Any], throughput: Mapping[str, Any], streaming: tuple[str, str] | None
) -> dict[str, str]:
    phases: dict[str, str] = {}
    for index, work in enumerate(("generation", "training")):
        phase = raw.get(work, None if streaming is None else streaming[index])
        if phase is None:
            continue
        _text(work, phase)
        if phase not in throughput:
            raise ConfigError(
                f"config.mfu.{work} is phase {phase!r}, which has no config.throughput "
                f"entry (its samples and devices): add one, or name another phase "
                f"({sorted(throughput)})"
            )
        if phase in phases:
            raise ConfigError(f"config.mfu names phase {phase!r} for both kinds of work")
        phases[phase] = work
    if not phases:
        raise ConfigError(
            "config.mfu names no phase: give training and/or generation (phases of "
            "config.throughput), or config.streaming"
        )
    return phases


def mfu_config(
    model: Any,
    *,
    dtype: str,
    device: str | None = None,
    peak_flops: float | None = None,
    peak_source: str | None = None,
    recompute: bool = False,
    logits: str = "all",
    training: str | None = None,
    generation: str | None = None,
) -> dict[str, Any]:
    """``config.mfu`` for ``model``: a transformers configuration (object or dict, as
    :func:`~twinkle.metric.model_shape` reads it) or a
    :class:`~twinkle.metric.ModelShape`. ``dtype`` (``"bfloat16"``, ``torch.bfloat16``)
    and ``device`` (``torch.cuda.get_device_name()``) find the peak, or ``peak_flops``
    (FLOP/s per device, dense) gives it; ``recompute``: activation recomputation (the
    decoder layers' forward runs again in the backward); ``logits="completion"``:
    training's LM head runs on the completion tokens only (the train samples carry
    their prompt lengths); the phases default to ``config.streaming``'s.
    A model without a formula raises :class:`~twinkle.errors.InvalidArgumentError`
    naming its type."""
    shape = model if isinstance(model, ModelShape) else model_shape(model)
    section: dict[str, Any] = {"model": shape.to_dict(), "dtype": str(dtype).removeprefix("torch.")}
    optional = {
        "device": device,
        "peak_flops": peak_flops,
        "peak_source": peak_source,
        "training": training,
        "generation": generation,
    }
    section.update({k: v for k, v in optional.items() if v is not None})
    if recompute:
        section["recompute"] = True
    if logits != "all":
        section["logits"] = logits
    return section
