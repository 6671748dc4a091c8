"""Model FLOPs utilisation (docs/metrics.md, "Model FLOPs utilisation"), worked by hand.

The model: one full-attention layer, hidden 4, 2 heads of 2 (2 KV heads), an MLP of
intermediate size 8, a vocabulary of 10. Per token: attention projections
2·4·(4 + 2·2·2) + 2·2·2·4 = 128, the MLP 2·3·4·8 = 192 (320 in all), the LM head
2·4·10 = 80; attention scores 4·2·2 = 16 per key seen.

* training a sample of 3 tokens: 3 · (3·(320 + 80) + 16·(1+2+3)) = 3 · 1296 = 3888; of 4:
  3 · (4·400 + 16·10) = 5280; the iteration's [3, 4]: 9168 FLOPs;
* generating 2 tokens after a 1-token prompt (length 3): the last token is never fed, 2
  positions are: 2·320 + 16·(1+2) + 2·80 = 848; 2 after 2 (length 4), 3 positions:
  3·320 + 16·6 + 2·80 = 1216; the iteration's: 2064 FLOPs.

Each iteration generates for 1 ms and trains for 2 ms on one device each: 2,064,000 and
4,584,000 FLOP/s per device; against a peak of 10^7 FLOP/s, MFU 0.2064 and 0.4584.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import ConfigError, RecordError
from twinkle.events import SamplesObserved, dumps_event, event_from_dict
from twinkle.metric import (
    ModelShape,
    forward_flops,
    generation_flops,
    model_shape,
    training_flops,
)
from twinkle.observers import ObserverConfig
from twinkle.observers.mfu import OVER_PEAK, SampleFlops
from twinkle.perf import ManualClock
from twinkle.run import RunSession, replay

SHAPE = ModelShape(
    model_type="llama",
    hidden=4,
    vocab=10,
    heads=2,
    kv_heads=2,
    head_dim=2,
    layer_types=("full_attention",),
    mlp=(192,),
)
MS = 1_000_000


def _config(**mfu: Any) -> dict[str, Any]:
    return {
        "phases": {"rollout": ["generate"], "train": ["train.*"]},
        "throughput": {
            "rollout": {"samples": "rollout", "devices": 1},
            "train": {"samples": "train", "devices": 1},
        },
        "streaming": {"generation": "rollout", "training": "train"},
        "mfu": {"model": SHAPE.to_dict(), "dtype": "bfloat16", "peak_flops": 1e7, **mfu},
    }


def _run(
    out: Path,
    config: dict[str, Any],
    iterations: int = 4,
    *,
    train_prompts: tuple[int, ...] = (),
    blocked: tuple[str, ...] = (),
) -> Path:
    clock = ManualClock(10**9)
    with RunSession(
        out_dir=out,
        run_id="r",
        config=config,
        clock=clock,
        wall_clock=lambda: 1_700_000_000 * 10**9 + clock(),
        autoload=True,
        background_writer=False,
        blocked=list(blocked),
    ) as run:
        for i in range(iterations):
            run.bus.iteration_started(i)
            with run.recorder.span("generate", iteration=i):
                clock.advance(1 * MS)
            run.bus.samples(iteration=i, phase="rollout", lengths=[3, 4], prompt_lengths=[1, 2])
            with run.recorder.span("train.fwd"):
                clock.advance(2 * MS)
            run.bus.samples(
                iteration=i, phase="train", lengths=[3, 4], prompt_lengths=train_prompts
            )
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
    return out / "r"


def _records(run_dir: Path, scope: str = "iteration") -> list[dict[str, Any]]:
    lines = (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    return [r for r in records if r["kind"] == "mfu" and r["scope"] == scope]


_HYBRID = model_shape(
    {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 4,
        "intermediate_size": 96,
        "vocab_size": 100,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
    }
)
_MISTRAL = {
    "model_type": "mistral",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 50,
}
_SLIDING = model_shape({**_MISTRAL, "sliding_window": 3})
#: sliding layers beside a full one, with no window given (each sees every key)
_UNBOUNDED = model_shape({**_MISTRAL, "layer_types": ["sliding_attention", "full_attention"]})
#: ... and a window of 0 given with them (the formulas read it as none)
_ZERO_WINDOW = ModelShape.from_dict({**_SLIDING.to_dict(), "sliding_window": 0})
_SHAPES = [SHAPE, _HYBRID, _SLIDING, _UNBOUNDED, _ZERO_WINDOW]


def test_a_batchs_flops_are_the_formulas_sums() -> None:
    for shape in _SHAPES:
        flops = SampleFlops(shape, recompute=False)
        for n in (1, 2, 5, 17):
            assert flops.training([n]) == 3 * forward_flops(shape, [n])
            for p in (0, 1, n):
                assert flops.generation([n], [p]) == generation_flops(shape, [p], [n - p])
                assert flops.training([n], [p]) == training_flops(shape, [n], prompt_lengths=[p])
        again = SampleFlops(shape, recompute=True)
        assert again.training([5]) == training_flops(shape, [5], recompute=True)
        assert again.training([5], [2]) == training_flops(
            shape, [5], recompute=True, prompt_lengths=[2]
        )
    assert ModelShape.from_dict(_HYBRID.to_dict()) == _HYBRID
    assert _UNBOUNDED.layer_types == ("sliding_attention", "full_attention")
    assert _UNBOUNDED.sliding_window is None


def test_a_sliding_windows_attention_by_hand() -> None:
    # window 3, sequences of 2 and 5 tokens: 1 + 2 keys, and 1 + 2 + 3 + 3 + 3 keys
    flops = SampleFlops(_SLIDING, recompute=False)
    assert _SLIDING.layer_types == ("sliding_attention",) * 2
    per_key = 4 * _SLIDING.heads * _SLIDING.head_dim
    assert flops._attention([2, 5], 7) == per_key * 2 * (3 + 12)
    # with no window each sees every key: 1 + 2, and 1 + 2 + 3 + 4 + 5
    unbounded = SampleFlops(_UNBOUNDED, recompute=False)
    assert unbounded._attention([2, 5], 7) == per_key * 2 * (3 + 15)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.sampled_from(_SHAPES),
    pairs=st.lists(
        st.integers(0, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))),
        max_size=12,
    ),
    recompute=st.booleans(),
)
def test_a_batchs_flops_are_its_samples_summed(
    shape: ModelShape, pairs: list[tuple[int, int]], recompute: bool
) -> None:
    lengths = [n for n, _ in pairs]
    prompts = [p for _, p in pairs]
    flops = SampleFlops(shape, recompute)
    assert flops.training(lengths) == training_flops(shape, lengths, recompute=recompute)
    assert flops.training(lengths, prompts) == training_flops(
        shape, lengths, recompute=recompute, prompt_lengths=prompts
    )
    completions = [n - p for n, p in pairs]
    assert flops.generation(lengths, prompts) == generation_flops(shape, prompts, completions)
    assert flops.generation(lengths, prompts) == sum(flops.generation([n], [p]) for n, p in pairs)


def test_each_iteration_has_its_phases_flops_and_mfu(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _config())
    records = _records(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    values = records[1]["values"]
    assert values["rollout_flops"] == 2064 and values["train_flops"] == 9168
    assert values["rollout_tokens"] == 7 and values["train_flops_per_token"] == 9168 / 7
    assert values["rollout_device_seconds"] == 0.001 and values["train_device_seconds"] == 0.002
    assert values["rollout_flops_per_s_per_device"] == pytest.approx(2_064_000, rel=1e-12)
    assert values["rollout_mfu"] == pytest.approx(0.2064, rel=1e-12)
    assert values["train_mfu"] == pytest.approx(0.4584, rel=1e-12)
    attrs = records[1]["attrs"]
    assert attrs["formula"] == "twinkle-analytic-1" and attrs["dtype"] == "bfloat16"
    assert attrs["peak_flops_per_s"] == 1e7 and attrs["peak_source"].startswith("given")
    # its window's flags, as the timing record's: the ends are not the steady state
    flags = [r["attrs"]["window_flags"] for r in records]
    assert flags == [["warmup"], [], [], ["drain"]]
    (run,) = _records(run_dir, "run")
    # every iteration's FLOPs over the phase's 4 x 2 ms; the steady state: iterations 1-2
    assert run["values"]["train_flops"] == 4 * 9168
    assert run["values"]["train_mfu"] == pytest.approx(0.4584, rel=1e-12)
    assert run["values"]["steady_train_flops"] == 2 * 9168
    assert run["values"]["steady_train_device_seconds"] == pytest.approx(0.004, rel=1e-12)
    summary = orjson.loads((run_dir / "summary.json").read_bytes())["mfu"]
    assert summary["model"]["linear_flops_per_token"] == {"attention_projections": 128, "mlp": 192}
    assert summary["model"]["lm_head_flops_per_token"] == 80
    assert summary["phases"] == {
        "rollout": {"work": "generation", "figure": "mfu"},
        "train": {"work": "training", "figure": "mfu"},
    }
    replay(run_dir / "events.jsonl", tmp_path / "replayed")
    for name in ("metrics_raw.jsonl", "summary.json"):
        assert (tmp_path / "replayed" / name).read_bytes() == (run_dir / name).read_bytes()


def test_a_share_over_the_peak_is_not_called_mfu(tmp_path: Path) -> None:
    values = _records(_run(tmp_path, _config(peak_flops=1e6), iterations=2))[0]
    assert "train_mfu" not in values["values"] and "rollout_mfu" not in values["values"]
    assert values["values"]["train_implied_mfu"] == pytest.approx(4.584, rel=1e-12)
    assert values["attrs"]["over_peak"] == {
        "rollout_implied_mfu": OVER_PEAK,
        "train_implied_mfu": OVER_PEAK,
    }


def test_recomputed_activations_make_training_hardware_flops(tmp_path: Path) -> None:
    """The decoder layers' forward runs again, the LM head's does not: of the 9168,
    the layers' 3·(4·320 + 16·10 + 3·320 + 16·6) = 7488 become 4/3 of it, 9984; the
    head's 3·7·80 = 1680 stay: 11664."""
    values = _records(_run(tmp_path, _config(recompute=True), iterations=2))[0]["values"]
    assert values["train_flops"] == 11664 and "train_mfu" not in values
    assert values["train_hfu"] == pytest.approx(11664 / 0.002 / 1e7, rel=1e-12)
    assert values["rollout_mfu"] == pytest.approx(0.2064, rel=1e-12)


