"""Stragglers (issue 28), on a scripted run with a manual clock: each engine's seconds
per token against its peers' median, worked out by hand.

Three engines generate 100 tokens each per iteration; iterations 0-5, so 1-4 are the
steady state (0 warm-up, 5 drain). Generation times (ms)::

    iteration   e0   e1   e2
    1           10   10   30     e2: 3.0x its peers' median (0.1 ms/token): slow
    2           10   40   30     e1: 4 / median(1, 3) = 2.0x: slow; e2: 3 / 2.5 = 1.2x
    3           10   10   30     e2: 3.0x: slow
    4           10   10   30     e2 generates 300 tokens, 3x the median 100: not comparable

e2 is slow in 2 of the 3 iterations compared: chronic; e1 in 1: one-off. The trainer
is one worker (the run's own process): its side is not compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from observers.test_scripted_run import manual_session
from twinkle.observers._stragglers import StragglerLedger, _Iteration, _peer_medians, _Work
from twinkle.perf import Span

MS = 1_000_000
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 3}},
    "window": {"samples": "rollout", "devices": 3},
    "streaming": {"generation": "rollout", "training": "train"},
}
TIMES = {1: (10, 10, 30), 2: (10, 40, 30), 3: (10, 10, 30), 4: (10, 10, 30)}
#: (iteration, engine) that generates 300 tokens (the others 100)
LONG = (4, 2)


def _spans(it: int, times: Mapping[int, tuple[int, ...]], long: tuple[int, int]) -> list[Span]:
    at = it * 100
    ms_by_engine = times.get(it, (10,) * len(times[1]))
    out = [Span("train.step", at * MS, (at + 50) * MS, 1, 1, {"iteration": it}, None)]
    for e, ms in enumerate(ms_by_engine):
        tokens = 300 if (it, e) == long else 100
        attrs = {"iteration": it, "engine": f"e{e}", "tokens": tokens}
        out.append(Span("generate", at * MS, (at + ms) * MS, 10 + e, 1, attrs, None))
    return out


def _stragglers(
    out: Path, times: Mapping[int, tuple[int, ...]], long: tuple[int, int] = (-1, -1)
) -> dict[str, Any]:
    run, clock = manual_session(out, "s", CONFIG)
    for it in range(6):
        clock.set(it * 100 * MS)
        run.bus.iteration_started(it)
        clock.set((it * 100 + 99) * MS)
        run.bus.publish_spans("main", run.bus.anchor, _spans(it, times, long))
    clock.set(600 * MS)
    run.finish()
    assert run.out_dir is not None
    summary = orjson.loads((run.out_dir / "summary.json").read_bytes())
    return summary["limits"]["stragglers"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stragglers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _stragglers(tmp_path_factory.mktemp("stragglers"), TIMES, LONG)


def test_a_chronic_straggler_and_a_one_off_are_told_apart(stragglers: dict[str, Any]) -> None:
    generation = stragglers["generation"]
    assert generation["unit"] == "token"
    assert generation["iterations_compared"] == 3
    workers = generation["workers"]
    assert workers["e2"]["verdict"] == "chronic"
    assert (workers["e2"]["slow_iterations"], workers["e2"]["compared_iterations"]) == (2, 3)
    assert workers["e2"]["median_ratio_to_peers"] == pytest.approx(3.0)
    assert workers["e2"]["seconds_per_token"] == pytest.approx(0.090 / 300)
    assert workers["e1"]["verdict"] == "one-off"
    assert workers["e1"]["median_ratio_to_peers"] == pytest.approx(0.5)
    assert workers["e0"]["verdict"] == "ok" and workers["e0"]["slow_iterations"] == 0


def test_a_worker_slow_in_exactly_half_of_the_iterations_is_one_off(tmp_path: Path) -> None:
    """Two engines; e1 takes 20 ms against e0's 10 on iterations 1 and 3 (2.0x: slow)
    and 10 on 2 and 4 (1.0x): slow in 2 of 4, not more than half, so one-off, though
    its median ratio, (1.0 + 2.0) / 2, reaches 1.5. A third slow iteration makes it
    chronic."""
    half = {1: (10, 20), 2: (10, 10), 3: (10, 20), 4: (10, 10)}
    e1 = _stragglers(tmp_path / "half", half)["generation"]["workers"]["e1"]
    assert (e1["slow_iterations"], e1["compared_iterations"]) == (2, 4)
    assert e1["median_ratio_to_peers"] == pytest.approx(1.5)
    assert e1["verdict"] == "one-off"
    most = {**half, 4: (10, 20)}
    assert _stragglers(tmp_path / "most", most)["generation"]["workers"]["e1"]["verdict"] == (
        "chronic"
    )


def _gathering_ranks(it: int) -> dict[str, list[Span]]:
    """Two ranks' ``generate`` spans (100 tokens each) whose ends meet in a collective,
    as TRL's gather of the completions' lengths does. At ``at = it * 100`` ms:

    * rank0 (late, it saved a checkpoint) generates over [at+40, at+60) on thread 1:
      20 ms; its thread 2 waits for weights over [at+40, at+55) (not inside the span's
      thread: not taken off);
    * rank1 generates over [at, at+60) on thread 1, of which [at+20, at+60) is
      ``wait.gather`` (taken off: 20 ms of work), then waits [at+60, at+70) outside it.

    Both then took 20 ms for 100 tokens: ratio 1.0, no straggler. Counting the wait
    inside as work, rank1 would be 3.0x its peer: chronic."""
    at = it * 100

    def span(name: str, lo: int, hi: int, thread: int, **attrs: Any) -> Span:
        return Span(
            name, (at + lo) * MS, (at + hi) * MS, thread, 1, {"iteration": it, **attrs}, None
        )

    return {
        "rank0": [
            span("generate", 40, 60, 1, tokens=100),
            span("wait.weights", 40, 55, 2),
        ],
        "rank1": [
            span("wait.gather", 20, 60, 1),
            span("generate", 0, 60, 1, tokens=100),
            span("wait.gather", 60, 70, 1),
        ],
    }


def test_a_rank_waiting_in_a_collective_inside_its_span_is_no_straggler(tmp_path: Path) -> None:
    run, clock = manual_session(tmp_path, "gather", CONFIG)
    for it in range(6):
        clock.set(it * 100 * MS)
        run.bus.iteration_started(it)
        clock.set((it * 100 + 99) * MS)
        for source, spans in _gathering_ranks(it).items():
            run.bus.publish_spans(source, run.bus.anchor, spans)
    clock.set(600 * MS)
    run.finish()
    assert run.out_dir is not None
    summary = orjson.loads((run.out_dir / "summary.json").read_bytes())
    generation = summary["limits"]["stragglers"]["generation"]
    assert generation["iterations_compared"] == 4
    for rank in ("rank0", "rank1"):
        worker = generation["workers"][rank]
        assert worker["verdict"] == "ok" and worker["median_ratio_to_peers"] == 1.0
        assert worker["seconds_per_token"] == pytest.approx(0.080 / 400)


def test_an_iteration_whose_workloads_differ_is_not_compared(stragglers: dict[str, Any]) -> None:
    assert stragglers["generation"]["abstained"] == {
        "a worker's tokens lay beyond 2x the median: not comparable": 1
    }


def test_a_side_with_one_worker_is_not_compared_saying_why(stragglers: dict[str, Any]) -> None:
    assert stragglers["training"] == {
        "unit": None,
        "iterations_compared": 0,
        "abstained": {"fewer than two workers did this side's work": 4},
        "workers": {},
    }


def test_every_iterations_ratios_go_once_the_steady_state_has_one() -> None:
    """Two engines, 100 tokens each; e1 takes 30 ms against e0's 10 on warm-up
    iteration 0 (3.0x), 10 on steady iterations 1-2 (1.0x), 50 on drain iteration 3.
    Before a steady iteration the summary is every iteration's; after, the steady
    state's alone, and the ledger keeps no other ratios (its state grows by those)."""
    ledger = StragglerLedger()

    def fold(it: int, e1_ms: int, steady: bool) -> None:
        ledger.work["generation"][it] = _Iteration(
            {
                name: _Work(ns=ms * MS, tokens=100, spans=1, with_tokens=1)
                for name, ms in (("e0", 10), ("e1", e1_ms))
            }
        )
        ledger.finalise(it, steady)

    fold(0, 30, steady=False)
    e1 = ledger.summary()["generation"]["workers"]["e1"]
    assert (e1["median_ratio_to_peers"], e1["compared_iterations"]) == (3.0, 1)
    fold(1, 10, steady=True)
    fold(2, 10, steady=True)
    fold(3, 50, steady=False)
    assert "generation" not in ledger.every and "training" in ledger.every
    e1 = ledger.summary()["generation"]["workers"]["e1"]
    assert (e1["median_ratio_to_peers"], e1["compared_iterations"]) == (1.0, 2)
    assert e1["seconds_per_token"] == pytest.approx(0.020 / 200)


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=2, max_size=40))
def test_each_workers_peer_median_is_the_median_of_the_others(rates: list[float]) -> None:
    by_worker = {f"w{i}": r for i, r in enumerate(rates)}
    assert _peer_medians(by_worker) == {
        w: statistics.median([r for v, r in by_worker.items() if v != w]) for w in by_worker
    }
