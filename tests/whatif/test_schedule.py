"""``twinkle whatif`` on the hand-worked run of ``tests/_whatif_run.py`` (its table): the
predicted schedules below are worked out by hand from it."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from _whatif_run import recorded_events
from twinkle.events import (
    IterationStarted,
    OptimizerStep,
    RunFinished,
    SamplesObserved,
    SpanBatch,
    WeightsPublished,
    dumps_event,
)
from twinkle.run import iter_events, replay
from twinkle.whatif import Changes, predict
from twinkle.whatif._recorded import read_recorded

MS = 1_000_000


def _schedule(prediction_dir: Path) -> tuple[list[float], float, list[int]]:
    """The predicted run's iteration begins and end (ms), and its published versions."""
    events = list(iter_events(prediction_dir / "events.jsonl"))
    begins = [e.monotonic_ns / MS for e in events if isinstance(e, IterationStarted)]
    end = next(e.monotonic_ns / MS for e in events if isinstance(e, RunFinished))
    versions = [e.version for e in events if isinstance(e, WeightsPublished)]
    return begins, end, versions


def test_the_recorded_run_is_read_as_the_table_says(run: Path) -> None:
    r = read_recorded(run)
    (engine,) = r.engines.values()
    assert engine.name == "e0"
    assert [engine.item_ns(it) / MS for it in range(3)] == [10, 10, 10]
    assert (engine.item_gap_ns, engine.load_gap_ns, engine.load_ns(1)) == (0, 0, 2 * MS)
    assert (r.lag, r.handoff_ns, r.buffer_size) == (1, 0, None)
    assert [[p.duration_ns / MS for p in t.pieces] for t in r.trainer] == [[6], [6], [6]]
    assert (r.engine_wait, r.trainer_wait, r.load_name) == (
        "wait.weights",
        "wait.rollout",
        "weights.load",
    )


@pytest.mark.parametrize(
    ("changes", "begins", "end", "versions"),
    [
        # as recorded: the table
        (Changes(), [0, 16, 26], 38, [1]),
        # lag 0: v1 after training 0 (load 16-18), gen 1 18-28; v2 after training 1
        # (28-34; load 34-36), gen 2 36-46, train 46-52
        (Changes(lag=0), [0, 16, 34], 52, [1, 2]),
        # two engines: 50 tokens each, 5 ms (10 ms per 100 tokens); items of 0 in at 5,
        # train 5-11; items of 1 made at 10, in at 11: publish v1 (loads 11-13), train
        # 11-17; gen 2 13-18, train 18-24
        (Changes(engines=2), [0, 11, 17], 24, [1]),
        # training twice as fast (3 ms): train 10-13; in at 20, train 20-23; gen 2 22-32,
        # train 32-35
        (Changes(speed={"train": 2.0}), [0, 13, 23], 35, [1]),
        # one trainer rank more: the training phase's time halved, as above
        (Changes(ranks=2), [0, 13, 23], 35, [1]),
    ],
)
def test_the_predicted_schedule_is_the_hand_worked_one(
    run: Path, tmp_path: Path, changes: Changes, begins: list[int], end: int, versions: list[int]
) -> None:
    predict(run, changes, tmp_path / "p")
    assert _schedule(tmp_path / "p") == (begins, end, versions)


def test_the_recorded_configuration_reproduces_every_figure(run: Path, tmp_path: Path) -> None:
    p = predict(run, Changes(), tmp_path / "p")
    for row in p.rows():
        if isinstance(row["a"], float) and row["figure"] != "overhead_seconds":
            assert row["b"] == pytest.approx(row["a"], rel=1e-9), row
    assert p.figure("steady_tokens_per_s_per_device")[0] is not None


def test_two_engines_double_the_throughput_and_the_devices(run: Path, tmp_path: Path) -> None:
    """Loop 38 ms → 24 ms for the same 300 tokens, on 3 devices instead of 2:
    tokens/s/device times 38/24 * 2/3."""
    p = predict(run, Changes(engines=2), tmp_path / "p")
    a, b = p.figure("tokens_per_s_per_device")
    assert b / a == pytest.approx(38 / 24 * 2 / 3, rel=1e-6)
    placement = p.predicted["placement"]
    assert placement["workers"]["engine0"]["devices"] == ["gpu:engine0"], placement
    assert p.settings == {
        "engines": 2,
        "ranks": 1,
        "lag": 1,
        "buffer": None,
        "shared": [],
        "contended": [],
        "speed_shared": [],
    }


