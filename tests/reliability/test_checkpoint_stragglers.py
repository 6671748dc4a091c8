"""A streaming run's stragglers across a restart: the checkpoint holds the steady
state's ratios alone (every iteration's are dropped once a steady iteration is folded
in), and a resume from it writes what a resume from the whole log writes.

Three engines generate 100 tokens each per iteration: e0 in 10 ms, e1 in 10 ms but 45
on every fifth iteration (from the second), e2 in 30 ms but 10 on every third. e2 is
slow on two iterations in three (chronic), e1 on about one in five (one-off)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from observers.test_stragglers import CONFIG
from reliability._scripted import segment_session
from reliability.test_checkpoint import HOUR, assert_resumes_agree
from twinkle.perf import Span
from twinkle.run import RunSession
from twinkle.run._checkpoint import CHECKPOINT_FILE, Checkpoint, load

MS = 1_000_000


def _ms(it: int) -> tuple[int, int, int]:
    return 10, 45 if it % 5 == 2 else 10, 10 if it % 3 == 0 else 30


def _segment(out: Path, iterations: int, hour: int) -> RunSession:
    """One process's stretch of run ``r``, continuing where its log stopped."""
    session, clock = segment_session(out, CONFIG, wall_offset_ns=hour * HOUR)
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
    """The straggler ledger in the run's checkpoint, read as a resume reads it."""
    header = orjson.loads((run_dir / CHECKPOINT_FILE).read_bytes().partition(b"\n")[0])
    checkpoint = load(run_dir, "r", header["observers"])
    assert isinstance(checkpoint, Checkpoint), checkpoint
    return checkpoint.state()["observers"]["timing"]["stragglers"]


def test_a_streaming_runs_stragglers_resume_from_the_checkpoint_as_from_the_log(
    tmp_path: Path,
) -> None:
    _segment(tmp_path / "with", iterations=8, hour=0)
    ledger = _ledger(tmp_path / "with" / "r")
    assert "generation" not in ledger.every  # (the steady state's ratios alone)
    assert len(ledger.steady["generation"].verdicts["e2"].ratios) > 0
    assert_resumes_agree(tmp_path, lambda out: _segment(out, iterations=7, hour=1))
    summary = orjson.loads((tmp_path / "with" / "r" / "summary.json").read_bytes())
    workers = summary["limits"]["stragglers"]["generation"]["workers"]
    assert [workers[e]["verdict"] for e in ("e0", "e1", "e2")] == ["ok", "one-off", "chronic"]
    assert workers["e2"]["compared_iterations"] > 8  # (both segments' steady iterations)
