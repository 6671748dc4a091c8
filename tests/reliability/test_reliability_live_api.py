"""The live API keeps its order: nothing before start() or after finish(), iterations and
optimizer steps only go forward, a clock that goes backwards is a clear error (and no
good span is lost), bad denominators are refused up front, and a configured sample tag
that never appears is flagged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from _recompute import span_list
from reliability._scripted import CONFIG
from twinkle.errors import ConfigError, InvalidArgumentError, RecordError, TwinkleError
from twinkle.events import EventBus
from twinkle.run import RunSession, replay


class SteppedClock:
    """A clock a test can turn back (a ManualClock refuses to)."""

    def __init__(self) -> None:
        self.now = 10**9

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def run(tmp_path: Path, clock: SteppedClock) -> Iterator[RunSession]:
    session = RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False, clock=clock)
    with session:
        yield session


def events(run: RunSession) -> list[dict[str, object]]:
    assert run.out_dir is not None
    return [orjson.loads(x) for x in (run.out_dir / "events.jsonl").read_bytes().splitlines()]


def test_publishing_before_start_is_an_error(tmp_path: Path) -> None:
    session = RunSession(out_dir=tmp_path, run_id="r", autoload=False)
    with pytest.raises(TwinkleError, match=r"run 'r' is not started: call start\(\)"):
        session.bus.iteration_started(0)
    session.start()
    session.bus.iteration_started(0)  # the refused event left no trace
    session.finish()
    assert [e["type"] for e in events(session) if e["type"] != "spans"] == [
        "run_started",
        "iteration_started",
        "run_finished",
        "backends_closed",
    ]


def test_publishing_after_finish_is_an_error(tmp_path: Path) -> None:
    session = RunSession(out_dir=tmp_path, run_id="r", autoload=False)
    with session:
        pass
    with pytest.raises(TwinkleError, match=r"run 'r' is over \(finished\): publish before"):
        session.bus.samples(iteration=0, phase="rollout", lengths=[1])
    with pytest.raises(TwinkleError, match="not running"):
        session.finish()


@pytest.mark.parametrize(
    ("first", "then", "match"),
    [
        (3, 3, r"iteration_started 3 repeats iteration 3"),
        (3, 1, r"iteration_started 1 goes backwards from iteration 3.*the next is 4 or more"),
    ],
)
def test_iterations_only_go_forward(run: RunSession, first: int, then: int, match: str) -> None:
    run.bus.iteration_started(first)
    with pytest.raises(RecordError, match=match):
        run.bus.iteration_started(then)
    run.bus.iteration_started(first + 1)  # the run goes on


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ((1, 1), r"step=1 repeats step 1"),
        ((1, 2, 1), r"step=1 goes backwards from step 2.*the next is 3"),
    ],
)
def test_optimizer_steps_only_go_forward(
    run: RunSession, steps: tuple[int, ...], match: str
) -> None:
    run.bus.iteration_started(0)
    *good, bad = steps
    for step in good:
        run.bus.optimizer_step(iteration=0, step=step)
    with pytest.raises(RecordError, match=match):
        run.bus.optimizer_step(iteration=0, step=bad)


def test_a_clock_going_backwards_is_named_and_loses_no_good_span(
    run: RunSession, clock: SteppedClock
) -> None:
    run.bus.iteration_started(0)
    with run.recorder.span("generate", iteration=0):
        clock.advance(1_000)
    with run.recorder.span("train.fwd"):
        clock.advance(-500)  # the clock went back inside the span
    clock.advance(10_000)
    with run.recorder.span("train.bwd"):
        clock.advance(1_000)
    with pytest.raises(RecordError, match=r"'train\.fwd'.*clock went backwards"):
        run.bus.iteration_started(1)
    # The boundary itself went out, with every good span before it.
    run.finish()
    logged = events(run)
    names = [s["name"] for e in logged if e["type"] == "spans" for s in span_list(e)]
    assert "generate" in names and "train.bwd" in names and "train.fwd" not in names
    assert [e["iteration"] for e in logged if e["type"] == "iteration_started"] == [0, 1]


def test_a_boundary_before_the_previous_one_is_refused(
    run: RunSession, clock: SteppedClock
) -> None:
    run.bus.iteration_started(0)
    clock.advance(-10_000)
    with pytest.raises(RecordError, match=r"comes before the previous boundary.*clock went"):
        run.bus.iteration_started(1)
    clock.advance(20_000)
    run.bus.iteration_started(1)  # refused, not counted: 1 is still the next


@pytest.mark.parametrize("devices", [0, -1, float("nan"), float("inf"), "2", None, True])
def test_bad_device_counts_are_refused_before_anything_starts(
    tmp_path: Path, devices: object
) -> None:
    config = {**CONFIG, "window": {"samples": "rollout", "devices": devices}}
    said = (
        r"must be a positive, finite" if isinstance(devices, str | int | None) else r"is (nan|inf):"
    )
    with pytest.raises(ConfigError, match=rf"config\.window\.devices {said}"):
        RunSession(out_dir=tmp_path, run_id="r", config=config, autoload=False)
    assert not (tmp_path / "r").exists()


def test_a_sample_tag_that_never_appears_is_flagged(tmp_path: Path) -> None:
    config = {**CONFIG, "window": {"samples": "rollouts", "devices": 2}}  # misspelt
    with RunSession(out_dir=tmp_path, run_id="r", config=config, autoload=False) as run:
        run.bus.iteration_started(0)
        run.bus.samples(iteration=0, phase="rollout", lengths=[3])
    assert run.summary is not None
    missing = run.summary["missing_sample_tags"]
    assert set(missing) == {"rollouts", "train"}
    assert "counted by window" in missing["rollouts"] and "'rollout'" in missing["rollouts"]
    assert replay(tmp_path / "r" / "events.jsonl", tmp_path / "re").summary == run.summary


@pytest.mark.parametrize(
    ("publish", "match"),
    [
        (lambda b: b.samples(iteration=0, phase="p", lengths=None), r"samples\.lengths must"),
        (lambda b: b.samples(iteration=0, phase="p", lengths="12"), r"samples\.lengths must"),
        (lambda b: b.scalars(iteration=0, name="n", values=None), r"scalars\.values must"),
        (lambda b: b.snapshot(None), r"snapshot\.state must be a mapping"),
        (
            lambda b: b.weights_published(1, start_ns=0, end_ns=1, acks=None),
            r"weights_published\.acks must",
        ),
        (lambda b: b.memory(None, iteration=0), r"memory\.readings must"),
        (lambda b: b.publish_spans("w", b.anchor, None), r"spans must be a sequence"),
    ],
)
def test_none_for_a_collection_is_a_clear_error(publish: object, match: str) -> None:
    bus = EventBus("r")
    with pytest.raises(InvalidArgumentError, match=match):
        publish(bus)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"out_dir": 123}, r"out_dir must be a directory path.*got 123"),
        ({"clock": 5}, r"clock must be a zero-argument callable"),
        ({"run_id": "../x"}, r"run_id"),
    ],
)
def test_bad_session_arguments_are_named(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        RunSession(autoload=False, **kwargs)  # type: ignore[arg-type]


def test_the_bus_accepts_only_what_the_session_accepts() -> None:
    with pytest.raises(InvalidArgumentError, match=r"run_id"):
        EventBus("../x")
