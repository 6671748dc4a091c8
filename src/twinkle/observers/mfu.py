"""Model FLOPs utilisation: per phase, the model FLOPs its samples took over the device
time it had, against the devices' peak (docs/metrics.md, "Model FLOPs utilisation").

With ``config.mfu`` (:mod:`twinkle.observers._mfu_config`), each sample of a training
or generation phase's tag costs the FLOPs :mod:`twinkle.metric.flops` gives for its
length (training: forward and backward over the whole sequence, the LM head on every
token or, with ``logits: "completion"``, the completion's; generation: prefill and
decode, the LM head on the completion's tokens). Per iteration one ``mfu`` record:
per phase the FLOPs of the iteration's samples over the phase's attributed logical
seconds times its devices (the throughput record's ``device_seconds``), the FLOP/s per
device, and their share of the peak. At the finish one ``mfu`` record of scope ``run``:
per phase every sample over the phase's run-level seconds (as the throughput's phase
window), and the steady state. A share over 1 is not reported as MFU: it goes under
``implied_*`` with the likely cause in ``attrs.over_peak``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import mul
from typing import Any

from twinkle.events import IterationStarted, RunFinished, RunStarted, SamplesObserved
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.metric.flops import FORMULA, ModelShape
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._mfu_config import MfuConfig
from twinkle.observers.timeline import Finished, Timeline, timeline_for
from twinkle.reporting import MetricRecord, make_record

__all__ = ["OVER_PEAK", "MfuObserver", "SampleFlops"]

_NS = 1e9

#: why a share of the peak over 1 cannot be true, and what usually makes one
OVER_PEAK = (
    "over the peak: the FLOPs took less device time than the peak allows. Likely: "
    "a peak below the device's (another device or dtype than config.mfu says), "
    "devices missing from the phase's denominator, samples counted that the phase did "
    "not process, or GPU work the phase's spans do not wait for (synchronise before a "
    "span ends)"
)


class SampleFlops:
    """A batch's FLOPs for a model shape, by its samples' lengths and prompts: the
    sums of :func:`~twinkle.metric.training_flops` and
    :func:`~twinkle.metric.generation_flops`, each layer's per-token and attention
    terms added up once and the attention's triangles summed in closed form (from the
    lengths' sum and sum of squares), not sample by sample."""

    def __init__(self, shape: ModelShape, recompute: bool) -> None:
        self.linear = sum(shape.linear_per_token().values())
        self.head = shape.lm_head
        self.per_key = 4 * shape.heads * shape.head_dim
        full = shape.layer_types.count("full_attention")
        sliding = shape.layer_types.count("sliding_attention")
        self.window = shape.sliding_window or 0
        # sliding layers without a window (None or 0) see every key, as full ones do
        self.full = full if self.window else full + sliding
        self.sliding = sliding if self.window else 0
        self.passes = 4 if recompute else 3

    def _attention(self, lengths: Sequence[int], total: int) -> int:
        """The attention of sequences of ``lengths`` (``total`` tokens): position ``i``
        of a full layer sees ``i`` keys, of a sliding one at most its window ``w``."""
        attention = self.full * _triangles(lengths, total)
        if self.sliding:  # (a sequence over w: w's triangle, then w keys per position)
            w = self.window
            short = [n for n in lengths if n <= w]
            within = sum(short)
            over = len(lengths) - len(short)
            capped = w * (w + 1) // 2 * over + w * (total - within - over * w)
            attention += self.sliding * (_triangles(short, within) + capped)
        return self.per_key * attention

    def training(self, lengths: Sequence[int], prompts: Sequence[int] = ()) -> int:
        """Training on sequences of ``lengths``, the LM head on each one's tokens after
        its prompt (all of them without ``prompts``)."""
        total = sum(lengths)
        body = total * self.linear + self._attention(lengths, total)
        return self.passes * body + 3 * (total - sum(prompts)) * self.head

    def generation(self, lengths: Sequence[int], prompts: Sequence[int]) -> int:
        """Generating each sequence's tokens after its prompt: the last one is never fed."""
        fed = [n - 1 if n > p else n for n, p in zip(lengths, prompts, strict=True)]
        total = sum(fed)
        body = total * self.linear + self._attention(fed, total)
        return body + (sum(lengths) - sum(prompts)) * self.head


