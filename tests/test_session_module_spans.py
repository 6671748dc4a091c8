"""Module-level ``twinkle.perf.span``/``@timed`` reach the run in progress, on any thread;
every publish is twinkle's own time (overhead), event building included."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import span_list
from twinkle import perf
from twinkle.errors import InvalidArgumentError
from twinkle.hookspecs import hookimpl
from twinkle.perf import ManualClock
from twinkle.run import RunSession


def _spans(run_dir: Path) -> list[dict[str, Any]]:
    events = [orjson.loads(x) for x in (run_dir / "events.jsonl").read_bytes().splitlines()]
    return [s for e in events if e["type"] == "spans" for s in span_list(e)]


@perf.timed("decorated")
def _work() -> int:
    return 1


def test_module_level_spans_on_any_thread_reach_the_run(tmp_path: Path) -> None:
    config = {"phases": {"work": ["main.*", "thread.*", "decorated"]}}
    with RunSession(out_dir=tmp_path, run_id="mod", config=config, autoload=False) as run:
        run.bus.iteration_started(0)
        with perf.span("main.step", iteration=0):
            _work()
        worker = threading.Thread(
            target=lambda: perf.span("thread.step").__enter__().__exit__(None, None, None)
        )
        worker.start()
        worker.join()
    names = {s["name"] for s in _spans(tmp_path / "mod")}
    assert {"main.step", "thread.step", "decorated"} <= names
    # after the run, module-level spans go back to the process default recorder
    with perf.span("after"):
        pass
    assert perf.current_recorder() is not run.recorder


def test_two_runs_in_progress_make_module_level_spans_an_error_that_says_what_to_do() -> None:
    first = RunSession(out_dir=None, run_id="one", autoload=False).start()
    second = RunSession(out_dir=None, run_id="two", autoload=False).start()
    try:
        with pytest.raises(InvalidArgumentError, match=r"2 runs.*run\.recorder.*use_recorder"):
            with perf.span("ambiguous"):
                pass
        with perf.use_recorder(second.recorder):  # the fix the message names
            with perf.span("chosen"):
                pass
    finally:
        second.finish()
    with perf.span("only-one-left"):  # one run left: unambiguous again
        pass
    summary = first.finish()
    assert summary["spans"]["total"] == 1


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_every_publish_is_an_overhead_span_on_its_thread(tmp_path: Path, background: bool) -> None:
    """Inline, the observers' work is inside the publish's span; with background
    dispatch, inside the dispatch thread's span of the batch holding the event."""
    clock = ManualClock(0)

    class Slow:
        @hookimpl
        def twinkle_samples(self, event: object) -> None:
            clock.advance(3_000_000)  # the observers' work

    with RunSession(
        out_dir=tmp_path,
        run_id="own",
        clock=clock,
        autoload=False,
        plugins=[("slow", Slow())],
        background_writer=False,
        background_dispatch=background,
    ) as run:
        run.bus.iteration_started(0)
        clock.advance(10_000_000)
        run.bus.samples(iteration=0, phase="x", lengths=[1])
        assert run.dispatcher is not None
        run.dispatcher.flush()  # (the dispatch thread's clock reads before this one's)
        clock.advance(10_000_000)
    over = [s for s in _spans(tmp_path / "own") if s["name"] == "twinkle.observe"]
    events = {s["attrs"]["event"] for s in over}
    assert {"run_started", "iteration_started", "samples"} <= events
    lengths = {(s["attrs"]["event"], s["end_ns"] - s["start_ns"]) for s in over}
    slow = "dispatch" if background else "samples"
    assert (slow, 3_000_000) in lengths
    assert {n for e, n in lengths if e != slow} == {0}  # nothing else moved the clock
    threads = {s["attrs"]["event"]: s["thread_id"] for s in over}
    assert (threads[slow] == threads["iteration_started"]) is not background
    assert run.summary is not None
    assert run.summary["seconds"]["overhead_seconds"] == 0.003