def test_completion_logits_put_the_lm_head_on_the_tokens_after_the_prompt(
    tmp_path: Path,
) -> None:
    """``logits: "completion"`` (GRPO's log-probabilities): with prompts of 1 and 2 the
    head runs on 2 + 2 tokens, not 7: 7488 + 3·4·80 = 8448. Samples without prompt
    lengths are charged the head on every token, and said to be."""
    config = _config(logits="completion")
    values = _records(_run(tmp_path / "a", config, 2, train_prompts=(1, 2)))[0]["values"]
    assert values["train_flops"] == 8448
    assert values["train_mfu"] == pytest.approx(0.4224, rel=1e-12)
    record = _records(_run(tmp_path / "b", config, 2))[0]
    assert record["values"]["train_flops"] == 9168
    assert record["attrs"]["samples_without_prompt_lengths"] == {"train": 2}
    summary = orjson.loads((tmp_path / "a" / "r" / "summary.json").read_bytes())["mfu"]
    assert summary["logits"] == "completion"


def test_an_unknown_device_gives_flops_and_no_mfu_saying_why(tmp_path: Path) -> None:
    config = _config(device="Acme Tensor Engine 9")
    del config["mfu"]["peak_flops"]
    record = _records(_run(tmp_path, config, iterations=2))[0]
    assert record["values"]["train_flops"] == 9168
    assert not [k for k in record["values"] if k.endswith(("mfu", "hfu"))]
    assert "'Acme Tensor Engine 9' is not in twinkle's table" in record["attrs"]["abstained"]
    assert record["attrs"]["peak_flops_per_s"] is None


