"""A streaming run's stragglers across a restart: the checkpoint holds the steady
state's ratios alone (every iteration's are dropped once a steady iteration is folded
in), and a resume from it writes what a resume from the whole log writes.

Three engines generate 100 tokens each per iteration: e0 in 10 ms, e1 in 10 ms but 45
on every fifth iteration (from the second), e2 in 30 ms but 10 on every third. e2 is
slow on two iterations in three (chronic), e1 on about one in five (one-off)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import orjson

from reliability._scripted import WALL0
from reliability.test_checkpoint import _outputs
from reliability.test_reliability_resume import assert_replay_identical
from twinkle.perf import ManualClock, Span
from twinkle.run import RunSession
from twinkle.run._checkpoint import CHECKPOINT_FILE, _Unpickler

MS = 1_000_000
HOUR = 3600 * 10**9
STREAMING: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 3}},
    "window": {"samples": "rollout", "devices": 3},
    "streaming": {"generation": "rollout", "training": "train"},
}


def _ms(it: int) -> tuple[int, int, int]:
    return 10, 45 if it % 5 == 2 else 10, 10 if it % 3 == 0 else 30


def _segment(out: Path, iterations: int, hour: int) -> RunSession:
    """One process's stretch of run ``r``, continuing where its log stopped."""
    clock = ManualClock(10**9)
    session = RunSession(
        out_dir=out,
        run_id="r",
        config=STREAMING,
        autoload=False,
        clock=clock,
        wall_clock=lambda: WALL0 + hour * HOUR + clock(),
        background_writer=False,
        background_dispatch=False,
        resume=True,
    )
    with session as run:
        first = 0 if run.resumed is None else run.resumed.next_iteration
        for it in range(first, first + iterations):
            run.bus.iteration_started(it)
            at = clock()
            spans = [Span("train.step", at, at + 50 * MS, 1, 1, {"iteration": it}, None)]
            for e, ms in enumerate(_ms(it)):
                attrs = {"iteration": it, "engine": f"e{e}", "tokens": 100}
                spans.append(Span("generate", at, at + ms * MS, 10 + e, 1, attrs, None))
            clock.advance(99 * MS)
            run.bus.publish_spans("main", run.bus.anchor, spans)
            clock.advance(MS)
    return session


def _ledger(run_dir: Path) -> Any:
    payload = (run_dir / CHECKPOINT_FILE).read_bytes().partition(b"\n")[2]
    return _Unpickler(io.BytesIO(payload)).load()["observers"]["timing"]["stragglers"]


def test_a_streaming_runs_stragglers_resume_from_the_checkpoint_as_from_the_log(
    tmp_path: Path,
) -> None:
    with_, without = tmp_path / "with", tmp_path / "without"
    _segment(with_, iterations=8, hour=0)
    ledger = _ledger(with_ / "r")
    assert "generation" not in ledger.every  # (the steady state's ratios alone)
    assert len(ledger.steady["generation"].verdicts["e2"].ratios) > 0
    shutil.copytree(with_, without)
    (without / "r" / CHECKPOINT_FILE).unlink()

    a = _segment(with_, iterations=7, hour=1)
    b = _segment(without, iterations=7, hour=1)
    assert a.resumed is not None and b.resumed is not None
    assert a.resumed.restored_events > 0 and b.resumed.restored_events == 0
    assert _outputs(with_ / "r") == _outputs(without / "r")
    summary = orjson.loads((with_ / "r" / "summary.json").read_bytes())
    workers = summary["limits"]["stragglers"]["generation"]["workers"]
    assert [workers[e]["verdict"] for e in ("e0", "e1", "e2")] == ["ok", "one-off", "chronic"]
    assert workers["e2"]["compared_iterations"] > 8  # (both segments' steady iterations)
    assert_replay_identical(with_ / "r", tmp_path)
