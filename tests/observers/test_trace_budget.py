"""The trace's size budget (issue 29): which windows it shows in full, in outline, or
leaves out, worked by hand; and a run of many iterations whose ``trace.json`` stays
within its budget, says what it left out, and replays to the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from test_scripted_run import manual_session
from test_sinks_trace import _check_trace_rules

from twinkle.errors import ConfigError
from twinkle.observers import ObserverConfig
from twinkle.observers._trace_budget import TraceBudget
from twinkle.perf import Span
from twinkle.run import replay

MS = 1_000_000


def _line(name: str) -> bytes:
    return name.encode().ljust(48)  # 50 bytes with its ",\n"


def test_the_budget_keeps_the_tail_the_notable_windows_and_outlines_while_they_fit() -> None:
    """Budget 800 B: the tail 200 (two windows of 100), notable windows 400, outlines
    100. Each iteration window has an outline line and a detail line (50 B each), the
    set-up one detail line. Windows open every 10 ns, but iteration 5 lasts 40: slow
    (the median of the four before is 10, and 40 >= 2 x 10).

        window   notable           decided when held > 200   fate
        S        set-up            at it2's detail          full (50 of 400)
        it1-3    first three       at it3-it5               full (350)
        it4      -                 at it6                   outline (50 of 100)
        it5      slow              at it7: 450 > 400         outline (100)
        it6-8    -                 at it8-it10              left out (outlines full)
        it9-10   it10: the last    at the end: the tail      full
    """
    budget = TraceBudget(800)
    budget.open(0, iteration=False)
    budget.add(0, _line("S d"), span=True)
    opens = [10, 20, 30, 40, 50, 90, 100, 110, 120, 130]
    for i, at in enumerate(opens, 1):
        budget.open(at, iteration=True)
        budget.add(at, _line(f"it{i} o"), outline=True)
        budget.add(at + 1, _line(f"it{i} d"), span=True)
    budget.segment_finished(140)
    written = budget.ready()
    budget.add(55, _line("late d"), span=True)  # in it5 (outline): left out
    budget.add(56, _line("late o"), outline=True)  # its outline: written
    written += budget.finish()
    names = [line.decode().strip() for line in written]
    assert names == [
        "S d",
        *(f"it{i} {k}" for i in (1, 2, 3) for k in "od"),
        "it4 o",
        "it5 o",
        "late o",
        *(f"it{i} {k}" for i in (9, 10) for k in "od"),
    ]
    assert budget.note() == {
        "budget_bytes": 800,
        "windows_in_full": 6,
        "windows_in_outline": 2,
        "windows_left_out": 3,
        "spans_left_out": 6,  # it4-it8's details and the late one
        "lines_left_out": 9,  # those, and it6-it8's outlines
    }


def test_without_a_budget_every_line_is_written_as_it_comes() -> None:
    budget = TraceBudget(None)
    budget.open(0, iteration=False)
    budget.add(5, _line("a"))
    budget.open(10, iteration=True)
    budget.add(1, _line("b"), outline=True)
    assert budget.ready() == [_line("a"), _line("b")]
    assert budget.finish() == []
    assert budget.note()["windows_left_out"] == 0


def test_one_window_larger_than_the_tail_is_decided_at_once() -> None:
    budget = TraceBudget(800)  # tail 200
    budget.open(0, iteration=False)
    budget.open(10, iteration=True)
    for k in range(5):  # 250 B in the newest window: held (it may yet be the tail)
        budget.add(11, _line(f"d{k}"), span=True)
    assert budget.ready() == []
    budget.open(20, iteration=True)  # now it is not the newest: decided, in full
    assert len(budget.ready()) == 5


@pytest.mark.parametrize(
    ("trace", "match"),
    [
        ({"budget_mb": 0}, r"budget_mb must be a number in \[1, 1000000\]"),
        ({"budget_mb": True}, r"budget_mb must be a number"),
        ({"budget": 5}, r"config.trace must be an object with the one key budget_mb"),
        ([200], r"config.trace must be an object"),
    ],
)
def test_a_bad_budget_is_refused_by_name(trace: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ObserverConfig.parse({"trace": trace})


def test_the_default_budget_and_none() -> None:
    assert ObserverConfig.parse({}).trace_budget_bytes == 200 * 10**6
    assert ObserverConfig.parse({"trace": {"budget_mb": None}}).trace_budget_bytes is None
    assert ObserverConfig.parse({"trace": {"budget_mb": 1.5}}).trace_budget_bytes == 1_500_000


WORKERS = 16
ITERATIONS = 300


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 iterations of 16 workers' 12 spans each (~2,600 trace lines' worth of
    bytes per iteration: ~8 MB unbudgeted), iteration 150 slow, a budget of 1 MB."""
    config = {
        "phases": {"rollout": ["generate"], "train": ["train"]},
        "streaming": {"generation": "rollout", "training": "train"},
        "trace": {"budget_mb": 1},
    }
    run, clock = manual_session(tmp_path_factory.mktemp("budget"), "long", config)
    at = 0
    for it in range(ITERATIONS):
        clock.set(at * MS)
        run.bus.iteration_started(it)
        wall = 100 if it == 150 else 10
        spans = [
            Span(
                "generate" if w % 2 else "train",
                at * MS + k * MS // 2,
                at * MS + k * MS // 2 + 400_000,
                w,
                1,
                {"iteration": it, "worker": w, "k": k},
                None,
            )
            for w in range(WORKERS)
            for k in range(12)
        ]
        clock.set((at + wall - 1) * MS)
        run.bus.publish_spans("main", run.bus.anchor, spans)
        at += wall
    clock.set(at * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def test_a_long_runs_trace_stays_within_its_budget_and_says_what_it_left_out(
    long_run: Path,
) -> None:
    data = (long_run / "trace.json").read_bytes()
    assert len(data) <= 1_000_000
    trace = orjson.loads(data)
    _check_trace_rules(trace)
    (note,) = [e["args"] for e in trace if e["name"] == "trace_budget"]
    assert note["budget_bytes"] == 1_000_000
    assert note["windows_in_full"] + note["windows_in_outline"] + note["windows_left_out"] == (
        ITERATIONS + 1  # and the set-up
    )
    assert note["windows_left_out"] > 0 and note["spans_left_out"] > 0
    shown = {e["args"]["iteration"] for e in trace if e.get("cat") == "main"}
    assert {0, 1, 2, 150, ITERATIONS - 1} <= shown  # the first three, the slow, the last
    assert set(range(ITERATIONS - 5, ITERATIONS)) <= shown  # the tail
    assert 100 not in shown
    # every span of the log (twinkle's own included) is in the trace or counted out
    logged = sum(
        len(e["spans"])
        for e in map(orjson.loads, (long_run / "events.jsonl").read_bytes().splitlines())
        if e["type"] == "spans"
    )
    spans = sum(1 for e in trace if e["ph"] == "X" and e["cat"] not in ("critical path", "weights"))
    assert spans + note["spans_left_out"] == logged


def test_a_budgeted_trace_replays_to_the_same_bytes(long_run: Path, tmp_path: Path) -> None:
    replay(long_run / "events.jsonl", tmp_path / "again")
    assert (tmp_path / "again" / "trace.json").read_bytes() == (
        long_run / "trace.json"
    ).read_bytes()