def test_a_known_device_gives_its_datasheet_peak(tmp_path: Path) -> None:
    config = _config(device="NVIDIA H200")
    del config["mfu"]["peak_flops"]
    record = _records(_run(tmp_path, config, iterations=2))[0]
    assert record["attrs"]["peak_flops_per_s"] == 989.5e12
    assert "nvidia.com" in record["attrs"]["peak_source"]
    assert record["values"]["train_mfu"] == pytest.approx(9168 / 0.002 / 989.5e12, rel=1e-12)


def test_a_model_without_a_formula_abstains_in_the_summary(tmp_path: Path) -> None:
    config = _config(model={"model_type": "gpt2"})
    run_dir = _run(tmp_path, config, iterations=2)
    assert _records(run_dir) == []
    summary = orjson.loads((run_dir / "summary.json").read_bytes())["mfu"]
    assert "config.mfu.model must be an object with keys" in summary["abstained"]


@pytest.mark.parametrize(
    ("mfu", "match"),
    [
        ({"training": "eval"}, "config.mfu.training is phase 'eval', which has no"),
        ({"peak_flops": None}, "config.mfu needs the device"),
        ({"peak_flops": 0}, "peak_flops must be a number > 0"),
        ({"peak_flops": None, "device": "x", "peak_source": "y"}, "give both"),
        ({"dtype": ""}, "config.mfu.dtype must be a non-empty string"),
        ({"recompute": 1}, "recompute must be true or false"),
        ({"logits": "prompt"}, 'config.mfu.logits must be "all"'),
        ({"peak": 1}, "config.mfu must be an object with keys among"),
    ],
)
def test_a_bad_mfu_configuration_names_the_key(mfu: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ObserverConfig.parse(_config(**mfu))


def test_prompt_lengths_are_one_per_sample_and_within_it(tmp_path: Path) -> None:
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False) as run:
        with pytest.raises(RecordError, match=r"prompt_lengths\[1\] = 5 is longer"):
            run.bus.samples(iteration=0, phase="p", lengths=[3, 4], prompt_lengths=[1, 5])
        with pytest.raises(RecordError, match="has 1 entries for 2 lengths"):
            run.bus.samples(iteration=0, phase="p", lengths=[3, 4], prompt_lengths=[1])


