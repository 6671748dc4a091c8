"""The demo: a real GRPO run (its figures are recomputed independently from
events.jsonl in test_recompute.py)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _recompute import span_list
from twinkle.cli import main
from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutEngine, TorchEngine
from twinkle.demo.runner import DemoResult, run_demo
from twinkle.demo.task import BOS, EOS, SEP, reward
from twinkle.demo.trainer import group_advantages
from twinkle.errors import ConfigError

SMALL = DemoConfig(
    iterations=3, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=5, grad_accum=1
)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return run_demo(SMALL, out_dir=tmp_path_factory.mktemp("demo"), run_id="small")


def test_summary_counts_match_the_configuration(small: DemoResult) -> None:
    s = small.summary
    n = SMALL.iterations
    samples = n * SMALL.prompts_per_iteration * SMALL.completions_per_prompt
    steps = n * math.ceil(SMALL.samples_per_iteration / (SMALL.micro_batch * SMALL.grad_accum))
    counts = s["counts"]
    assert counts["groups_rollout"]["final"] == n * SMALL.prompts_per_iteration
    assert counts["samples_rollout"]["final"] == samples
    assert counts["samples_train"]["final"] == samples
    assert counts["optimizer_updates"]["final"] == steps
    assert all(c["discrepancy"] in (0, None) for c in counts.values())
    assert s["records_dropped"] == 0
    assert s["observer_failures"] == {}
    assert s["iterations"] == n
    assert s["process_wall_seconds"] > 0
    first = s["scalars"]["grpo"]["reward_mean"]
    assert first["first"] == small.iterations[0].reward_mean
    assert first["last"] == small.iterations[-1].reward_mean
    assert {p.name for p in small.run_dir.iterdir()} >= {  # type: ignore[union-attr]
        "events.jsonl",
        "metrics_raw.jsonl",
        "metrics.jsonl",
        "summary.json",
        "trace.json",
    }


def test_tail_micro_batches_are_counted(small: DemoResult) -> None:
    # 16 samples, micro-batch 5, no accumulation: 3 full micro-batches and a tail of 1
    for result in small.iterations:
        assert result.micro_batches == 4
        assert result.optimizer_steps == 4
        assert result.samples == 16


def test_trajectories_are_rewarded_by_the_task(small: DemoResult) -> None:
    for trajs in small.trajectories:
        assert len(trajs) == SMALL.samples_per_iteration
        for t in trajs:
            assert t.prompt[0] == BOS and t.prompt[-1] == SEP
            assert t.reward == reward(t.prompt, t.response)
            assert len(t.logprobs) == len(t.response)
            assert all(tok < 10 or tok == EOS for tok in t.response)


def test_same_seed_gives_same_tokens_rewards_and_losses() -> None:
    cfg = DemoConfig(
        iterations=3, prompts_per_iteration=4, completions_per_prompt=4, observers=False
    )
    a = run_demo(cfg, out_dir=None)
    b = run_demo(cfg, out_dir=None)
    assert a.trajectories == b.trajectories
    assert a.iterations == b.iterations
    c = run_demo(DemoConfig(**{**cfg.to_dict(), "seed": 1}), out_dir=None)
    assert c.trajectories != a.trajectories


def test_group_advantages_are_normalised_within_each_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], 2)
    assert adv[0] == pytest.approx(1.0, abs=1e-5) and adv[1] == pytest.approx(-1.0, abs=1e-5)
    assert adv[2:] == [0.0, 0.0]


def test_without_observers_nothing_is_written(tmp_path: Path) -> None:
    cfg = DemoConfig(
        iterations=2, prompts_per_iteration=2, completions_per_prompt=2, observers=False
    )
    result = run_demo(cfg, out_dir=tmp_path)
    assert result.run_dir is None
    assert list(tmp_path.iterdir()) == []


def test_demo_command_prints_table_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "demo",
            "--iterations",
            "2",
            "--prompts",
            "2",
            "--completions",
            "2",
            "--out",
            str(tmp_path),
            "--run-id",
            "cli",
            "--no-progress",
            "--no-autoload",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "tok/s/dev" in out and "samples generated       8 (" in out
    assert (tmp_path / "cli" / "summary.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"completions_per_prompt": 1}, "completions_per_prompt"),
        ({"iterations": 0}, "iterations"),
        ({"prompts_per_iteration": 3, "engines": 2}, r"engines \(2\).*give --prompts 2 or 4,"),
        ({"prompts_per_iteration": 16, "engines": 3}, r"give --prompts 15 or 18, or another"),
        ({"prompts_per_iteration": 2, "engines": 3}, r"give --prompts 3, or another"),
        ({"lr": -1.0}, "lr"),
        ({"d_model": 30, "heads": 4}, "heads"),
        ({"engine": "vllm", "layers": 4}, r"layers=4: d_model, layers and heads shape the torch"),
        ({"engine": "sglang"}, r"engine must be one of torch, vllm, got 'sglang'"),
        ({"lr": "1e-3"}, r"lr must be a finite number > 0, got '1e-3'"),
        ({"lr": float("inf")}, r"lr must be a finite number > 0, got inf"),
        ({"temperature": float("nan")}, r"temperature must be a finite number > 0, got nan"),
        ({"backend": "slurm"}, r"backend must be one of local, ray, got 'slurm'"),
        ({"backend": "ray", "engine": "vllm"}, r"engine 'vllm' is not available there"),
        ({"train_workers": 0}, r"train_workers must be a positive int, got 0"),
        ({"train_workers": 2, "backend": "ray"}, r"train_workers=2 runs the torch demo's"),
        ({"staleness": 0}, r"staleness 0 does not overlap .* but overlap is True"),
        ({"staleness": 2, "overlap": False}, r"staleness 2 overlaps .* --lag 0 for no overlap"),
        ({"staleness": 9}, r"staleness must be an int in \[0, 8\] or None, got 9"),
        ({"sim_device": True, "train_workers": 2}, r"sim_device .* --train-workers 1"),
        # (values the run could not hold or train with: refused before it starts)
        ({"lr": 1e300}, r"lr must be at most 1, got 1e\+300"),
        ({"seed": -1}, r"seed must be an int in \[0, 2\*\*63 - 1\], got -1"),
        ({"seed": 2**63}, r"seed must be an int in \[0, 2\*\*63 - 1\]"),
        ({"iterations": 2**31}, r"iterations must be at most 2,147,483,647, got 2147483648"),
    ],
)
def test_bad_demo_configuration_names_the_option(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DemoConfig(**kwargs)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--lag", "-1"], "argument --lag: '-1' is not a number of weight versions in [0, 8]"),
        (["--lag", "1.5"], "argument --lag: '1.5' is not a number of weight versions in [0, 8]"),
        (["--lag", "0", "--overlap"], "staleness 0 does not overlap generation with training"),
        (["--lag", "2", "--no-overlap"], "staleness 2 overlaps generation with training"),
        (["--prompts", "0"], "--prompts: prompts_per_iteration must be a positive int, got 0"),
        (["--slow-generation", "0"], "--slow-generation: slow_generation must be a number"),
        # (two flags' values that do not fit: said as such, the fix naming both)
        (["--engines", "3"], "prompts_per_iteration (16) must be a multiple of engines (3)"),
    ],
)
def test_a_bad_demo_flag_is_named_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    rc: object
    try:
        rc = main(["demo", "--out", str(tmp_path), "--no-progress", "--no-autoload", *flags])
    except SystemExit as exc:  # (refused by the parser, as argparse does: exit status 2)
        rc = exc.code
    assert rc != 0 and f": error: {said}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--resume"], "--resume continues a run, and no --run-id names it"),
        (["--resume", "--run-id", "typo"], "--resume: '{out}/typo' holds no run to continue"),
        (["--resume", "--run-id", "r", "--no-observers"], "and --no-observers writes no run"),
        (["--run-id", "r", "--no-observers"], "--run-id names the run to write, and --no-obs"),
    ],
)
def test_a_run_named_that_is_not_there_to_resume_or_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    rc = main(["demo", "--out", str(tmp_path), "--no-progress", "--no-autoload", *flags])
    assert rc != 0 and said.format(out=tmp_path) in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_default_run_learns() -> None:
    """The default run (seed 0, 60 iterations, overlap on) learns the task: its last
    iteration's reward mean, the one `make demo` ends with, reaches 0.8."""
    result = run_demo(DemoConfig(observers=False), out_dir=None)
    rewards = [r.reward_mean for r in result.iterations]
    first = rewards[0]
    late = sum(rewards[-10:]) / 10
    assert late > 2 * first, rewards
    assert rewards[-1] >= 0.8, rewards


