"""MetricRecord: validation, normalisation of non-finite values, immutability, round trip."""

from __future__ import annotations

import enum
import fractions
import gc
import json
import math
import pickle
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.reporting import (
    SCOPES,
    JsonlBackend,
    JsonlWriter,
    MetricRecord,
    cut_short,
    flat_key,
    make_record,
    record_from_dict,
    record_to_dict,
    with_seq,
)
from twinkle.reporting._record_values import _plain_attrs


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-strict JSON token {name}")


def strict_loads(line: str | bytes) -> Any:
    return json.loads(line, parse_constant=_reject_constant)


def rec(**overrides: Any) -> MetricRecord:
    fields: dict[str, Any] = dict(
        kind="train",
        scope="iteration",
        run_id="run-1",
        step=3,
        iteration=4,
        wall_ns=1_700_000_000_000_000_000,
        monotonic_ns=123_456,
        values={"tokens": 100, "tokens_per_s": 12.5},
        attrs={"phase": "train"},
    )
    fields.update(overrides)
    return make_record(**fields)


def test_make_record_keeps_fields_and_leaves_seq_unassigned() -> None:
    r = rec()
    assert r.kind == "train" and r.scope == "iteration" and r.run_id == "run-1"
    assert (r.step, r.iteration, r.wall_ns, r.monotonic_ns) == (
        3,
        4,
        1_700_000_000_000_000_000,
        123_456,
    )
    assert r.seq is None
    assert dict(r.values) == {"tokens": 100, "tokens_per_s": 12.5}
    assert dict(r.attrs) == {"phase": "train"}


def test_non_finite_values_become_none_and_are_named_sorted() -> None:
    r = rec(values={"z": float("inf"), "a": float("nan"), "ok": 1.0, "m": -math.inf})
    assert dict(r.values) == {"z": None, "a": None, "ok": 1.0, "m": None}
    assert r.attrs["nonfinite"] == ("a", "m", "z")
    assert r.attrs["phase"] == "train"


def test_finite_record_has_no_nonfinite_attr() -> None:
    assert "nonfinite" not in rec().attrs


def test_none_value_accepted_only_when_named_nonfinite() -> None:
    r = rec(values={"x": None}, attrs={"nonfinite": ["x"]})
    assert r.values["x"] is None and r.attrs["nonfinite"] == ("x",)
    with pytest.raises(RecordError, match=r"values\['x'\] is None.*float\('nan'\)"):
        rec(values={"x": None})


def test_nonfinite_attr_contradicting_values_is_rejected() -> None:
    with pytest.raises(RecordError, match=r"names 'x'.*finite"):
        rec(values={"x": 1.0}, attrs={"nonfinite": ["x"]})
    with pytest.raises(RecordError, match=r"\['ghost'\].*not in values"):
        rec(values={"x": float("nan")}, attrs={"nonfinite": ["ghost", "x"]})
    with pytest.raises(RecordError, match="must be a list of values keys"):
        rec(attrs={"nonfinite": "x"})