def test_the_report_shows_each_phases_mfu_and_its_peak(tmp_path: Path) -> None:
    from twinkle.report import format_report, load_report

    lines = format_report(load_report(_run(tmp_path, _config()))).splitlines()
    header = next(line for line in lines if line.startswith("iter"))
    assert header.endswith("rollout MFU %  train MFU %")
    row = next(line for line in lines if line.split()[:1] == ["1"])
    assert row.split()[-2:] == ["20.6", "45.8"]
    assert (
        "MFU                 rollout 20.6% (2.06 MFLOP/s/device), train 45.8% "
        "(4.58 MFLOP/s/device) (steady state)" in lines
    )
    assert (
        "  peak              10 MFLOP/s per device (the device, bfloat16): given "
        "(config.mfu.peak_flops)" in lines
    )


def test_a_cut_short_iteration_without_samples_has_no_mfu_not_0(tmp_path: Path) -> None:
    """Iteration 1 generated for 1 ms, then the run ended in error before its samples
    came: its FLOPs are not known, so its MFU is too (-, null), not the record's 0."""
    from twinkle.report import format_report, load_report

    clock = ManualClock(10**9)
    run = RunSession(out_dir=tmp_path, run_id="r", config=_config(), clock=clock)
    run.start()
    run.bus.iteration_started(0)
    with run.recorder.span("generate", iteration=0):
        clock.advance(1 * MS)
    run.bus.samples(iteration=0, phase="rollout", lengths=[3, 4], prompt_lengths=[1, 2])
    run.bus.iteration_started(1)
    with run.recorder.span("generate", iteration=1):
        clock.advance(1 * MS)
    run.finish(status="error", error="RuntimeError: cut short")
    assert [r["values"]["rollout_mfu"] for r in _records(tmp_path / "r")] == [0.2064, 0.0]
    report = load_report(tmp_path / "r")
    first, cut = (row["phase_mfu"]["rollout"] for row in report["iterations"])
    assert (first["share"], first["tokens"]) == (0.2064, 7)
    assert (cut["share"], cut["tokens"]) == (None, 0)
    lines = format_report(report).splitlines()
    assert next(line for line in lines if line.startswith("iter")).endswith(
        "rollout MFU %  train MFU %"
    )
    rows = {row[0]: row for row in map(str.split, lines) if row[:1] in (["0"], ["1"])}
    assert rows["0"][-2] == "20.6" and rows["1"][-2] == "-"


