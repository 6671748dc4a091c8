"""A span batch's columns in the event log: the hand-worked form, the round trip, the
log of an older twinkle, and lines twinkle did not write."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _recompute import span_list
from twinkle.errors import RecordError
from twinkle.events import SpanBatch, dumps_event, loads_event, span_rows, validate_event
from twinkle.perf import ClockAnchor, Span

ANCHOR = ClockAnchor(monotonic_ns=5, wall_ns=1_700_000_000_000_000_000, pid=42, hostname="h")
SPANS = (
    Span("gen", 1_000, 1_500, 7, 42, {"iteration": 0, "engine": "e0"}, None),
    Span("train", 900, 2_000, 8, 42, {"iteration": 0}, None),
    Span("gen", 1_600, 1_700, 7, 42, {"iteration": 1, "engine": "e1"}, "ValueError"),
)


def _batch(spans: tuple[Span, ...] = SPANS, dropped: int = 0) -> SpanBatch:
    return validate_event(SpanBatch("r", 10, 20, "w", ANCHOR, spans, dropped, None))


def test_a_batch_is_written_as_columns_worked_by_hand() -> None:
    line = orjson.loads(dumps_event(_batch()))
    assert list(line) == [
        "type", "run_id", "monotonic_ns", "wall_ns", "source", "anchor", "columns",
        "dropped", "sent_anchor",
    ]  # fmt: skip
    assert line["columns"] == {
        "names": ["gen", "train"],
        "name": [0, 1, 0],
        "t0": 900,  # the earliest start
        "start": [100, 0, 700],  # start_ns - t0
        "dur": [500, 1_100, 100],  # end_ns - start_ns
        "threads": [7, 8],
        "thread": [0, 1, 0],
        "pids": [42],  # one pid: no index list
        "keys": [["iteration", "engine"], ["iteration"]],
        "key": [0, 1, 0],
        "values": {"iteration": [0, 0, 1], "engine": ["e0", "e1"]},
        "errors": [None, "ValueError"],
        "error": [0, 0, 1],
    }
    assert span_rows(line) == span_list(line) == [s.to_dict() for s in SPANS]


def test_spans_without_attrs_or_errors_leave_those_columns_out() -> None:
    spans = tuple(Span("x", 10 * i, 10 * i + 3, 1, 2, {}, None) for i in range(3))
    line = orjson.loads(dumps_event(_batch(spans)))
    assert line["columns"] == {
        "names": ["x"], "t0": 0, "start": [0, 10, 20], "dur": [3, 3, 3],
        "threads": [1], "pids": [2],
    }  # fmt: skip
    back = loads_event(dumps_event(_batch(spans)))
    assert isinstance(back, SpanBatch)
    assert back.spans == spans


def test_an_empty_batch_with_dropped_spans_round_trips() -> None:
    batch = _batch((), dropped=4)
    assert loads_event(dumps_event(batch)) == batch


_ATTR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.sampled_from("ab"), st.integers(0, 9), max_size=2),
)  # fmt: skip
_SPAN = st.builds(
    lambda name, start, dur, thread, pid, attrs, error: Span(
        name, start, start + dur, thread, pid, attrs, error
    ),
    st.sampled_from(["a", "b", "c.d"]),
    st.integers(-(2**40), 2**40),
    st.integers(0, 2**40),
    st.sampled_from([1, 2, 140_000_000_000_000]),
    st.sampled_from([10, 11]),
    st.dictionaries(st.sampled_from(["i", "j", "k"]), _ATTR, max_size=2),
    st.sampled_from([None, None, "E", "F"]),
)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_SPAN, max_size=8))
def test_any_batch_reads_back_as_it_was_written(spans: list[Span]) -> None:
    batch = _batch(tuple(spans))
    line = dumps_event(batch)
    assert loads_event(line) == batch
    assert (
        span_rows(json.loads(line))
        == span_list(json.loads(line))
        == [s.to_dict() for s in batch.spans]
    )


_INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(st.tuples(_INT64, _INT64).map(sorted), min_size=1, max_size=4))
def test_any_int64_times_read_back(times: list[list[int]]) -> None:
    """Whatever int64 times a batch's spans have (a span from -2**63 to 2**62 lasts
    more than 2**63 - 1 ns; a batch from 0 to 6e18 ends past t0 + the largest start +
    the largest length), the log's reader takes what its writer wrote."""
    spans = tuple(Span("a", start, end, 1, 2, {}, None) for start, end in times)
    line = dumps_event(_batch(spans))
    assert loads_event(line) == _batch(spans)
    assert span_rows(json.loads(line)) == [s.to_dict() for s in spans]


def test_a_batch_whose_largest_start_and_length_pass_int64_reads_back() -> None:
    """t0 0, starts [0, 6e18], lengths [6e18, 0]: the bound t0 + max(start) + max(dur)
    is 1.2e19, past 2**63 - 1; each span ends at 6e18, within it."""
    spans = (
        Span("a", 0, 6 * 10**18, 1, 1, {}, None),
        Span("b", 6 * 10**18, 6 * 10**18, 1, 1, {}, None),
    )
    line = dumps_event(_batch(spans))
    assert orjson.loads(line)["columns"]["dur"] == [6 * 10**18, 0]
    assert loads_event(line) == _batch(spans)


def test_the_log_of_an_older_twinkle_still_reads() -> None:
    old = msgspec.json.encode(_batch())  # the spans as a list of objects
    assert b'"spans":[{"name":"gen"' in old
    assert loads_event(old) == _batch()
    assert span_rows(orjson.loads(old)) == [s.to_dict() for s in SPANS]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"name": [0, 1]}, r"spans\.columns\.name has 2 entries for 3 spans"),
        ({"name": None}, r"spans\.columns\.names has 2 entries but no 'name' index list"),
        ({"thread": [0, 2, 0]}, r"holds index 2, past the 2 entries of spans\.columns\.threads"),
        ({"dur": [1, 2]}, r"spans\.columns\.dur has 2 entries for 3 starts"),
        ({"dur": [1, -2, 3]}, r"spans\.columns\.dur\[1\] = -2: expected `int` >= 0"),
        ({"values": {"iteration": [0, 0, 1], "engine": ["e0"]}}, r"values per name"),
        ({"keys": [["iteration", "iteration"], ["iteration"]]}, r"a repeated name"),
        ({"keys": None}, r"attribute values or a 'key' list but no 'keys'"),
        ({"errors": None}, r"an 'error' list but no 'errors'"),
        ({"t0": 2**63 - 10}, r"a span ends past 2\*\*63 - 1 ns"),
        ({"colour": 1}, r"spans\.columns has unknown field\(s\) \[.colour.\]"),
    ],
)
def test_a_line_twinkle_did_not_write_is_refused_naming_the_column(
    edit: dict[str, object], match: str
) -> None:
    line = orjson.loads(dumps_event(_batch()))
    for key, value in edit.items():
        if value is None:
            del line["columns"][key]
        else:
            line["columns"][key] = value
    with pytest.raises(RecordError, match=match):
        loads_event(orjson.dumps(line))


def test_the_documented_line_is_the_line_twinkle_writes() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    section = doc.split("### The event log's span batches: columns", 1)[1]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    documented = json.loads(block)
    assert documented.pop("seq") == 7
    assert documented == orjson.loads(dumps_event(_batch()))
