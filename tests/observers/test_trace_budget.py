"""The trace's size budget (issue 29): which windows it shows in full, in outline, or
leaves out, worked by hand; and a run of many iterations whose ``trace.json`` stays
within its budget, says what it left out, and replays to the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _recompute import span_list
from observers.test_scripted_run import manual_session
from observers.test_sinks_trace import _check_trace_rules
from twinkle.errors import ConfigError
from twinkle.observers import ObserverConfig
from twinkle.observers._trace_budget import Key, TraceBudget
from twinkle.perf import ClockAnchor, Span
from twinkle.run import replay

MS = 1_000_000


def _line(name: str) -> bytes:
    return name.encode().ljust(48)  # 50 bytes with its ",\n"


def test_the_budget_keeps_the_tail_the_notable_windows_and_outlines_while_they_fit() -> None:
    """Budget 800 B: the tail 200 (two windows of 100), windows in full 400, outlines
    100. Each iteration window has an outline line and a detail line (50 B each), the
    set-up one detail line. Windows open every 10 ns, but iteration 5 lasts 40: slow
    (the lower median of the four before is 10, and 40 >= 2 x 10).

        window   notable         decided when held > 200   in full so far   fate
        S        set-up          at it2's detail: 250      0 + 50           full
        it1-3    first three     at it3-it5's outline      150, 250, 350    full
        it4      -               at it6's: 350 + 250 held  > 400            outline (50)
        it5      slow            at it7's: 350 + 100       > 400            outline (100)
        it6-8    -               at it8-it10's             outlines full    left out
        it9-10   it10: the last  at the end: the tail                       full

    Late lines: one in it5 (in outline) of its detail is left out, of its outline too
    (the outlines' 100 B are taken); one in it1 (in full) is written (400 of 400).
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
    budget.add(56, _line("late o"), outline=True)  # its outline: no room left
    budget.add(12, _line("late 1"), span=True)  # in it1 (full): 400 of 400
    budget.add(13, _line("late 1'"), span=True)  # 450 of 400: left out
    written += budget.finish()
    names = [line.decode().strip() for line in written]
    assert names == [
        "S d",
        *(f"it{i} {k}" for i in (1, 2, 3) for k in "od"),
        "it4 o",
        "it5 o",
        "late 1",
        *(f"it{i} {k}" for i in (9, 10) for k in "od"),
    ]
    assert budget.note() == {
        "budget_bytes": 800,
        "windows_in_full": 6,
        "windows_in_outline": 2,
        "windows_left_out": 3,
        "spans_left_out": 7,  # it4-it8's details, late d and late 1'
        "lines_left_out": 11,  # those, it6-it8's outlines and late o
        "names_left_out": 0,  # (none offered here)
    }


def test_a_run_within_half_its_budget_is_written_whole() -> None:
    """Budget 800: 40 ordinary windows of one 10 B line (12 with its ",\n": 480 B
    in all) would pass half of it; 33 windows (396 B) do not: every window in full,
    though the held ones passed the tail's 200 B at the 17th."""
    for windows, whole in ((33, True), (40, False)):
        budget = TraceBudget(800)
        for i in range(windows):
            budget.open(i * 10, iteration=True)
            budget.add(i * 10, b"0123456789", span=True)
        budget.segment_finished(windows * 10)
        written = budget.ready() + budget.finish()
        assert (len(written) == windows) is whole
        assert (budget.note()["windows_in_full"] == windows) is whole
        assert sum(len(line) + 2 for line in written) <= 7 * 800 // 8


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
    """Budget 800 (tail 200, in full 400): the newest window's fifth 50 B line takes
    the held lines past 200: it is decided while open, in full (the first iteration),
    and its later lines are written while the windows in full fit: three more."""
    budget = TraceBudget(800)
    budget.open(0, iteration=False)
    budget.open(10, iteration=True)
    for k in range(4):  # 200 B: held (it may yet be the tail)
        budget.add(11, _line(f"d{k}"), span=True)
    assert budget.ready() == []
    budget.add(11, _line("d4"), span=True)
    assert len(budget.ready()) == 5
    for k in range(5, 9):
        budget.add(12, _line(f"d{k}"), span=True)
    assert [line.strip() for line in budget.ready()] == [b"d5", b"d6", b"d7"]
    budget.open(20, iteration=True)  # the window closes, decided: nothing held
    assert budget.finish() == []
    assert budget.note()["windows_in_full"] == 3  # the set-up, it1 and it2 (the tail)
    assert budget.note()["spans_left_out"] == 1


def test_the_lower_median_of_walls_marks_slow_windows() -> None:
    """Walls 10, 10, 30 (the first three: notable anyway), then 15 (the lower median of
    10, 10, 30 is 10: 15 < 20, not slow), 20 (of 10, 10, 15, 30 the lower median is 10:
    20 >= 20, slow; the upper, 15, would not make it so) and 29 (of 10, 10, 15, 20, 30:
    15, and 29 < 30: not slow)."""
    budget = TraceBudget(10**9)
    at = 0
    for wall in (10, 10, 30, 15, 20, 29):
        budget.open(at, iteration=True)
        at += wall
    budget.open(at, iteration=True)  # (closes the last)
    held = [window for _, window in budget._held]
    assert [w.notable for w in held] == [True, True, True, False, True, False, False]


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
        len(span_list(e))
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


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("open"), st.integers(0, 50), st.booleans()),
            st.tuples(st.just("line"), st.integers(-10, 60), st.integers(1, 90)),
            st.tuples(
                st.just("spans"), st.lists(st.tuples(st.integers(-10, 60), st.integers(1, 90)))
            ),
        ),
        max_size=60,
    ),
    st.sampled_from([None, 120, 400, 2_000]),
)
def test_spans_added_as_a_batch_are_decided_as_one_by_one(ops: list[Any], budget: Any) -> None:
    """``add_spans`` hands out the same lines in the same order, and counts the same,
    as ``add(..., span=True)`` line by line: windows opening, lines of older windows,
    and windows decided in the middle of a batch included."""
    one, batch = TraceBudget(budget), TraceBudget(budget)
    out_one: list[bytes] = []
    out_batch: list[bytes] = []
    made = 0
    for op in ops:
        if op[0] == "open":
            for b in (one, batch):
                b.open(op[1], iteration=op[2])
            continue
        items = [(op[1], op[2])] if op[0] == "line" else op[1]
        lines: list[tuple[int, bytes, Key]] = []
        for at, size in items:
            made += 1
            lines.append((at, b"x" * size + str(made).encode(), (1, made % 3)))
        for at, line, key in lines:
            one.add(at, line, span=True, key=key)
        batch.add_spans(lines)
        out_one += one.ready()
        out_batch += batch.ready()
    assert out_batch == out_one
    assert (out_batch + batch.finish()) == (out_one + one.finish())
    assert batch.note() == one.note()
    assert batch.shown == one.shown