def test_without_a_peak_the_report_has_no_mfu_column_and_says_why(tmp_path: Path) -> None:
    from twinkle.report import format_report, load_report

    config = _config(device="cpu")
    del config["mfu"]["peak_flops"]
    lines = format_report(load_report(_run(tmp_path, config))).splitlines()
    assert "MFU %" not in next(line for line in lines if line.startswith("iter"))
    assert lines[lines.index(next(x for x in lines if x.startswith("model FLOP/s"))) + 2] == (
        "  peak              none for cpu, bfloat16: device 'cpu' is not in twinkle's table of "
        "peaks (H100, H200, A100, L40S, B200, GB200, MI300X); pass its dense peak "
        "(peak_flops=), from its datasheet without sparsity"
    )


@pytest.mark.parametrize(
    "model",
    [
        {**SHAPE.to_dict(), "layer_types": [["full_attention"]]},  # (unhashable entries)
        {**SHAPE.to_dict(), "layer_types": [{"kind": "full_attention"}]},
        {**SHAPE.to_dict(), "mlp": [[192]]},
    ],
)
def test_a_malformed_model_shape_abstains_naming_the_key(tmp_path: Path, model: Any) -> None:
    run_dir = _run(tmp_path, _config(model=model), iterations=1)
    summary = orjson.loads((run_dir / "summary.json").read_bytes())["mfu"]
    assert summary["abstained"].startswith("config.mfu.model.")


def test_a_device_without_a_rate_for_the_dtype_has_no_peak_source(tmp_path: Path) -> None:
    config = _config(device="NVIDIA A100-SXM4-80GB", dtype="float8")
    del config["mfu"]["peak_flops"]
    attrs = _records(_run(tmp_path, config, iterations=2))[0]["attrs"]
    assert attrs["peak_flops_per_s"] is None and attrs["peak_source"] is None
    assert "NVIDIA A100 has no float8 rate in its datasheet (https://" in attrs["abstained"]