def test_a_prediction_is_a_function_of_the_log(run: Path, tmp_path: Path) -> None:
    """The same log and changes give the same predicted log, byte for byte."""
    changes = Changes(engines=3, lag=2, speed={"train": 1.5})
    predict(run, changes, tmp_path / "p1")
    predict(run, changes, tmp_path / "p2")
    first = (tmp_path / "p1" / "events.jsonl").read_bytes()
    assert first == (tmp_path / "p2" / "events.jsonl").read_bytes()


def test_each_rollout_carries_the_version_it_was_generated_with(run: Path, tmp_path: Path) -> None:
    """With lag 0 iteration i is generated with version i (the recorded run: i - 1)."""
    predict(run, Changes(lag=0), tmp_path / "p")
    versions = {
        s.attrs["iteration"]: s.attrs["version"]
        for e in iter_events(tmp_path / "p" / "events.jsonl")
        if isinstance(e, SpanBatch)
        for s in e.spans
        if s.name == "generate"
    }
    assert versions == {0: 0, 1: 1, 2: 2}


def test_a_run_stopped_inside_an_iteration_is_predicted_through_the_last_whole_one(
    tmp_path: Path,
) -> None:
    """The log cut after iteration 2's start and its trainer's wait (no rollout, no
    run_finished): iterations 0 and 1 are predicted; the last runs to 2's start."""
    events = [
        e
        for e in recorded_events()
        if not isinstance(e, RunFinished)
        and not (getattr(e, "iteration", None) == 2 and not isinstance(e, IterationStarted))
    ]
    events = [
        msgspec.structs.replace(e, spans=tuple(s for s in e.spans if s.attrs.get("iteration") != 2))
        if isinstance(e, SpanBatch)
        else e
        for e in events
    ]
    log = tmp_path / "cut" / "events.jsonl"
    log.parent.mkdir()
    log.write_bytes(b"".join(dumps_event(e) + b"\n" for e in events))
    r = read_recorded(log)
    assert [t.iteration for t in r.trainer] == [0, 1]
    assert r.trainer[-1].tail_ns == 0  # (trained 20-26, iteration 2 began at 26)
    predict(log, Changes(), tmp_path / "p")
    assert _schedule(tmp_path / "p") == ([0, 16], 26, [])  # (no rollout of the two uses v1)


def test_workers_sharing_a_device_keep_sharing_it(tmp_path: Path) -> None:
    """The engine and the trainer on one host's CPU (the torch demo's placement): a new
    engine and a new rank share it too, so the devices stay 1."""
    from _whatif_run import CONFIG
    from twinkle.run import replay

    cpu = {"device_type": "cpu", "devices": ["host-cpu"]}
    config = {
        **CONFIG,
        "placement": {
            "trainer": {**cpu, "phases": ["train"]},
            "e0": {**cpu, "phases": ["rollout", "publish"]},
        },
    }
    events = recorded_events()
    events[0] = msgspec.structs.replace(events[0], config=config)
    replay(events, tmp_path / "run", autoload=False)
    p = predict(tmp_path / "run", Changes(engines=2, ranks=2), tmp_path / "p")
    workers = p.predicted["placement"]["workers"]
    assert {w: e["devices"] for w, e in workers.items()} == {
        "trainer": ["host-cpu"],
        "rank1": ["host-cpu"],
        "e0": ["host-cpu"],
        "engine0": ["host-cpu"],
    }


