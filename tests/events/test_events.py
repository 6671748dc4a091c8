"""Event values, their JSON form, validation and the signals."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.events import (
    EVENT_TYPES,
    SIGNALS,
    BackendsClosed,
    EngineAck,
    EventBus,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
    dumps_event,
    event_from_dict,
    event_to_dict,
    iteration_started,
    loads_event,
    samples,
    validate_event,
)
from twinkle.perf import ClockAnchor, ManualClock, Span, TimeRecorder
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import BackendHealth

ANCHOR = ClockAnchor(monotonic_ns=5, wall_ns=1_700_000_000_000_000_000, pid=42, hostname="h")


def _reading(worker: str = "w0") -> MemoryReading:
    return MemoryReading(
        worker_id=worker,
        rank=0,
        pid=42,
        hostname="h",
        device="cpu",
        host_rss_bytes=100,
        host_peak_rss_bytes=200,
        device_allocated_bytes=None,
        device_allocated_peak_bytes=None,
        device_reserved_bytes=None,
        device_reserved_peak_bytes=None,
    )


def _span(name: str = "generate", start: int = 1, end: int = 9, **attrs: object) -> Span:
    return Span(name, start, end, 7, 42, dict(attrs), None)


EXAMPLES = [
    RunStarted("r", 1, 2, ANCHOR, {"phases": {"rollout": ["generate"]}}),
    IterationStarted("r", 3, 4, 0),
    WeightsPublished("r", 5, 6, 1, 2, 5, (EngineAck("e0", 3), EngineAck("e1", 5))),
    Snapshot("r", 7, 8, {"produced": {"p0": 3}, "version": 1}),
    RunFinished("r", 9, 10, "ok", None, {"samples_rollout": 4}, 0, 123),
    BackendsClosed(
        "r",
        9,
        10,
        {
            "metrics_raw": BackendHealth("JsonlBackend(metrics_raw.jsonl)", False, 4, 4),
            "mlflow": BackendHealth("MlflowBackend('x')", True, 4, 1, 0, 3, 0, 30.5, "cut"),
        },
    ),
    RunResumed("r", 10, 11, ANCHOR, 1, {"phases": {"rollout": ["generate"]}}),
    SpanBatch("r", 11, 12, "main", ANCHOR, (_span(iteration=0), _span("train.fwd", 2, 3))),
    MemoryReadings("r", 13, 14, 0, (_reading(), _reading("w1"))),
    SamplesObserved("r", 15, 16, 0, "rollout", (3, 4, 5), 1),
    OptimizerStep("r", 17, 18, 0, 1, 3),
    ScalarsObserved("r", 19, 20, 0, "grpo", {"reward_mean": 0.5, "loss": -0.1}),
]


def test_every_event_type_has_an_example_and_a_signal() -> None:
    assert {type(e) for e in EXAMPLES} == set(EVENT_TYPES.values()) == set(SIGNALS)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.TYPE)
def test_event_json_round_trip_is_exact(event: object) -> None:
    line = dumps_event(event)  # type: ignore[arg-type]
    assert b"NaN" not in line
    back = loads_event(line)
    assert back == event
    assert dumps_event(back) == line


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.TYPE)
def test_event_json_starts_with_type_and_keeps_units_in_names(event: object) -> None:
    d = event_to_dict(event)  # type: ignore[arg-type]
    assert next(iter(d)) == "type"
    assert "monotonic_ns" in d and "wall_ns" in d


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=2**40), max_size=50),
    phase=st.text(min_size=1, max_size=20),
    iteration=st.integers(min_value=0, max_value=10**6),
    groups=st.integers(min_value=0, max_value=1000),
)
def test_samples_round_trip_any_lengths(
    lengths: list[int], phase: str, iteration: int, groups: int
) -> None:
    ev = SamplesObserved("run", -5, 0, iteration, phase, tuple(lengths), groups)
    assert loads_event(dumps_event(ev)) == ev


@given(
    attrs=st.dictionaries(
        st.text(max_size=10),
        st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=10), st.booleans(), st.none()),
        max_size=5,
    )
)
def test_span_attrs_round_trip(attrs: dict[str, object]) -> None:
    ev = SpanBatch("r", 1, 2, "main", ANCHOR, (Span("x", 1, 2, 3, 4, attrs, "ValueError"),))
    assert loads_event(dumps_event(ev)) == ev


BAD = [
    (lambda: IterationStarted("r", 1, 2, -1), "iteration"),
    (lambda: IterationStarted("r", 1, 2, True), "iteration"),  # (a bool is an int to mypy)
    (lambda: IterationStarted("", 1, 2, 0), "run_id"),
    (lambda: IterationStarted("r", 1.5, 2, 0), "monotonic_ns"),  # type: ignore[arg-type]
    (lambda: SamplesObserved("r", 1, 2, 0, "rollout", (1, -2)), r"lengths\[1\]"),
    (lambda: SamplesObserved("r", 1, 2, 0, "rollout", (1, 2.5)), r"lengths\[1\]"),  # type: ignore[arg-type]
    (lambda: SamplesObserved("r", 1, 2, 0, "", (1,)), "phase"),
    (lambda: OptimizerStep("r", 1, 2, 0, 0), "step"),
    (lambda: WeightsPublished("r", 1, 2, 0, 10, 5, ()), "end_ns"),
    (lambda: SpanBatch("r", 1, 2, "main", ANCHOR, (_span(start=9, end=1),)), "ends before"),
    (lambda: RunFinished("r", 1, 2, "maybe"), "status"),  # type: ignore[arg-type]
    (lambda: ScalarsObserved("r", 1, 2, 0, "grpo", {"loss": "high"}), "values"),  # type: ignore[dict-item]
    (lambda: RunFinished("r", 1, 2, "ok", None, {"x": "many"}), "terminal_totals"),  # type: ignore[dict-item]
]


@pytest.mark.parametrize(("make", "match"), BAD)
def test_malformed_events_are_rejected_naming_the_field(make, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RecordError, match=match):
        validate_event(make())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"type": "nope"}, "unknown event type"),
        ({"type": "iteration_started", "run_id": "r"}, r"lacks field\(s\) \['monotonic_ns'\]"),
        ([1, 2], "JSON object"),
        (
            {
                "type": "iteration_started",
                "run_id": "r",
                "monotonic_ns": 1,
                "wall_ns": 1,
                "iteration": "3",
            },
            "iteration",
        ),
    ],
)
def test_decoding_malformed_dicts_names_the_problem(data: object, match: str) -> None:
    with pytest.raises(RecordError, match=match):
        event_from_dict(data)  # type: ignore[arg-type]


def test_loads_event_rejects_invalid_json() -> None:
    with pytest.raises(RecordError, match="not valid JSON"):
        loads_event(b'{"type": ')


def test_non_json_attrs_raise_a_record_error() -> None:
    ev = Snapshot("r", 1, 2, {"obj": object()})
    with pytest.raises(RecordError, match="not JSON-serialisable"):
        dumps_event(ev)


def test_nonfinite_floats_never_become_nan_tokens() -> None:
    ev = Snapshot("r", 1, 2, {"x": math.nan, "y": math.inf})
    line = dumps_event(ev)
    assert orjson.loads(line)["state"] == {"x": None, "y": None}


def test_bus_stamps_events_with_its_clock_and_sender() -> None:
    clock = ManualClock(100)
    bus = EventBus("run-1", clock=clock, wall_clock=lambda: 7)
    got: list[tuple[object, object]] = []

    def receiver(sender: object, *, event: object) -> None:
        got.append((sender, event))

    iteration_started.connect(receiver, sender=bus)
    try:
        clock.advance(5)
        bus.iteration_started(0)
    finally:
        iteration_started.disconnect(receiver, sender=bus)
    assert got == [(bus, IterationStarted("run-1", 105, 7, 0))]


def test_custom_callback_connected_to_any_sender_sees_every_bus() -> None:
    seen: list[str] = []

    def receiver(sender: object, *, event: SamplesObserved) -> None:
        seen.append(event.run_id)

    samples.connect(receiver)
    try:
        EventBus("a").samples(iteration=0, phase="p", lengths=[1])
        EventBus("b").samples(iteration=0, phase="p", lengths=[2])
    finally:
        samples.disconnect(receiver)
    assert seen == ["a", "b"]


def test_flush_before_iteration_start_publishes_closed_spans_first() -> None:
    clock = ManualClock(0)
    bus = EventBus("r", clock=clock)
    rec = TimeRecorder(clock=clock)
    bus.attach(rec, source="main")
    order: list[str] = []

    def on_any(sender: object, *, event: object) -> None:
        order.append(event.TYPE)  # type: ignore[attr-defined]

    for sig in SIGNALS.values():
        sig.connect(on_any, sender=bus)
    try:
        with rec.span("generate"):
            clock.advance(10)
        bus.iteration_started(0)
        bus.iteration_started(1)  # nothing closed in between: no empty batch
        bus.run_finished()
    finally:
        for sig in SIGNALS.values():
            sig.disconnect(on_any, sender=bus)
    assert order == ["spans", "iteration_started", "iteration_started", "run_finished"]


def test_bus_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="run_id"):
        EventBus("")
    bus = EventBus("r")
    bus.attach(TimeRecorder(), source="main")
    with pytest.raises(InvalidArgumentError, match="already attached"):
        bus.attach(TimeRecorder(), source="main")
    with pytest.raises(RecordError, match="lengths"):
        bus.samples(iteration=0, phase="p", lengths=[-1])


def test_free_form_json_is_checked_as_the_log_reads_it_back() -> None:
    """config and state reach the observers as a replay reads them from the log."""
    bus = EventBus("r")
    seen = bus.snapshot({"x": math.inf, "nested": [math.nan, 1]})
    assert seen.state == {"x": None, "nested": [None, 1]}
    assert loads_event(dumps_event(seen)) == seen
    with pytest.raises(RecordError, match=r"snapshot\.state\['n'\] cannot be read back"):
        bus.snapshot({"ok": 1, "n": 2**70})
    with pytest.raises(RecordError, match=r"snapshot\.state\['d'\] cannot be read back"):
        bus.snapshot({"d": {1: 2}})


def test_span_attrs_reach_the_observers_as_the_log_reads_them_back() -> None:
    bus = EventBus("r")
    attrs = {"nested": {"k": [1, math.nan]}, "inf": math.inf, "big": [2**70], "key": {1: 2}}
    spans = (Span("x", 1, 2, 3, 4, attrs, None),)
    seen: list[SpanBatch] = []

    def keep(sender: object, *, event: SpanBatch) -> None:
        seen.append(event)

    from twinkle.events import spans as spans_signal

    spans_signal.connect(keep, sender=bus)
    try:
        bus.publish_spans("w", ANCHOR, spans)
    finally:
        spans_signal.disconnect(keep)
    got = seen[0].spans[0].attrs
    assert got["nested"] == {"k": [1, None]} and got["inf"] is None
    assert got["big"] == "[1180591620717411303424]" and got["key"] == "{1: 2}"
    assert loads_event(dumps_event(seen[0])) == seen[0]


def test_nonfinite_scalars_are_nan_live_as_in_a_replay() -> None:
    ev = EventBus("r").scalars(iteration=0, name="g", values={"a": -math.inf, "b": 1.0})
    assert math.isnan(ev.values["a"]) and ev.values["b"] == 1.0