def test_samples_of_an_iteration_never_started_are_not_the_next_segments(
    tmp_path: Path,
) -> None:
    """A rollout generated ahead for iteration 2, which the segment never starts (a
    streaming run stopped), is work done in the run: it counts in the run's figures
    (848 FLOPs: 2 positions fed after a 1-token prompt), not in the next segment's
    iteration 2, which has only its own samples."""
    clock = ManualClock(10**9)

    def segment(first: int, ahead: bool) -> None:
        with RunSession(
            out_dir=tmp_path,
            run_id="r",
            config=_config(),
            clock=clock,
            wall_clock=lambda: 1_700_000_000 * 10**9 + clock(),
            autoload=True,
            background_writer=False,
            resume=True,
        ) as run:
            for i in range(first, first + 2):
                run.bus.iteration_started(i)
                with run.recorder.span("train.fwd"):
                    clock.advance(2 * MS)
                run.bus.samples(iteration=i, phase="train", lengths=[3, 4])
            if ahead:
                with run.recorder.span("generate", iteration=first + 2):
                    clock.advance(1 * MS)
                run.bus.samples(
                    iteration=first + 2, phase="rollout", lengths=[3], prompt_lengths=[1]
                )

    segment(0, ahead=True)
    segment(2, ahead=False)
    records = {r["iteration"]: r["values"] for r in _records(tmp_path / "r")}
    assert records[2]["train_flops"] == records[3]["train_flops"] == 9168
    assert records[2]["rollout_flops"] == records[3]["rollout_flops"] == 0
    run = _records(tmp_path / "r", "run")[-1]  # (each segment's end has one)
    assert run["values"]["train_flops"] == 4 * 9168 and run["values"]["rollout_flops"] == 848
    replay(tmp_path / "r" / "events.jsonl", tmp_path / "replayed")
    for name in ("metrics_raw.jsonl", "summary.json"):
        assert (tmp_path / "replayed" / name).read_bytes() == (tmp_path / "r" / name).read_bytes()
    # the report says the number was started after all, by the next segment
    from twinkle.report import format_report, load_report

    text = format_report(load_report(tmp_path / "r"))
    assert (
        "1 iterations observed but never started (2; the last started: 3; 2 started in a "
        "later segment, without the work observed for it before)"
    ) in text


def test_without_config_mfu_the_observer_needs_no_timeline_and_mfu_is_a_callers_kind(
    tmp_path: Path,
) -> None:
    """A run without ``config.mfu`` may block the timeline (and what reads it); a
    caller's scalars named ``mfu`` are the caller's, shown in the report as such."""
    from twinkle.report import format_report, load_report

    blocked = ("timeline", "timing", "throughput", "memory", "scalars")
    with RunSession(out_dir=tmp_path / "a", run_id="r", autoload=True, blocked=list(blocked)):
        pass
    config = _config()
    del config["mfu"]
    with RunSession(out_dir=tmp_path / "b", run_id="r", config=config, autoload=True) as run:
        for i in range(3):
            run.bus.iteration_started(i)
            run.bus.scalars(iteration=i, name="mfu", values={"reward": 0.5 + i})
    report = load_report(tmp_path / "b" / "r")
    assert report["reward"] == "mfu.reward"
    assert [row.get("reward") for row in report["iterations"]] == [0.5, 1.5, 2.5]
    assert "phase_mfu" not in report["iterations"][0]
    header = next(x for x in format_report(report).splitlines() if x.startswith("iter"))
    assert "MFU" not in header


def test_samples_without_prompt_lengths_log_no_such_key(tmp_path: Path) -> None:
    """Logs from before ``prompt_lengths`` have none: a sample without them is logged
    as they were, so replaying an old log writes it byte for byte."""
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False) as run:
        run.bus.samples(iteration=0, phase="p", lengths=[3, 4])
        run.bus.samples(iteration=0, phase="p", lengths=[3, 4], prompt_lengths=[1, 2])
    lines = (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()
    samples = [orjson.loads(x) for x in lines if b'"type":"samples"' in x]
    assert "prompt_lengths" not in samples[0] and samples[1]["prompt_lengths"] == [1, 2]
    # A line of the twinkle that logged none as [] reads back, and is written so again
    older = next(x for x in lines if b'"type":"samples"' in x).replace(
        b',"groups":0}', b',"groups":0,"prompt_lengths":[]}'
    )
    assert b'"prompt_lengths":[]' in older
    data = orjson.loads(older)
    del data["seq"]  # (the log's, not the event's)
    event = event_from_dict(data)
    assert isinstance(event, SamplesObserved)
    assert event.prompt_lengths == () and dumps_event(event) == orjson.dumps(data)
