"""FrozenDict: the one read-only dict, of a record's values and attrs and of an event's
free-form fields."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import orjson
import pytest

from twinkle.events import FrozenDict as EventsFrozenDict
from twinkle.events import freeze
from twinkle.reporting import make_record
from twinkle.reporting._frozen import FrozenDict


def test_records_and_events_share_one_frozen_dict_class() -> None:
    record = make_record(
        kind="train",
        scope="iteration",
        run_id="r",
        step=0,
        iteration=0,
        wall_ns=0,
        monotonic_ns=0,
        values={"a": 1.0},
        attrs={"d": {"k": 1}},
    )
    assert EventsFrozenDict is FrozenDict
    assert type(record.values) is FrozenDict and type(record.attrs["d"]) is FrozenDict
    assert type(freeze({"k": {"x": 1}})["k"]) is FrozenDict


def test_a_frozen_dict_refuses_every_change_saying_what_to_do() -> None:
    value = FrozenDict({"a": 1})
    changes: list[Callable[[], object]] = [
        lambda: value.__setitem__("a", 2),
        lambda: value.__delitem__("a"),
        lambda: value.__ior__({"b": 2}),
        value.clear,
        lambda: value.pop("a"),
        value.popitem,
        lambda: value.setdefault("b", 2),
        lambda: value.update(b=2),
    ]
    for change in changes:
        with pytest.raises(TypeError, match=r"FrozenDict is read-only: .*copy it first"):
            change()
    assert value == {"a": 1}


def test_a_frozen_dict_is_a_plain_json_object_that_hashes_pickles_and_copies() -> None:
    value = FrozenDict({"b": (1, 2), "a": FrozenDict({"c": None})})
    assert repr(value) == repr({"b": (1, 2), "a": {"c": None}})
    assert orjson.dumps(value) == b'{"b":[1,2],"a":{"c":null}}'
    assert hash(value) == hash(FrozenDict({"a": FrozenDict({"c": None}), "b": (1, 2)}))
    back = pickle.loads(pickle.dumps(value))
    assert back == value and type(back) is FrozenDict and type(back["a"]) is FrozenDict
    assert copy.copy(value) is value and copy.deepcopy(value) is value
    with pytest.raises(TypeError, match="unhashable"):
        hash(freeze({"xs": [1]}))  # a FrozenList inside: hashable only when its values are