def test_only_the_tracks_of_written_lines_are_shown_and_their_names_fit_in_an_eighth() -> None:
    """Budget 800 (tail 200, in full 400): the set-up's 50 B line (52 with its ",\\n")
    and it1's and it2's 150 B ones are written in full (52, 204, 356 of 400); it3's
    would pass 400 and it4-it7 are ordinary: their detail is left out; it8, the tail,
    is written in full. Only the tracks of written lines are shown. Names: five of 40
    B (42 each) against 800 // 8 = 100: two fit, three are left out, counted."""
    budget = TraceBudget(800)
    budget.open(0, iteration=False)
    budget.add(0, b"s" * 50, key=(1, 1))
    for i in range(1, 9):
        budget.open(i * 10, iteration=True)
        budget.add(i * 10, b"d" * 150, span=True, key=(2, i))
    written = budget.finish()
    assert [len(line) for line in written] == [50, 150, 150, 150]
    assert budget.shown == {(1, 1), (2, 1), (2, 2), (2, 8)}
    names = [bytes([ord("a") + k]) * 40 for k in range(5)]
    assert budget.names(names) == names[:2]
    assert budget.note()["names_left_out"] == 3
    assert TraceBudget(None).names(names) == names  # (no budget: every name)


def test_a_run_whose_threads_and_processes_come_and_go_stays_within_its_budget(
    tmp_path: Path,
) -> None:
    """Fresh thread ids every iteration (a pool made anew) and a fresh process for
    half the workers (data-loader processes): 200 iterations of 8 workers' 10 spans on
    5 threads each, budget 1 MB (~2.7 MB of span lines unbudgeted, ~0.8 MB of names
    had every track been named). The trace stays within its budget, and only the
    tracks and processes that a written line is on are named."""
    run, clock = manual_session(tmp_path, "churn", {"trace": {"budget_mb": 1}})
    for it in range(200):
        clock.set(it * 10 * MS)
        run.bus.iteration_started(it)
        for w in range(8):
            pid = 1_000 + w if w % 2 else 100_000 + it * 8 + w
            anchor = ClockAnchor(monotonic_ns=0, wall_ns=0, pid=pid, hostname=f"node{w}")
            start = it * 10 * MS
            spans = [
                Span("work", start + k * MS // 2, start + k * MS // 2 + 100, 5 * it + k % 5, pid,
                     {"iteration": it, "k": k}, None)
                for k in range(10)
            ]  # fmt: skip
            run.bus.publish_spans(f"worker{w}", anchor, spans)
        clock.set(it * 10 * MS + 9 * MS)
    clock.set(2_000 * MS)
    run.finish()
    assert run.out_dir is not None
    data = (run.out_dir / "trace.json").read_bytes()
    assert len(data) <= 1_000_000
    trace = orjson.loads(data)
    _check_trace_rules(trace)
    drawn = {(e["pid"], e.get("tid")) for e in trace if e["ph"] != "M"}
    named = {(e["pid"], e["tid"]) for e in trace if e["name"] == "thread_name"}
    assert named and named <= drawn
    processes = {e["pid"] for e in trace if e["name"] == "process_name"}
    assert len(processes) > 8 and processes <= {pid for pid, _ in drawn}
    (note,) = [e["args"] for e in trace if e["name"] == "trace_budget"]
    assert note["spans_left_out"] > 0 and note["names_left_out"] > 0  # (both bind)


