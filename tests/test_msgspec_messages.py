"""Every shape of msgspec's complaint that :func:`twinkle.checks.explain` reads (the
``- at `$path``` suffix, attribute, index and ``[...]`` steps, missing and unknown
fields, the bounds), checked end to end against the msgspec installed. msgspec is
pinned (constraints.txt) because twinkle's error messages are built from its wording:
a new msgspec that words them otherwise fails here, not in a user's error message."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from twinkle.checks import Count, Int64, Tokens, explain


class _Inner(msgspec.Struct, forbid_unknown_fields=True):
    n: Count


class _Checked(msgspec.Struct, forbid_unknown_fields=True):
    a: Int64
    values: dict[str, float]
    items: list[_Inner]
    tokens: Tokens = 0


def _explained(data: dict[str, Any]) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(data, _Checked)
    return explain(caught.value, data, "event")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"a": 2**63, "values": {}, "items": []},
            "event.a = 9223372036854775808: expected `int` <= 2**63 - 1",
        ),
        (
            {"a": -(2**63) - 1, "values": {}, "items": []},
            "event.a = -9223372036854775809: expected `int` >= -2**63",
        ),
        (
            {"a": 1, "values": {}, "items": [], "tokens": 2**53},
            "event.tokens = 9007199254740992: expected `int` <= 2**53 - 1",
        ),
        (
            {"a": 1, "values": {"ok": 1.0, "bad": "x"}, "items": []},
            "event.values['bad'] = 'x': expected `float`, got `str`",
        ),
        (
            {"a": 1, "values": {}, "items": [{"n": 1}, {"n": -1}]},
            "event.items[1].n = -1: expected `int` >= 0",
        ),
        ({"values": {}, "items": []}, "event lacks field(s) ['a']"),
        ({"a": 1, "values": {}, "items": [], "zz": 1}, "event has unknown field(s) ['zz']"),
        ({"a": "1", "values": {}, "items": []}, "event.a = '1': expected `int`, got `str`"),
    ],
)
def test_each_message_shape_explain_reads_names_the_place_the_value_and_the_rule(
    data: dict[str, Any], message: str
) -> None:
    assert _explained(data) == message