@pytest.mark.parametrize(
    ("overlap", "staleness", "versions"),
    [(True, None, [1, 2, 5, 6]), (False, None, [1, 2, 3, 5, 6, 7]), (True, 2, [1, 5])],
)
def test_a_version_is_published_once_no_rollout_needs_an_older_one(
    tmp_path: Path,
    overlap: bool,
    staleness: int | None,
    versions: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two segments of one run (the second resumes at iteration 4): each update that a
    later rollout uses is published, once every rollout due an older version is done
    (the engines' own wait is made a check, so a loop that published early fails), and
    every rollout ran on exactly the version its iteration is due."""

    def unneeded_already(engine: RolloutEngine, version: int) -> None:
        first = engine.first_iteration
        needed = version - 1 + engine.config.lag if version > first else first - 1
        assert engine.generated_through >= needed, (
            f"version {version} published while {engine.name} had rollouts through "
            f"{engine.generated_through} only, {needed} needing an older one"
        )

    monkeypatch.setattr(RolloutEngine, "wait_until_unneeded", unneeded_already)
    # Generation slower than training: a loop that published as soon as it trained would
    # publish while the next iteration's rollouts are still being generated.
    generate = TorchEngine._generate

    def slow(engine: TorchEngine, prompts: list[list[int]], iteration: int) -> Any:
        time.sleep(0.2)
        return generate(engine, prompts, iteration)

    monkeypatch.setattr(TorchEngine, "_generate", slow)
    cfg = DemoConfig(
        iterations=4,
        prompts_per_iteration=2,
        completions_per_prompt=2,
        micro_batch=4,
        overlap=overlap,
        staleness=staleness,
    )
    run_demo(cfg, out_dir=tmp_path, run_id="r")
    run_demo(cfg, out_dir=tmp_path, run_id="r", resume=True)
    events = _lines(tmp_path / "r" / "events.jsonl")
    assert [e["version"] for e in events if e["type"] == "weights_published"] == versions
    spans = [s for e in events if e["type"] == "spans" for s in span_list(e)]
    generated = {
        (s["attrs"]["iteration"], s["attrs"]["engine"]): s for s in spans if s["name"] == "generate"
    }
    lag = cfg.lag
    for (it, _), span in generated.items():
        first = 0 if it < 4 else 4
        assert span["attrs"]["version"] == max(first, it - lag), (it, span["attrs"])
    for load in (
        s for s in spans if s["name"] == "weights.load" and s["attrs"]["version"] in versions
    ):
        version, engine = load["attrs"]["version"], load["attrs"]["engine"]
        assert generated[version - 1 + lag, engine]["end_ns"] <= load["start_ns"]


@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=8),
    st.lists(st.sampled_from([*range(10), EOS]), max_size=12),
)
def test_the_reward_lies_in_zero_to_one_and_is_one_for_an_exact_copy(
    digits: list[int], response: list[int]
) -> None:
    prompt = [BOS, *digits, SEP]
    assert 0.0 <= reward(prompt, response) <= 1.0
    assert reward(prompt, [*digits, EOS]) == 1.0