@pytest.mark.parametrize(
    ("overrides", "culprit"),
    [
        ({"values": {1: 2.0}}, r"values key 1 is a int; keys must be str"),
        ({"values": {"loss": "0.5"}}, r"values\['loss'\] = '0.5' is a str"),
        ({"values": {"ok": True}}, r"values\['ok'\] = True is a bool"),
        ({"values": {"mem": {"max": 1.0}}}, r"values\['mem'\] is a nested dict.*'mem/<name>'"),
        ({"values": {"xs": [1, 2]}}, r"values\['xs'\] is a nested list"),
        ({"values": {"t": object()}}, r"values\['t'\] = <object.*is not a number"),
        ({"values": {"": 1}}, r"values has an empty key"),
        ({"values": {"big": 2**70}}, r"values\['big'\].*64-bit"),
        ({"values": [("a", 1)]}, r"values must be a mapping"),
        ({"kind": ""}, r"kind must be a non-empty str.*got ''"),
        ({"kind": "train/x"}, r"kind.*no '/'.*got 'train/x'"),
        ({"kind": 3}, r"kind .*got 3"),
        ({"scope": "epoch"}, r"scope must be one of .*got 'epoch'"),
        ({"run_id": ""}, r"run_id '' is not a safe name"),
        ({"run_id": "a/b"}, r"run_id 'a/b' is not a safe name"),
        ({"run_id": "..x"}, r"run_id '..x'"),
        ({"run_id": "a\\b"}, r"run_id 'a\\\\b'"),
        ({"step": -1}, r"step must be an int >= 0, got -1"),
        ({"step": 1.0}, r"step must be an int >= 0, got 1.0"),
        ({"iteration": True}, r"iteration must be an int >= 0, got True"),
        ({"wall_ns": -5}, r"wall_ns must be an int >= 0, got -5"),
        ({"monotonic_ns": None}, r"monotonic_ns must be an int >= 0, got None"),
        ({"seq": -1}, r"seq must be None \(not stamped yet.*\) or an int >= 0, got -1"),
        ({"seq": 1.0}, r"seq must be None .* or an int >= 0, got 1.0"),
        ({"attrs": {"x": float("nan")}}, r"attrs\['x'\] = nan is not finite"),
        ({"attrs": {"x": {1: "a"}}}, r"attrs\['x'\] key 1 is a int"),
        ({"attrs": {"when": object()}}, r"attrs\['when'\] = <object.*is not a JSON value"),
        ({"attrs": {"s": "\ud800"}}, r"attrs\['s'\] is not valid UTF-8"),
        ({"attrs": ["a"]}, r"attrs must be a str-keyed mapping"),
        ({"values": {"\udcff": 1}}, r"values key .* not valid UTF-8"),
    ],
)
def test_bad_record_input_raises_record_error_naming_the_culprit(
    overrides: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(RecordError, match=culprit):
        rec(**overrides)


def test_record_error_is_an_invalid_argument_value_error() -> None:
    with pytest.raises(ValueError):
        rec(step=-1)
    assert issubclass(RecordError, InvalidArgumentError)


def test_numeric_subtypes_are_normalised_to_int_and_float() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    r = rec(values={"half": fractions.Fraction(1, 2), "level": Level.HIGH})
    assert r.values["half"] == 0.5 and type(r.values["half"]) is float
    assert r.values["level"] == 3 and type(r.values["level"]) is int


def test_record_is_immutable_deeply() -> None:
    r = rec(attrs={"nested": {"xs": [1, 2]}})
    with pytest.raises(AttributeError, match="immutable"):
        r.step = 9  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        r.values["tokens"] = 1  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        r.attrs["nested"]["xs"] = []
    assert r.attrs["nested"]["xs"] == (1, 2)


def test_record_copies_its_inputs() -> None:
    values = {"a": 1.0}
    attrs: dict[str, Any] = {"xs": [1]}
    r = rec(values=values, attrs=attrs)
    values["a"] = 2.0
    attrs["xs"].append(2)
    assert r.values["a"] == 1.0 and r.attrs["xs"] == (1,)


def test_equal_records_hash_equal() -> None:
    a = rec(attrs={"d": {"xs": [1, {"y": 2}]}})
    b = rec(attrs={"d": {"xs": (1, {"y": 2})}})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, msgspec.structs.replace(a, seq=3)}) == 2


def test_replace_revalidates() -> None:
    r = rec()
    assert msgspec.structs.replace(r, seq=7).seq == 7
    with pytest.raises(RecordError, match="step must be"):
        msgspec.structs.replace(r, step=-3)


def test_records_are_left_to_reference_counting_however_they_are_made() -> None:
    # gc=False is safe only because a record holds nothing that could lead back to it:
    # scalars and read-only copies of its values and attrs, never the caller's objects.
    attrs: dict[str, Any] = {"xs": [1]}
    r = rec(attrs=attrs)
    assert r.attrs is not attrs and r.attrs["xs"] == (1,)
    copies = [r, with_seq(r, 1), msgspec.structs.replace(r, seq=2), pickle.loads(pickle.dumps(r))]
    assert not any(gc.is_tracked(c) for c in copies)


def test_record_pickles_and_stays_read_only() -> None:
    r = rec(values={"x": float("nan"), "y": 2})
    back: MetricRecord = pickle.loads(pickle.dumps(r))
    assert back == r
    with pytest.raises(TypeError):
        back.values["y"] = 3  # type: ignore[index]


def test_record_to_dict_is_plain_json_in_field_order() -> None:
    r = rec(values={"x": float("nan")}, attrs={"tags": ["a", "b"], "d": {"k": 1}})
    d = record_to_dict(r)
    assert list(d) == list(MetricRecord.__struct_fields__)
    assert type(d["values"]) is dict and type(d["attrs"]) is dict
    assert d["attrs"] == {"tags": ["a", "b"], "d": {"k": 1}, "nonfinite": ["x"]}
    assert type(d["attrs"]["tags"]) is list and type(d["attrs"]["d"]) is dict
    assert record_from_dict(d) == r


