"""TRL on several ranks observed as one run (twinkle.integrations._trl_ranks): a real
GRPO training under ``torchrun --standalone --nproc_per_node 2`` (gloo on the CPU,
loopback), and the merge of the ranks' samples worked by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from _recompute import check_run, span_list
from twinkle.errors import TwinkleError
from twinkle.integrations._trl_ranks import RankLink, merged_samples
from twinkle.run import replay

JOB = Path(__file__).with_name("_trl_ranks_job.py")
FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def _torchrun(
    out: Path, *args: int, ranks: int = 2, **environ: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **environ}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "--max-restarts=0",
        str(JOB),
        str(out),
        *map(str, args),
    ]
    return subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_example_script_runs_on_two_ranks(tmp_path: Path) -> None:
    """README's TRL example under torchrun: rank 0 prints the run, rank 1 ends quietly."""
    example = Path(__file__).parents[2] / "examples" / "trl_grpo.py"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "--max-restarts=0", str(example),
               "--steps", "2", "--out", str(tmp_path), "--run-id", "r"]  # fmt: skip
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(f"run: {tmp_path / 'r'}") == 1 and "discrepancy 0" in done.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["placement"]["window"]["devices"] == 2


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    done = _torchrun(out, 3)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_two_ranks_are_one_run_with_both_ranks_spans_and_memory(two_ranks: Path) -> None:
    run_dir = two_ranks / "r"
    assert sorted(p.name for p in two_ranks.iterdir() if (p / "events.jsonl").exists()) == ["r"]
    events = _events(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    sources = Counter(e["source"] for e in events if e["type"] == "spans")
    assert {"rank0", "rank1"} <= set(sources)  # (rank 0 named as the others are)
    names = {
        source: {s["name"] for e in events if e["type"] == "spans" and e["source"] == source
                 for s in span_list(e)}
        for source in ("rank0", "rank1")
    }  # fmt: skip
    for name in ("step", "train.step", "train.optimizer", "generate"):
        assert name in names["rank0"] and name in names["rank1"], name
    workers = {r["worker_id"] for e in events if e["type"] == "memory" for r in e["readings"]}
    assert workers == {"rank0", "rank1"}
    assert summary["placement"]["window"]["devices"] == 2
    assert [e["iteration"] for e in events if e["type"] == "iteration_started"] == [0, 1, 2]


def test_the_runs_tokens_are_every_ranks_as_trl_counts_them(two_ranks: Path) -> None:
    trl = json.loads((two_ranks / "trl.json").read_text())
    assert trl["world_size"] == 2 and trl["global_step"] == 3
    events = _events(two_ranks / "r")
    rollout = [e for e in events if e["type"] == "samples" and e["phase"] == "rollout"]
    # one event per step: both ranks' completions (4 each), in one group of 4 apiece
    assert [len(e["lengths"]) for e in rollout] == [8, 8, 8]
    assert [e["groups"] for e in rollout] == [2, 2, 2]
    assert sum(sum(e["lengths"]) for e in rollout) == trl["num_tokens"]
    summary = json.loads((two_ranks / "r" / "summary.json").read_text())
    assert summary["counts"]["tokens_rollout"]["discrepancy"] == 0
    assert summary["counts"]["optimizer_updates"]["discrepancy"] == 0
    # an update's samples are every rank's: 4 completions trained on each
    steps = [e["samples"] for e in events if e["type"] == "optimizer_step"]
    assert steps == [8, 8, 8]


def test_each_ranks_gathers_are_waits_inside_its_generation(two_ranks: Path) -> None:
    """TRL gathers the completions' lengths at the end of ``_generate``: the first rank
    there waits for the other, in a ``wait.gather`` span (docs/metrics.md, "Stragglers")
    inside its ``generate`` span, on the same thread."""
    events = _events(two_ranks / "r")
    for source in ("rank0", "rank1"):
        spans = [s for e in events if e["type"] == "spans" and e["source"] == source
                 for s in span_list(e)]  # fmt: skip
        generating = [s for s in spans if s["name"] == "generate"]
        gathers = [s for s in spans if s["name"] == "wait.gather"]
        inside = [
            w for w in gathers for g in generating
            if w["thread_id"] == g["thread_id"] and w["attrs"] == g["attrs"]
            and g["start_ns"] <= w["start_ns"] <= w["end_ns"] <= g["end_ns"]
        ]  # fmt: skip
        assert len({w["attrs"]["iteration"] for w in inside}) == 3, source


def test_the_figures_recompute_and_replay_gives_the_same_files(
    two_ranks: Path, tmp_path: Path
) -> None:
    check_run(two_ranks / "r")
    replay(two_ranks / "r" / "events.jsonl", tmp_path / "replayed")
    for name in FILES:
        assert (tmp_path / "replayed" / name).read_bytes() == (two_ranks / "r" / name).read_bytes()


@pytest.mark.parametrize("at", ["reward", "step_end"])
def test_a_killed_rank_is_named_in_the_runs_error(tmp_path: Path, at: str) -> None:
    """Rank 1 killed outright in step 2: in its reward function (the training's own
    collectives fail on rank 0), or as the step ends (the run's gather fails)."""
    done = _torchrun(tmp_path, 4, 1, 2, KILL_AT=at)
    assert done.returncode != 0
    summary_path = tmp_path / "r" / "summary.json"
    events = _events(tmp_path / "r")
    finished = [e for e in events if e["type"] == "run_finished"]
    assert finished, "rank 0 finished its run"
    error = finished[-1]["error"]
    assert finished[-1]["status"] == "error"
    assert "rank 1 (pid" in error and "died" in error, error
    assert summary_path.exists()
    # rank 0's own completions of the step it died in, held for the exchange, are kept
    rollout = {e["iteration"]: len(e["lengths"]) for e in events
               if e["type"] == "samples" and e["phase"] == "rollout"}  # fmt: skip
    assert rollout == {0: 8, 1: 4}


def test_an_error_on_every_rank_finishes_the_run_with_that_error(tmp_path: Path) -> None:
    """Every rank's reward function raises at step 2: the run's error is that one, no
    rank is said to have died, and the run's end is written (SIGTERM held meanwhile)."""
    done = _torchrun(tmp_path, 4, RAISE_AT="2")
    assert done.returncode != 0
    (finished,) = [e for e in _events(tmp_path / "r") if e["type"] == "run_finished"]
    assert finished["status"] == "error"
    assert finished["error"] == "ValueError: the reward function failed on rank 0"
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "error"


def test_a_callback_on_rank_0_alone_says_to_give_every_rank_one(tmp_path: Path) -> None:
    done = _torchrun(tmp_path, 2, BARE_RANK="1")  # (the ranks wait 5 s to join)
    assert done.returncode != 0
    assert "give every rank the same TwinkleCallback (not rank 0's alone)" in done.stderr
    assert not (tmp_path / "r").exists()


def test_a_run_rank_0_cannot_start_stops_every_rank_saying_why(tmp_path: Path) -> None:
    """A second ``train()`` from step 0 on the run that finished ok: rank 0 refuses it
    (FinishedRunError), and the other rank raises too instead of training unobserved
    or waiting in a collective."""
    done = _torchrun(tmp_path, 1, TRAIN_AGAIN="1")
    assert done.returncode != 0
    assert "FinishedRunError" in done.stderr
    assert "rank 0 could not start twinkle's run: FinishedRunError" in done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "ok" and len(summary["segments"]) == 1


def test_the_ranks_samples_merge_per_iteration_and_phase() -> None:
    """Rank 0 held 2 rollout completions of iteration 4 (prompts 3, 3) and 2 train
    samples; rank 1 2 completions (prompts 5, 5) and train samples without prompts.
    Groups of 4 spread over the ranks: 4 completions make 1; train samples have none."""
    parts = [
        [
            {"iteration": 4, "phase": "rollout", "lengths": [7, 8], "prompt_lengths": [3, 3],
             "per_group": 4},
            {"iteration": 4, "phase": "train", "lengths": [7, 8], "prompt_lengths": [3, 3]},
        ],
        [
            {"iteration": 4, "phase": "rollout", "lengths": [9, 6], "prompt_lengths": [5, 5],
             "per_group": 4},
            {"iteration": 4, "phase": "train", "lengths": [9, 6], "prompt_lengths": []},
        ],
    ]  # fmt: skip
    assert merged_samples(parts) == [
        {"iteration": 4, "phase": "rollout", "lengths": [7, 8, 9, 6],
         "prompt_lengths": [3, 3, 5, 5], "groups": 1},
        {"iteration": 4, "phase": "train", "lengths": [7, 8, 9, 6], "prompt_lengths": (),
         "groups": 0},
    ]  # fmt: skip
    three = [{"iteration": 1, "phase": "rollout", "lengths": [1, 2, 3], "per_group": 4}]
    assert merged_samples([three])[0]["groups"] == 0  # (3 completions: no whole group)


def test_several_ranks_without_a_process_group_say_how_to_launch() -> None:
    with pytest.raises(TwinkleError, match=r"torch\.distributed has no process group; launch"):
        RankLink(0, 2)