@pytest.mark.parametrize(
    ("ranks", "schedule", "workers"),
    [
        # as recorded: the trainer's two devices are its two ranks
        (2, ([0, 16, 26], 38, [1]), {"trainer": 2, "e0": 1}),
        # two ranks more: training halved (3 ms), as one rank more of one; each new rank
        # a device of its own
        (4, ([0, 13, 23], 35, [1]), {"trainer": 2, "rank2": 1, "rank3": 1, "e0": 1}),
        # one rank: training doubled (12 ms); the trainer keeps one device
        (1, None, {"trainer": 1, "e0": 1}),
    ],
)
def test_a_trainer_placed_with_a_count_of_devices_has_a_rank_per_device(
    tmp_path: Path,
    ranks: int,
    schedule: tuple[list[int], int, list[int]] | None,
    workers: dict[str, int],
) -> None:
    """The trainer placed as one worker with ``count`` 2 (docs/metrics.md's example) was
    one rank: --ranks 2 predicted a faster run on 8 devices where nothing changes, and
    each rank added copied the trainer's two devices."""
    from _whatif_run import CONFIG
    from twinkle.run import replay

    config = {
        **CONFIG,
        "placement": {
            "trainer": {"phases": ["train"], "device_type": "cuda", "count": 2},
            "e0": {"phases": ["rollout", "publish"], "device_type": "cuda", "devices": ["GPU-e"]},
        },
    }
    events = recorded_events()
    events[0] = msgspec.structs.replace(events[0], config=config)
    replay(events, tmp_path / "run", autoload=False)
    p = predict(tmp_path / "run", Changes(ranks=ranks), tmp_path / "p")
    assert p.settings["ranks"] == ranks
    placed = p.predicted["placement"]["workers"]
    assert {w: e["count"] for w, e in placed.items()} == workers
    assert p.predicted["placement"]["window"]["devices"] == sum(workers.values())
    if schedule is not None:
        assert _schedule(tmp_path / "p") == schedule


def _stepping_run(out: Path) -> Path:
    """The table's run with iteration 0's training in two pieces, ``train.step`` 10-12
    and ``train.optimizer`` 13-16 ms (1 ms apart), and its optimizer steps published at
    11 ms (half into the first piece), 12.5 (in the gap), 15 (two thirds into the
    second) and 16 (after the last); iterations 1 and 2 step once as their training
    ends (26, 38)."""
    events, stepped = [], 0
    for recorded in recorded_events():
        event = recorded
        if isinstance(recorded, SpanBatch) and recorded.spans[-1].start_ns == 10 * MS:
            step = recorded.spans[-1]
            pieces = (
                msgspec.structs.replace(step, end_ns=12 * MS),
                msgspec.structs.replace(step, name="train.optimizer", start_ns=13 * MS),
            )
            event = msgspec.structs.replace(recorded, spans=(*recorded.spans[:-1], *pieces))
        events.append(event)
        if isinstance(recorded, SamplesObserved) and recorded.phase == "rollout":
            it = recorded.iteration
            for us in (
                (11_000, 12_500, 15_000, 16_000) if it == 0 else (26_000 if it == 1 else 38_000,)
            ):
                stepped += 1
                at = us * 1_000
                events.append(
                    OptimizerStep(
                        "r", at, recorded.wall_ns - recorded.monotonic_ns + at, it, stepped
                    )
                )
    replay(events, out, autoload=False)
    return out


def test_an_iterations_events_move_with_the_pieces_they_fell_in(tmp_path: Path) -> None:
    """Training twice as fast: iteration 0's pieces take 10-11 and 12-13.5 ms (the gap
    between them kept), so its steps come at 10.5 (half into the first), 11.5 (in the
    gap, as recorded), 13.0 (two thirds into the second) and 13.5 ms (after the last),
    in the order they were made. (Kept at their recorded distance from the piece
    before, the third would come at 14, after the fourth.)"""
    predict(_stepping_run(tmp_path / "run"), Changes(speed={"train": 2.0}), tmp_path / "p")
    steps = [
        e for e in iter_events(tmp_path / "p" / "events.jsonl") if isinstance(e, OptimizerStep)
    ]
    assert [(e.step, e.monotonic_ns / MS) for e in steps if e.iteration == 0] == [
        (1, 10.5),
        (2, 11.5),
        (3, 13.0),
        (4, 13.5),
    ]
    assert [e.step for e in steps] == [1, 2, 3, 4, 5, 6]