def test_a_weights_arrow_ends_on_named_tracks_whatever_became_of_the_load(
    tmp_path: Path,
) -> None:
    """Budget 1 MB: a publish in iteration 2 (written in full) and engine0's load of
    its version in iteration 3, on a thread of its own; later iterations' padding makes
    the load's window go to its outline. The arrow is written with the publish's
    window, and both its ends' tracks are named (none is left out for room)."""
    run, clock = manual_session(tmp_path, "arrow", {"trace": {"budget_mb": 1}})
    bus, anchor = run.bus, run.bus.anchor
    pid = anchor.pid

    def pad(t: int, n: int, tid: int) -> list[Span]:
        return [
            Span("pad", t + 3 * MS + k * 10_000, t + 3 * MS + k * 10_000 + 5_000, tid, pid,
                 {"x": "y" * 100}, None)
            for k in range(n)
        ]  # fmt: skip

    bus.publish_spans("main", anchor, pad(0, 2_300, 2))
    for it in range(12):
        t = (it + 1) * 100 * MS
        clock.set(t)
        bus.iteration_started(it)
        spans = [Span("step", t + MS, t + 2 * MS, 1, pid, {"iteration": it}, None)]
        if it == 3:
            load = {"engine": "engine0", "version": 1}
            spans.insert(0, Span("weights.load", t + MS, t + 2 * MS, 999, pid, load, None))
        bus.publish_spans("main", anchor, spans + (pad(t, 600, 3) if it >= 4 else []))
        if it == 2:
            bus.weights_published(
                1, start_ns=t + 50 * MS, end_ns=t + 60 * MS, acks=[("engine0", t + 60 * MS)]
            )
        clock.set(t + 90 * MS)
    clock.set(2_000 * MS)
    run.finish()
    assert run.out_dir is not None
    trace = orjson.loads((run.out_dir / "trace.json").read_bytes())
    (note,) = [e["args"] for e in trace if e["name"] == "trace_budget"]
    assert note["names_left_out"] == 0 and note["windows_in_outline"] > 0
    ends = {(e["pid"], e["tid"]) for e in trace if e["ph"] in ("s", "f")}
    named = {(e["pid"], e["tid"]) for e in trace if e["name"] == "thread_name"}
    assert len(ends) == 2 and ends <= named
