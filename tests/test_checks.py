"""twinkle.checks: the shared argument checks (here: seconds; the event log's value types
are tested with the messages in test_msgspec_messages.py, numbers in test_numbers.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.checks import as_int, check_seconds, is_integer
from twinkle.errors import InvalidArgumentError


class Seconds(float):
    """A float subclass, as numpy's ``float64`` is."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0.0), (0.0, 0.0), (-0.0, 0.0), (3, 3.0), (2.5, 2.5), (Seconds(1.5), 1.5), (1e300, 1e300)],
)
def test_seconds_come_back_as_plain_floats(value: object, expected: float) -> None:
    got = check_seconds("timeout_s", value)
    assert got == expected
    assert type(got) is float
    assert math.copysign(1.0, got) == 1.0  # -0.0 comes back as 0.0


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (True, "True"),
        (False, "False"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (-1, "-1"),
        (-1e-300, "-1e-300"),
        ("1", "'1'"),
        (b"1", "b'1'"),
        ([1], r"\[1\]"),
        (None, "None"),
        (10**400, r"1000000.*0000"),  # beyond the float range: no OverflowError
    ],
)
def test_what_is_no_duration_is_refused_naming_the_argument_and_the_value(
    value: object, shown: str
) -> None:
    with pytest.raises(
        InvalidArgumentError, match=rf"^timeout_s={shown} must be a finite number of seconds >= 0$"
    ):
        check_seconds("timeout_s", value)


def test_zero_is_refused_when_it_would_mean_nothing() -> None:
    for zero in (0, 0.0, -0.0):
        with pytest.raises(InvalidArgumentError, match=r"must be a finite number of seconds > 0"):
            check_seconds("start_timeout_s", zero, zero_ok=False)
    assert check_seconds("start_timeout_s", 1e-9, zero_ok=False) == 1e-9


def test_none_is_taken_only_where_it_means_something_and_the_message_says_what() -> None:
    assert check_seconds("timeout", None, none_ok=True) is None
    with pytest.raises(
        InvalidArgumentError, match=r"timeout=-1 must .* >= 0, or None to wait forever$"
    ):
        check_seconds("timeout", -1, none_ok=True, none_means="to wait forever")
    with pytest.raises(InvalidArgumentError, match=r"^close_wait_s=None must .* >= 0$"):
        check_seconds("close_wait_s", None)


def test_the_message_says_what_the_seconds_bound_and_names_the_kind() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_seconds(
            "slow_call_s", math.nan, none_ok=True, means="counted slow", none_means="not timed"
        )
    assert str(info.value) == (
        "slow_call_s=nan must be a finite number of seconds >= 0 (counted slow), or None not timed"
    )
    with pytest.raises(InvalidArgumentError, match=r"^x_s=0 must be a finite number > 0$"):
        check_seconds("x_s", 0, zero_ok=False, what="a finite number")


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_seconds("timeout_s", "9" * 10_000)
    assert len(str(info.value)) < 200


@given(st.floats(min_value=0.0, allow_infinity=False, allow_nan=False))
def test_every_finite_float_from_zero_up_is_taken_unchanged(value: float) -> None:
    assert check_seconds("t", value) == value


@given(st.floats(max_value=-1e-320) | st.integers(max_value=-1))
def test_every_negative_number_is_refused(value: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^t=.* >= 0$"):
        check_seconds("t", value, none_ok=False)


@pytest.mark.parametrize(
    ("value", "integer"),
    [
        (0, True),
        (-3, True),
        (2**70, True),
        (True, False),
        (False, False),
        (1.0, False),
        ("1", False),
        (None, False),
    ],
)
def test_an_integer_is_an_int_that_is_no_bool(value: object, integer: bool) -> None:
    assert is_integer(value) is integer
    assert as_int(value) is (value if integer else None)
