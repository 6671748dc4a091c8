"""``twinkle demo --backend ray``: the engines and the trainer as Ray actors on the test
session's loopback cluster, observed as one run.

One 3-iteration run checks that:

* it learns exactly what the local demo learns: same tokens, rewards and losses;
* spans come from every worker process, each on its own clock anchor;
* memory readings come from every worker;
* every worker span lies where it ran on the driver's timeline, within a millisecond:
  the trainer's inside its iteration's window, an engine's rollout of iteration ``i``
  between window ``i - 1``'s start (with streaming it runs one ahead on version
  ``i - 1``; iterations 0 and 1 on version 0, from the run's start) and the end of
  window ``i``;
* the figures recompute from the log, and replay is byte-identical.

A second run loses an engine actor (``ray.kill``) after its second iteration. The
loop stops within seconds with a WorkerError naming the engine, and the run's files
keep every record written before, with status ``error``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from _recompute import check_replay, check_run, placed_spans, read_events, windows
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import DemoResult, run_demo
from twinkle.errors import DriverError, WorkerError

pytestmark = pytest.mark.timeout(600)

CFG = DemoConfig(iterations=3, prompts_per_iteration=8, completions_per_prompt=4, micro_batch=16)
TOLERANCE_NS = 1_000_000


@pytest.fixture(scope="module")
def on_ray(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    out = tmp_path_factory.mktemp("ray-demo")
    return run_demo(
        dataclasses.replace(CFG, backend="ray"), out_dir=out, run_id="ray", autoload=False
    )


def test_the_ray_demo_learns_what_the_local_demo_learns(on_ray: DemoResult, tmp_path: Path) -> None:
    local = run_demo(CFG, out_dir=None, autoload=False)
    assert [r.reward_mean for r in on_ray.iterations] == [r.reward_mean for r in local.iterations]
    assert [r.loss for r in on_ray.iterations] == [r.loss for r in local.iterations]
    assert on_ray.trajectories == local.trajectories
    assert on_ray.summary["status"] == "ok"
    assert on_ray.summary["counts"]["optimizer_updates"]["discrepancy"] == 0


def test_spans_and_memory_come_from_every_worker_process(on_ray: DemoResult) -> None:
    assert on_ray.run_dir is not None
    events = read_events(on_ray.run_dir)
    driver_pid = events[0]["anchor"]["pid"]
    batches = [e for e in events if e["type"] == "spans"]
    pids = {e["source"]: e["anchor"]["pid"] for e in batches}
    workers = {"engine0", "engine1", "trainer"}
    assert workers <= set(pids)
    assert len({pids[w] for w in workers} | {driver_pid}) == 4  # four processes
    names = {e["source"]: {s["name"] for s in e["spans"]} for e in batches}
    assert {"generate", "reward"} <= names["engine0"] and {"generate"} <= names["engine1"]
    assert {"advantage", "old_logprobs"} <= names["trainer"]
    sources = on_ray.summary["spans"]["sources"]
    assert all(sources[w]["spans"] > 0 and sources[w]["dropped"] == 0 for w in workers)
    readings = [r for e in events if e["type"] == "memory" for r in e["readings"]]
    by_worker = {r["worker_id"]: r["pid"] for r in readings}
    for worker in workers:
        assert by_worker[worker] == pids[worker]
    # Each iteration's memory record holds the readings taken in its window: the
    # trainer's every time (read at the end of its training), an engine's where its
    # report arrived (after a rollout, or its drain after the last), which may be the
    # next window; every worker is in some record.
    records = [
        json.loads(x) for x in (on_ray.run_dir / "metrics_raw.jsonl").read_text().splitlines()
    ]
    seen = {r["iteration"]: set(r["attrs"]["workers"]) for r in records if r["kind"] == "memory"}
    assert sorted(seen) == [0, 1, 2]
    assert all("trainer" in found for found in seen.values()), seen
    assert workers <= set().union(*seen.values()), seen


def test_worker_spans_lie_where_they_ran_on_the_drivers_timeline(on_ray: DemoResult) -> None:
    assert on_ray.run_dir is not None
    events = read_events(on_ray.run_dir)
    window = windows(events)
    run_start = events[0]["monotonic_ns"]
    checked = 0
    for source, span, start, end in placed_spans(events, {"engine0", "engine1", "trainer"}):
        it = span["attrs"].get("iteration")
        if it is None:
            continue
        if source == "trainer":
            earliest = window[it][0]
        else:  # rollouts of iteration i run on version i - 1: from window i - 1 on
            earliest = run_start if it <= 1 else window[it - 1][0]
        assert earliest - TOLERANCE_NS <= start <= end <= window[it][1] + TOLERANCE_NS, span
        checked += 1
    assert checked > 20


def test_the_figures_recompute_and_replay_is_byte_identical(
    on_ray: DemoResult, tmp_path: Path
) -> None:
    assert on_ray.run_dir is not None
    check_run(on_ray.run_dir)
    check_replay(on_ray.run_dir, tmp_path / "again")


def test_a_killed_engine_stops_the_run_promptly_naming_it(ray_cluster: Any, tmp_path: Path) -> None:
    from twinkle.demo.ray_rig import actor_name

    ray = ray_cluster
    killed: list[float] = []

    def kill_after_two(result: Any) -> None:
        if result.iteration == 1:
            ray.kill(ray.get_actor(actor_name("killed", "engine0")))
            killed.append(time.monotonic())

    # The engine's producer fails first: the driver's error names it and chains its own.
    with pytest.raises(DriverError, match="worker 'engine0' \\(a Ray actor\\) died") as failed:
        run_demo(
            dataclasses.replace(CFG, backend="ray", iterations=20),
            out_dir=tmp_path,
            run_id="killed",
            progress=kill_after_two,
            autoload=False,
        )
    assert isinstance(failed.value.__cause__, WorkerError)
    assert killed and time.monotonic() - killed[0] < 30
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["status"] == "error" and "engine0" in summary["error"]
    events = read_events(tmp_path / "killed")
    assert [e["iteration"] for e in events if e["type"] == "iteration_started"][:2] == [0, 1]
    steps = [e for e in events if e["type"] == "optimizer_step"]
    assert len(steps) >= 2  # (one step per iteration) the finished iterations' are kept


@pytest.mark.timeout(180)
def test_an_actor_that_raises_reaches_the_caller_naming_it(ray_cluster: Any) -> None:
    """An engine actor whose method raises: the driver's handle raises a WorkerError that
    names the engine and carries the actor's own error."""
    from twinkle.demo.ray_rig import ray_workers
    from twinkle.run import RunSession

    cfg = dataclasses.replace(CFG, backend="ray", engines=1)
    with (
        RunSession(out_dir=None, config={}, autoload=False) as run,
        ray_workers(cfg, run, 0, lambda it, step, n: None) as workers,
    ):
        (engine,) = workers.engines
        with pytest.raises(WorkerError, match=r"worker 'engine0' \(a Ray actor\) raised") as err:
            engine.load_weights(0, {"not": "a state dict"})  # (version 0 waits for nothing)
        cause = err.value.__cause__  # the actor's own error, chained (not Ray's wrapper)
        assert isinstance(cause, RuntimeError) and "state_dict" in str(cause)
        assert not isinstance(cause, ray_cluster.exceptions.RayError)
        assert f"raised {type(cause).__name__}" in str(err.value)
        assert workers.pids["engine0"] != workers.pids["trainer"]