def test_record_from_dict_rejects_missing_and_unknown_keys() -> None:
    d = record_to_dict(rec())
    del d["wall_ns"]
    with pytest.raises(RecordError, match=r"lacks \['wall_ns'\]"):
        record_from_dict(d)
    d = record_to_dict(rec())
    d["extra"] = 1
    with pytest.raises(RecordError, match=r"unknown keys \['extra'\]"):
        record_from_dict(d)
    with pytest.raises(RecordError, match="must be a JSON object"):
        record_from_dict([1, 2])  # type: ignore[arg-type]


# -- property: the JSONL round trip loses nothing ---------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
_key = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_key, inner, max_size=4),
    max_leaves=12,
)
_values = st.dictionaries(
    _key,
    st.one_of(
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
    ),
    max_size=8,
)
_attrs = st.dictionaries(_key.filter(lambda k: k != "nonfinite"), _json, max_size=5)
_ns = st.integers(min_value=0, max_value=2**63)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}", fullmatch=True),
    scope=st.sampled_from(SCOPES),
    run_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True),
    seq=st.integers(min_value=0, max_value=2**63),
    step=_ns,
    iteration=_ns,
    wall_ns=_ns,
    monotonic_ns=_ns,
    values=_values,
    attrs=_attrs,
)
def test_jsonl_round_trip_loses_nothing(
    kind: str,
    scope: str,
    run_id: str,
    seq: int,
    step: int,
    iteration: int,
    wall_ns: int,
    monotonic_ns: int,
    values: dict[str, int | float],
    attrs: dict[str, Any],
) -> None:
    record = make_record(
        kind=kind,
        scope=scope,
        run_id=run_id,
        seq=seq,
        step=step,
        iteration=iteration,
        wall_ns=wall_ns,
        monotonic_ns=monotonic_ns,
        values=values,
        attrs=attrs,
    )
    nonfinite = sorted(
        k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)
    )
    assert list(record.attrs.get("nonfinite", ())) == nonfinite
    for k, v in values.items():
        assert record.values[k] == (None if k in nonfinite else v)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "r.jsonl")
        backend = JsonlBackend(path)  # the reporter's path: records serialised as-is
        backend.write([record])
        backend.close()
        with JsonlWriter(path) as w:  # the generic path: plain dicts
            w.write([record_to_dict(record)])
        lines = path.read_bytes().splitlines()
    assert len(lines) == 2
    assert lines[0] == lines[1]
    parsed = strict_loads(lines[0])
    assert parsed == record_to_dict(record)
    assert record_from_dict(parsed) == record
    assert parsed["attrs"].get("nonfinite", []) == nonfinite


# -- the fast path for plain dicts decides exactly as the entry-by-entry path ------------------


def _both_ways(values: Any, attrs: Any) -> tuple[Any, Any]:
    """(record or error text) built from plain dicts and from read-only mappings: a
    ``MappingProxyType`` is not a ``dict``, so it always takes the entry-by-entry path."""
    out: list[object] = []
    for v, a in ((values, attrs), (MappingProxyType(values), MappingProxyType(attrs))):
        try:
            r = rec(values=v, attrs=a)
            out.append((dict(r.values), dict(r.attrs), [type(x) for x in r.values.values()]))
        except RecordError as exc:
            out.append(str(exc))
    return out[0], out[1]


_any_value = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, False, None, "1.0", 2**63, 2**64 - 1, 2**64, -(2**63) - 1]),
)
_any_key = st.one_of(_key, st.sampled_from(["", "\udcff", "ü", 1]))


class _Flag(enum.StrEnum):
    """A str subclass in a list of text: the fast path leaves it to the reference."""

    PARTIAL = "partial"


_any_attr = st.one_of(
    _json_scalar,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["\ud800", "ü", 2**64, -(2**64), [1, 2], {"a": 1}]),
    st.lists(st.sampled_from(["partial", "warm-up", "", "ü", "\ud800", 1, None])),
    st.tuples(st.sampled_from(["drain", "ü"])),
    st.sampled_from([[_Flag.PARTIAL], ("a", ["b"])]),
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.dictionaries(_any_key, _any_value, max_size=8),
    attrs=st.dictionaries(_any_key, _any_attr, max_size=4),
)
def test_plain_dicts_and_other_mappings_give_the_same_record_or_error(
    values: dict[str | int, object], attrs: dict[str | int, object]
) -> None:
    fast, reference = _both_ways(values, attrs)
    assert fast == reference


@pytest.mark.parametrize(
    "values",
    [
        {"first": float("nan"), "b": 1.0},  # NaN first
        {"a": 1, "b": float("inf"), "c": -math.inf},
        {"big": 2**64 - 1, "neg": -(2**63)},  # the int limits, both legal
        {"just_over": 2**64},
        {"just_under": -(2**63) - 1},
        {"huge": 10**400},
        {"bytes": 1e20, "ns": 1.7e18, "n": 3},  # legal, large
        {},
    ],
)
def test_edge_values_take_either_path_to_the_same_result(values: dict[str, object]) -> None:
    fast, reference = _both_ways(values, {"phase": "train"})
    assert fast == reference


