"""Resume with another configuration (issue #26 item 6): a restarted job may plan more
steps (``total_steps``) and change the caller's own ``x_`` keys — each segment records
its own, and a replay of the resumed run gives every file byte for byte; any other
change is refused, naming the keys, both values and what the caller does about it
(a ``RunSession`` user, a ``TwinkleCallback`` user, the demo's user)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from reliability._scripted import CONFIG, segment
from twinkle.cli import main
from twinkle.errors import ReplayError, ResumeConfigError
from twinkle.run import RunSession, iter_events, replay

DERIVED = ("metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def summary_of(run_dir: Path) -> dict[str, Any]:
    return dict(orjson.loads((run_dir / "summary.json").read_bytes()))


def assert_replay_identical(run_dir: Path, out: Path) -> None:
    """Replaying the log (from the file, and from its event values) gives every file."""
    replay(run_dir / "events.jsonl", out)
    replay(list(iter_events(run_dir / "events.jsonl")), out.with_name(out.name + "-values"))
    for target in (out, out.with_name(out.name + "-values")):
        for name in (*DERIVED, "events.jsonl"):
            assert (target / name).read_bytes() == (run_dir / name).read_bytes(), (target, name)


# -- what a resume may change ---------------------------------------------------------


def test_a_resume_with_more_total_steps_goes_on_and_replays_byte_for_byte(
    tmp_path: Path,
) -> None:
    segment(tmp_path, {**CONFIG, "total_steps": 2})
    resumed = segment(tmp_path, {**CONFIG, "total_steps": 6}, iterations=3, wall_offset_ns=10**9)
    assert resumed.resumed is not None and resumed.resumed.segment == 1
    run_dir = tmp_path / "r"
    started, again = (e for e in lines(run_dir / "events.jsonl") if "config" in e)
    assert (started["config"]["total_steps"], again["config"]["total_steps"]) == (2, 6)
    # The resumed run's outputs are rebuilt under the newest segment's configuration.
    webui = lines(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in webui] == [0, 1, 2, 3, 4]
    assert {r["total_steps"] for r in webui} == {6}
    summary = summary_of(run_dir)
    assert summary["status"] == "ok" and summary["iterations"] == 5
    assert [s["total_steps"] for s in summary["segments"]] == [2, 6]
    assert [s["config_changes"] for s in summary["segments"]] == [{}, {"total_steps": 6}]
    assert_replay_identical(run_dir, tmp_path / "replayed")


def test_caller_x_keys_may_change_and_each_segment_records_what_it_changed(
    tmp_path: Path,
) -> None:
    segment(tmp_path, {**CONFIG, "x_job": {"attempt": 1}, "x_gone": "soon"})
    segment(tmp_path, {**CONFIG, "x_job": {"attempt": 2}, "x_new": [1]}, wall_offset_ns=10**9)
    segment(tmp_path, {**CONFIG, "x_job": {"attempt": 2}, "x_new": [1]}, wall_offset_ns=10**10)
    run_dir = tmp_path / "r"
    resumed = [e for e in lines(run_dir / "events.jsonl") if e["type"] == "run_resumed"]
    assert [e["config"]["x_job"] for e in resumed] == [{"attempt": 2}, {"attempt": 2}]
    segments = summary_of(run_dir)["segments"]
    assert [s["config_changes"] for s in segments] == [
        {},
        {"x_gone": None, "x_job": {"attempt": 2}, "x_new": [1]},
        {},
    ]
    assert [s["total_steps"] for s in segments] == [CONFIG["total_steps"]] * 3
    assert_replay_identical(run_dir, tmp_path / "replayed")


def test_a_resume_after_a_crash_may_change_total_steps_too(tmp_path: Path) -> None:
    """A segment that stopped without finishing (its process killed) is closed by the
    restart, whose own configuration plans more steps."""
    segment(tmp_path, CONFIG)
    run_dir = tmp_path / "r"
    log = (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
    cut = max(i for i, line in enumerate(log) if b'"run_finished"' in line)
    (run_dir / "events.jsonl").write_bytes(b"".join(log[:cut]))  # killed before finishing
    again = segment(tmp_path, {**CONFIG, "total_steps": 40}, wall_offset_ns=10**9)
    assert again.resumed is not None and again.resumed.previous_status is None
    summary = summary_of(run_dir)
    assert [s["status"] for s in summary["segments"]] == ["error", "ok"]
    assert [s["total_steps"] for s in summary["segments"]] == [4, 40]
    assert_replay_identical(run_dir, tmp_path / "replayed")


# -- what it may not, and what the caller is told ---------------------------------------


def test_a_changed_phase_definition_is_refused_naming_the_key_both_values_and_the_fix(
    tmp_path: Path,
) -> None:
    segment(tmp_path, CONFIG)
    run_dir = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    other = {**CONFIG, "phases": {"rollout": ["generate"], "train": ["train.fwd"]}}
    session = RunSession(out_dir=tmp_path, run_id="r", config=other, autoload=False, resume=True)
    with pytest.raises(ResumeConfigError) as caught:
        session.start()
    message = str(caught.value)
    assert message.startswith("run 'r' cannot resume with this configuration")
    assert "at ['phases'] (phases: {'rollout': ['generate'], 'train': ['train.*']} -> " in message
    assert "'train': ['train.fwd']}" in message
    assert "may change only total_steps and the caller's x_ keys" in message
    assert "pass RunSession(config=...) the run's configuration" in message
    assert "another run_id" in message
    assert caught.value.keys == ("phases",) and caught.value.run_id == "r"
    assert caught.value.logged["phases"] == CONFIG["phases"]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing changed
    segment(tmp_path, CONFIG, wall_offset_ns=10**9)  # the lock was given back


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("throughput", {"rollout": {"samples": "rollout", "devices": 4}}),
        ("window", {"samples": "train", "devices": 2}),
        ("streaming", {"generation": "rollout", "training": "train"}),
        ("finalise_lag", 3),
        ("clock_skew", {"ahead_s": 0.5}),
    ],
)
def test_every_key_that_shapes_the_figures_is_refused_by_name(
    tmp_path: Path, key: str, value: object
) -> None:
    segment(tmp_path, CONFIG)
    session = RunSession(
        out_dir=tmp_path, run_id="r", config={**CONFIG, key: value}, autoload=False, resume=True
    )
    with pytest.raises(ResumeConfigError, match=rf"at \['{key}'\] \({key}: "):
        session.start()


def test_a_replay_refuses_a_log_whose_resumed_segment_changes_a_phase(tmp_path: Path) -> None:
    """Only a log put together by hand gets there: the replay names the event and key."""
    segment(tmp_path, CONFIG)
    segment(tmp_path, CONFIG, wall_offset_ns=10**9)
    path = tmp_path / "r" / "events.jsonl"
    events = lines(path)
    for event in events:
        if event["type"] == "run_resumed":
            phases = {"rollout": ["generate"], "train": ["train.fwd"]}
            event["config"] = {**event["config"], "phases": phases}
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    with pytest.raises(
        ReplayError,
        match=r"run_resumed \(segment 1\) changes the configuration of run 'r' at "
        r"\['phases'\].*may change only total_steps",
    ):
        replay(edited, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- the demo ----------------------------------------------------------------------------

DEMO = ["demo", "--prompts", "2", "--completions", "2", "--micro-batch", "4"]
DEMO += ["--grad-accum", "1", "--no-progress", "--no-autoload", "--run-id", "d"]


def test_the_demo_rerun_with_another_iterations_resumes_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path)]
    assert main([*DEMO, *out, "--iterations", "2"]) == 0
    assert main([*DEMO, *out, "--iterations", "3", "--resume"]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "d"
    summary = summary_of(run_dir)
    assert summary["status"] == "ok" and summary["iterations"] == 5
    first, second = summary["segments"]
    # the whole run's plan: the 2 steps taken, then 3 more
    assert (first["total_steps"], second["total_steps"]) == (2, 5)
    assert second["config_changes"]["total_steps"] == 5
    assert second["config_changes"]["x_demo"]["iterations"] == 3
    assert {r["total_steps"] for r in lines(run_dir / "metrics.jsonl")} == {5}
    # each segment's producers count its own: 2 prompts x 2 completions an iteration,
    # one step each; the run's terminal totals add them up and match its events
    assert second["terminal_totals"] == {
        "samples_rollout": 12, "groups_rollout": 6, "samples_train": 12, "optimizer_updates": 3
    }  # fmt: skip
    assert summary["counts"]["samples_rollout"] == {
        "accumulated": 20, "terminal": 20, "final": 20, "discrepancy": 0
    }  # fmt: skip
    assert summary["counts"]["optimizer_updates"]["terminal"] == 5
    assert_replay_identical(run_dir, tmp_path / "replayed")


def test_the_demo_refuses_other_phases_saying_which_options_the_run_had(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path)]
    assert main([*DEMO, *out, "--iterations", "1"]) == 0
    capsys.readouterr()
    assert main([*DEMO, *out, "--iterations", "1", "--train-workers", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: run 'd' cannot resume with this configuration")
    assert "at ['lifecycle', 'phases', 'placement'] (lifecycle: (not set) -> " in err
    assert "resume run 'd' with the options it was started with (--engine torch " in err
    assert "--backend local --train-workers 1 --engines 2 without --sim-device)" in err
    # the engines are the run's workers too: named when they are what changed
    assert main([*DEMO, *out, "--iterations", "1", "--engines", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "at ['placement']" in err and "the demo's phases and workers follow" in err
    assert "--engines 2 without --sim-device)" in err
    assert "give --run-id a new id to start a new run" in err
    assert err.count("\n") == 1
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["status"] == "ok"


# -- TRL ---------------------------------------------------------------------------------


def _grpo(tmp: Path, callback: Any, *, max_steps: int) -> Any:
    """A tiny GRPOTrainer (Llama and tokenizer made in code, CPU) that checkpoints every
    2 steps into ``tmp / "trl"``."""
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    from twinkle.demo.hf import tiny_llama, write_tokenizer

    tokens = tmp / "tokenizer"
    if not tokens.exists():
        tokens.mkdir()
        write_tokenizer(tokens)

    def digits(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [sum(c.isdigit() for c in text) / 8 for text in completions]

    return GRPOTrainer(
        model=tiny_llama(seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(str(tokens)),
        reward_funcs=[digits],
        train_dataset=Dataset.from_dict({"prompt": ["<s>123<sep>", "<s>4051<sep>"] * 8}),
        args=GRPOConfig(
            output_dir=str(tmp / "trl"),
            max_steps=max_steps,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            logging_steps=1,
            report_to=[],
            save_strategy="steps",
            save_steps=2,
            use_cpu=True,
            disable_tqdm=True,
        ),
        callbacks=[callback],
    )


def test_a_trl_job_restarted_with_a_larger_max_steps_resumes_its_run(tmp_path: Path) -> None:
    """The job trains 2 steps, then is restarted from its checkpoint with max_steps=4: a
    new process, a new TwinkleCallback, the same run id and output directory."""
    pytest.importorskip("trl")
    from twinkle.integrations.trl import TwinkleCallback

    runs = str(tmp_path / "runs")
    _grpo(tmp_path, TwinkleCallback(out_dir=runs, run_id="grpo"), max_steps=2).train()
    restarted = _grpo(tmp_path, TwinkleCallback(out_dir=runs, run_id="grpo"), max_steps=4)
    restarted.train(resume_from_checkpoint=True)
    assert restarted.state.global_step == 4
    run_dir = tmp_path / "runs" / "grpo"
    events = lines(run_dir / "events.jsonl")
    assert [e["iteration"] for e in events if e["type"] == "iteration_started"] == [0, 1, 2, 3]
    assert [e["step"] for e in events if e["type"] == "optimizer_step"] == [1, 2, 3, 4]
    summary = summary_of(run_dir)
    assert summary["status"] == "ok" and summary["iterations"] == 4
    assert [s["total_steps"] for s in summary["segments"]] == [2, 4]
    assert summary["segments"][1]["config_changes"] == {"total_steps": 4}
    assert {r["total_steps"] for r in lines(run_dir / "metrics.jsonl")} == {4}
    assert_replay_identical(run_dir, tmp_path / "replayed")

    # Another device count would change every throughput: refused, saying what to pass.
    other = _grpo(tmp_path, TwinkleCallback(out_dir=runs, run_id="grpo", devices=2), max_steps=6)
    with pytest.raises(ResumeConfigError) as caught:
        other.train(resume_from_checkpoint=True)
    message = str(caught.value)
    assert "at ['throughput', 'window']" in message
    assert "pass TwinkleCallback(devices=1) as it was started with" in message
    assert "or pass another run_id (TwinkleCallback(run_id=...) other than 'grpo'" in message
    assert summary_of(run_dir) == summary  # the run is as it was


def test_a_training_on_other_ranks_than_the_runs_is_told_to_be_a_new_run() -> None:
    """The devices were read from the ranks (no devices= given): a resume on another
    number of ranks is this training's real count, so passing the old one would be
    wrong; the fix is a new run."""
    from types import SimpleNamespace

    from twinkle.errors import ResumeConfigError
    from twinkle.integrations._trl_config import resume_fix

    window = {"samples": "rollout"}
    exc = ResumeConfigError(
        "run 'r' cannot resume", "", run_id="r", keys=("throughput", "window"),
        logged={"window": {**window, "devices": 2}}, given={"window": {**window, "devices": 1}},
    )  # fmt: skip
    fix = resume_fix(SimpleNamespace(config=None, devices=None), exc)
    assert "this training runs on another number (its ranks)" in fix
    assert "observe it as a new run: pass another run_id" in fix and "devices=2" not in fix
    given = resume_fix(SimpleNamespace(config=None, devices=1), exc)
    assert given.startswith("the run counted 2 device(s): pass TwinkleCallback(devices=2)")


def test_a_run_an_older_twinkle_began_without_the_checkpoint_phase_is_told_so() -> None:
    from types import SimpleNamespace

    from twinkle.errors import ResumeConfigError
    from twinkle.integrations._trl_config import resume_fix

    older = {"train": ["train.step", "train.optimizer"], "step": ["step"]}
    exc = ResumeConfigError(
        "run 'r' cannot resume", "", run_id="r", keys=("phases",), logged={"phases": older},
        given={"phases": {**older, "checkpoint": ["save_checkpoint"]}},
    )  # fmt: skip
    fix = resume_fix(SimpleNamespace(config=None, devices=None, out_dir="runs"), exc)
    assert fix.startswith("the run began with an older twinkle's default phases (this one ")
    assert "the config of the run_started line of runs/r/events.jsonl" in fix