def _triangles(lengths: Sequence[int], total: int) -> int:
    """Sum of ``n (n + 1) / 2`` over ``lengths`` (``total`` their sum)."""
    squares: int = sum(map(mul, lengths, lengths))
    return (squares + total) // 2


class _Totals:
    """One phase's FLOPs and tokens, and the samples that gave no prompt length."""

    __slots__ = ("flops", "no_prompt", "tokens")

    def __init__(self) -> None:
        self.flops = 0
        self.tokens = 0
        self.no_prompt = 0

    def add(self, other: _Totals) -> None:
        self.flops += other.flops
        self.tokens += other.tokens
        self.no_prompt += other.no_prompt


class MfuObserver(BuiltinObserver):
    """Per iteration each configured phase's FLOPs and MFU; the run's at the finish."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.config: MfuConfig | None = None
        self.flops: SampleFlops | None = None
        self.run_id = ""
        #: iteration -> phase -> totals, for the iterations not finalised yet
        self.pending: dict[int, dict[str, _Totals]] = {}
        #: per phase: every sample's; the steady-state iterations' and their seconds
        self.run: dict[str, _Totals] = {}
        self.steady: dict[str, _Totals] = {}
        self.steady_ns: dict[str, int] = {}
        self.run_values: dict[str, int | float] = {}
        self.run_attrs: dict[str, Any] = {}
        self.last_iteration = 0

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.config.get("mfu") is not None:  # (else idle: a timeline not needed)
            self.timeline = timeline_for(context, "mfu")

    @hookimpl
    def twinkle_run_started(self, event: RunStarted) -> None:
        self.run_id = event.run_id
        self.config = config = self.timeline.config.mfu
        if config is not None and config.shape is not None:
            self.flops = SampleFlops(config.shape, config.recompute)
            for phase in config.phases:
                self.run.setdefault(phase, _Totals())
                self.steady.setdefault(phase, _Totals())
                self.steady_ns.setdefault(phase, 0)

    @hookimpl
    def twinkle_samples(self, event: SamplesObserved) -> None:
        config, flops = self.config, self.flops
        if config is None or flops is None:
            return
        throughput = self.timeline.config.throughput
        for phase, work in config.phases.items():
            if throughput[phase].samples != event.phase:
                continue
            part = _Totals()
            lengths = event.lengths
            prompts: Sequence[int] = event.prompt_lengths or ()
            part.tokens = sum(lengths)
            if work == "training" and not config.completion_logits:
                part.flops = flops.training(lengths)
            else:
                if not prompts:  # (the LM head on every token: counted as such, and said)
                    prompts = (0,) * len(lengths)
                    part.no_prompt = len(lengths)
                cost = flops.generation if work == "generation" else flops.training
                part.flops = cost(lengths, prompts)
            self.run[phase].add(part)
            upto = self.timeline.finalised_upto
            if upto is None or event.iteration > upto:  # (else late: the run's only)
                by_phase = self.pending.setdefault(event.iteration, {})
                by_phase.setdefault(phase, _Totals()).add(part)

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> list[MetricRecord]:
        return self._emit(self.timeline.finished, event.monotonic_ns)

    @hookimpl
    def twinkle_run_finished(self, event: RunFinished) -> list[MetricRecord]:
        records = self._emit(self.timeline.finished, event.monotonic_ns)
        # Iterations the segment never started are no window's (the timeline's
        # "unstarted"): their samples count in the run's figures only, and a later
        # segment that reuses their numbers starts them afresh.
        self.pending.clear()
        config, run = self.config, self.timeline.run
        if config is None or self.flops is None or run is None:
            return records
        values: dict[str, int | float] = {}
        self.run_attrs = self._attrs()
        for phase in config.phases:
            devices = self.timeline.config.throughput[phase].devices
            seconds = run.total.phase_logical_ns[phase] / _NS
            values.update(self._figures(phase, self.run[phase], seconds * devices))
            steady = self.steady_ns[phase] / _NS * devices
            values.update(self._figures(phase, self.steady[phase], steady, "steady_"))
        self.run_values = values
        records.append(
            make_record(
                kind="mfu",
                scope="run",
                run_id=self.run_id,
                step=self.timeline.step,
                iteration=self.last_iteration,
                wall_ns=event.wall_ns,
                monotonic_ns=event.monotonic_ns,
                values=values,
                attrs=self._with_flags(self.run_attrs, values),
            )
        )
        return records

    def _emit(self, finished: list[Finished], monotonic_ns: int) -> list[MetricRecord]:
        config = self.config
        if config is None or self.flops is None:
            return []
        throughput = self.timeline.config.throughput
        records = []
        for done in finished:
            data = done.data
            self.last_iteration = max(self.last_iteration, data.iteration)
            by_phase = self.pending.pop(data.iteration, {})
            values: dict[str, int | float] = {}
            for phase in config.phases:
                totals = by_phase.get(phase) or _Totals()
                attributed = done.attributed.phase_logical_ns[phase]
                devices = throughput[phase].devices
                values.update(self._figures(phase, totals, attributed / _NS * devices))
                if done.steady:
                    self.steady[phase].add(totals)
                    self.steady_ns[phase] += attributed
            attrs = self._with_flags(self._attrs(by_phase), values)
            attrs.update(done.attrs)
            records.append(
                make_record(
                    kind="mfu",
                    scope="iteration",
                    run_id=self.run_id,
                    step=data.step,
                    iteration=data.iteration,
                    wall_ns=data.wall_ns,
                    monotonic_ns=monotonic_ns,
                    values=values,
                    attrs=attrs,
                )
            )
        return records

    def _figures(
        self, phase: str, totals: _Totals, device_s: float, prefix: str = ""
    ) -> dict[str, int | float]:
        """A phase's figures: ``<phase>_flops``, ``_tokens``, ``_flops_per_token``,
        ``_device_seconds``, ``_flops_per_s_per_device`` and, with a peak, its share:
        ``_mfu`` (``_hfu``) up to 1, else ``_implied_mfu`` (``_implied_hfu``)."""
        config = self.config
        assert config is not None
        name = f"{prefix}{phase}_"
        flops = float(totals.flops)
        rate = flops / device_s if device_s > 0 else math.nan
        out: dict[str, int | float] = {
            name + "flops": flops,
            name + "tokens": totals.tokens,
            name + "flops_per_token": flops / totals.tokens if totals.tokens else math.nan,
            name + "device_seconds": device_s,
            name + "flops_per_s_per_device": rate,
        }
        peak = config.peak.flops_per_s
        if peak is not None and config.shape is not None:
            share = rate / peak
            key = config.key(phase)
            out[name + (key if not share > 1 else f"implied_{key}")] = share
        return out

    def _attrs(self, by_phase: dict[str, _Totals] | None = None) -> dict[str, Any]:
        """What makes the figures checkable: the formula, model, dtype, device, peak
        and its source (or why there is none), and the samples without a prompt."""
        config = self.config
        assert config is not None and config.shape is not None
        peak = config.peak
        attrs: dict[str, Any] = {
            "formula": FORMULA,
            "model_type": config.shape.model_type,
            "dtype": peak.dtype,
            "device": peak.reported_name or None,
            "peak_flops_per_s": peak.flops_per_s,
            "peak_source": peak.source,
        }
        if peak.flops_per_s is None:
            attrs["abstained"] = peak.reason
        totals = self.run if by_phase is None else by_phase
        no_prompt = {p: t.no_prompt for p, t in sorted(totals.items()) if t.no_prompt}
        if no_prompt:
            attrs["samples_without_prompt_lengths"] = no_prompt
        return attrs

    def _with_flags(self, attrs: dict[str, Any], values: dict[str, int | float]) -> dict[str, Any]:
        over = sorted(k for k in values if "_implied_" in k)
        return {**attrs, "over_peak": {k: OVER_PEAK for k in over}} if over else attrs

    @hookimpl
    def twinkle_summary(self, event: RunFinished) -> dict[str, Any]:
        config = self.config
        if config is None:
            return {}
        if config.shape is None or self.flops is None:
            return {"mfu": {"abstained": config.reason}}
        shape = config.shape
        return {
            "mfu": {
                **self.run_attrs,
                "model": {
                    "layers": shape.layers,
                    "linear_flops_per_token": shape.linear_per_token(),
                    "lm_head_flops_per_token": shape.lm_head,
                },
                "recompute": config.recompute,
                "logits": "completion" if config.completion_logits else "all",
                "phases": {
                    p: {"work": work, "figure": config.key(p)} for p, work in config.phases.items()
                },
                "run": self.run_values,
            }
        }