@pytest.mark.parametrize(
    "flags",
    [
        ["partial", "warm-up"],  # an observer's window_flags
        [],
        ("drain",),
        ["ü"],  # valid text the reference path checks
        ["\ud800"],  # a lone surrogate: refused
        ["partial", 1],
        [_Flag.PARTIAL],  # a str subclass: made plain text
        ["a", ["b"]],
    ],
)
def test_lists_of_text_in_attrs_take_either_path_to_the_same_result(flags: object) -> None:
    fast, reference = _both_ways({"a": 1.0}, {"window_flags": flags, "steps": 2})
    assert fast == reference
    if not isinstance(fast, str):
        assert type(fast[1]["window_flags"]) is tuple
    ascii_text = isinstance(flags, list | tuple) and all(
        type(f) is str and f.isascii() for f in flags
    )
    assert (_plain_attrs({"window_flags": flags}) is not None) == ascii_text  # (fast path)


def test_a_str_subclass_key_is_refused_as_on_the_reference_path() -> None:
    class Key(str):
        pass

    with pytest.raises(RecordError, match=r"values key 'loss' is a .*Key; keys must be str"):
        rec(values={Key("loss"): 1.0})


def test_a_record_from_the_fast_path_is_read_only_and_owns_its_copy() -> None:
    values = {"a": 1.0, "b": float("nan")}
    attrs: dict[str, Any] = {"phase": "train"}
    r = rec(values=values, attrs=attrs)
    values["a"] = 2.0
    attrs["phase"] = "other"
    assert r.values == {"a": 1.0, "b": None} and r.attrs == {"phase": "train", "nonfinite": ("b",)}
    with pytest.raises(TypeError, match="read-only"):
        r.values["a"] = 3.0  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        r.attrs["phase"] = "x"  # type: ignore[index]


def test_with_seq_stamps_a_copy_and_checks_only_the_seq() -> None:
    r = rec()
    stamped = with_seq(r, 7)
    assert (r.seq, stamped.seq) == (None, 7)
    assert stamped == msgspec.structs.replace(r, seq=7)
    assert stamped.values is r.values  # shared: both are read-only
    for bad in (-1, None, 1.0, True):
        with pytest.raises(RecordError, match=r"seq must be an int >= 0 to stamp a record"):
            with_seq(r, bad)  # type: ignore[arg-type]


def test_jsonl_backend_refuses_an_unstamped_record(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "r.jsonl")
    with pytest.raises(RecordError, match=r"has no seq; report it through MetricsReporter"):
        backend.write([rec()])
    backend.close()
    assert (tmp_path / "r.jsonl").read_bytes() == b""


def test_flat_key_names_kind_and_key_and_the_scope_unless_an_iteration() -> None:
    assert flat_key(rec(kind="rollout"), "tokens") == "rollout/tokens"  # as metrics.jsonl
    assert flat_key(rec(kind="rollout", scope="window"), "tokens") == "window/rollout/tokens"
    assert flat_key(rec(kind="run", scope="run"), "tokens") == "run/run/tokens"
    assert len({flat_key(rec(kind="train", scope=s), "tokens") for s in SCOPES}) == len(SCOPES)


def test_cut_short_is_an_iteration_record_whose_window_was_flagged_partial() -> None:
    def flagged(*flags: str, scope: str = "iteration") -> MetricRecord:
        return rec(scope=scope, attrs={"window_flags": list(flags)})

    assert cut_short(flagged("partial"))
    assert cut_short(flagged("warmup", "partial"))  # a run cut short in its first
    # one that took its optimizer step before the run stopped has a point of its own
    took = rec(attrs={"window_flags": ["partial"], "iteration_steps": 1})
    assert not cut_short(took)
    assert cut_short(rec(attrs={"window_flags": ["partial"], "iteration_steps": 0}))
    assert not cut_short(flagged())
    assert not cut_short(flagged("warmup")) and not cut_short(flagged("drain"))
    # a window's or the run's figures are whole; so are records without flags (the
    # caller's scalars, memory readings)
    assert not cut_short(flagged("partial", scope="run"))
    assert not cut_short(flagged("partial", scope="window"))
    assert not cut_short(rec(kind="grpo", attrs={}))
    # read back from metrics_raw.jsonl, the same
    assert cut_short(record_from_dict(record_to_dict(flagged("partial"))))
