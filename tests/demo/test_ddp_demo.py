"""``twinkle demo --train-workers 2``: the trainer as two ``torch.distributed`` ranks, DDP
over gloo on the CPU, observed as one run.

One 3-iteration run checks that:

* it learns what the one-rank demo learns (the same rollouts; the losses equal to
  float rounding, since the gradients are summed in another order);
* rank 1's spans come from its own process, on its own clock anchor;
* both ranks give a memory reading every iteration;
* every rank-1 span lies inside its iteration's window on the driver's timeline,
  within a millisecond;
* the figures recompute from the log, and replay is byte-identical.

A second run loses rank 1 (SIGKILL) after its second iteration. The loop stops within
seconds with a WorkerError naming the rank, and the files keep every record before it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from _recompute import check_replay, check_run, placed_spans, read_events, windows
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import DemoResult, run_demo
from twinkle.errors import WorkerError

pytestmark = pytest.mark.timeout(600)

CFG = DemoConfig(iterations=3, prompts_per_iteration=8, completions_per_prompt=4, micro_batch=8)
TOLERANCE_NS = 1_000_000


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    out = tmp_path_factory.mktemp("ddp-demo")
    cfg = dataclasses.replace(CFG, train_workers=2)
    return run_demo(cfg, out_dir=out, run_id="ddp", autoload=False)


def test_two_ranks_learn_what_one_learns(two_ranks: DemoResult) -> None:
    one = run_demo(CFG, out_dir=None, autoload=False)
    assert two_ranks.trajectories[0] == one.trajectories[0]  # the same first rollouts
    assert [r.loss for r in two_ranks.iterations] == pytest.approx(
        [r.loss for r in one.iterations], rel=1e-4
    )
    assert [r.reward_mean for r in two_ranks.iterations] == pytest.approx(
        [r.reward_mean for r in one.iterations], abs=0.02
    )
    assert [r.optimizer_steps for r in two_ranks.iterations] == [
        r.optimizer_steps for r in one.iterations
    ]
    assert two_ranks.summary["status"] == "ok"
    assert two_ranks.summary["counts"]["optimizer_updates"]["discrepancy"] == 0


def test_rank_one_reports_spans_and_memory_from_its_own_process(two_ranks: DemoResult) -> None:
    assert two_ranks.run_dir is not None
    events = read_events(two_ranks.run_dir)
    driver = events[0]["anchor"]["pid"]
    rank1 = [e for e in events if e["type"] == "spans" and e["source"] == "rank1"]
    assert rank1 and {e["anchor"]["pid"] for e in rank1} != {driver}
    names = {s["name"] for e in rank1 for s in e["spans"]}
    assert {"advantage", "old_logprobs", "train.forward", "train.backward"} <= names
    for it in range(3):  # one event per iteration, both ranks in it: one reduction
        (event,) = [e for e in events if e["type"] == "memory" and e["iteration"] == it]
        readings = event["readings"]
        assert {r["rank"] for r in readings} == {0, 1}, it
        (mine,) = [r for r in readings if r["rank"] == 1]
        assert mine["worker_id"] == "rank1" and mine["pid"] == rank1[0]["anchor"]["pid"]
        # rank 0 is the run's process, named as the placement names it
        (zero,) = [r for r in readings if r["rank"] == 0]
        assert zero["worker_id"] == "rank0" and zero["pid"] == driver
    assert two_ranks.summary["spans"]["sources"]["rank1"]["dropped"] == 0


def test_rank_one_spans_lie_inside_their_iteration_windows(two_ranks: DemoResult) -> None:
    assert two_ranks.run_dir is not None
    events = read_events(two_ranks.run_dir)
    window = windows(events)
    placed = placed_spans(events, {"rank1"})
    for _, span, start, end in placed:
        lo, hi = window[span["attrs"]["iteration"]]
        assert lo - TOLERANCE_NS <= start <= end <= hi + TOLERANCE_NS, span
    assert len(placed) > 10


def test_the_figures_recompute_and_replay_is_byte_identical(
    two_ranks: DemoResult, tmp_path: Path
) -> None:
    assert two_ranks.run_dir is not None
    check_run(two_ranks.run_dir)
    check_replay(two_ranks.run_dir, tmp_path / "again")


@pytest.mark.parametrize(
    ("micro_batch", "grad_accum"),
    [
        pytest.param(3, 3, id="uneven-shares"),  # steps of 9: 5 and 4 samples, 3 and 2 micro
        pytest.param(31, 1, id="a-zero-share"),  # a tail step of 1 sample: rank 1 gets none
    ],
)
def test_uneven_and_empty_shares_train_what_one_rank_trains(
    micro_batch: int, grad_accum: int
) -> None:
    cfg = dataclasses.replace(CFG, iterations=2, micro_batch=micro_batch, grad_accum=grad_accum)
    one = run_demo(cfg, out_dir=None, autoload=False)
    two = run_demo(dataclasses.replace(cfg, train_workers=2), out_dir=None, autoload=False)
    assert [r.loss for r in two.iterations] == pytest.approx(
        [r.loss for r in one.iterations], rel=1e-4
    )
    assert [r.optimizer_steps for r in two.iterations] == [
        r.optimizer_steps for r in one.iterations
    ]


def _rank_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children() if any("spawn_main" in part for part in p.cmdline())
    ]


def test_a_killed_rank_stops_the_run_promptly_naming_it(tmp_path: Path) -> None:
    killed: list[float] = []

    def kill_after_two(result: Any) -> None:
        if result.iteration == 1:
            (rank1,) = _rank_processes()
            os.kill(rank1.pid, signal.SIGKILL)
            killed.append(time.monotonic())

    cfg = dataclasses.replace(CFG, train_workers=2, iterations=20)
    with pytest.raises(WorkerError, match=r"worker 'rank1' \(torch.distributed rank 1, pid"):
        run_demo(cfg, out_dir=tmp_path, run_id="killed", progress=kill_after_two, autoload=False)
    assert killed and time.monotonic() - killed[0] < 30
    assert _rank_processes() == []  # nothing left behind
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["status"] == "error" and "rank1" in summary["error"]
    events = read_events(tmp_path / "killed")
    assert [e["iteration"] for e in events if e["type"] == "iteration_started"][:2] == [0, 1]
    assert sum(1 for e in events if e["type"] == "optimizer_step") >= 2
