"""twinkle.perf.clock: the clock protocol, ManualClock and the per-process anchor."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.errors import InvalidArgumentError
from twinkle.perf import ClockAnchor, ManualClock, default_clock


def test_default_clock_is_perf_counter_ns() -> None:
    assert default_clock is time.perf_counter_ns


def test_manual_clock_reads_its_start_until_advanced() -> None:
    clock = ManualClock(1_000)
    assert clock() == 1_000
    assert clock() == 1_000
    assert clock.advance(250) == 1_250
    assert clock() == 1_250


def test_manual_clock_set_jumps_forward_and_to_the_same_time() -> None:
    clock = ManualClock(10)
    clock.set(10)
    clock.set(99)
    assert clock() == 99


def test_manual_clock_refuses_to_go_backwards() -> None:
    clock = ManualClock(100)
    with pytest.raises(InvalidArgumentError, match="never goes backwards"):
        clock.set(99)
    with pytest.raises(InvalidArgumentError, match=r"ns must be >= 0, got -1"):
        clock.advance(-1)
    assert clock() == 100


@pytest.mark.parametrize("bad", [1.5, True, "5", None])
def test_manual_clock_rejects_non_integer_nanoseconds(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="start_ns must be an int"):
        ManualClock(bad)  # type: ignore[arg-type]
    clock = ManualClock()
    with pytest.raises(InvalidArgumentError, match="ns must be an int"):
        clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ns must be an int"):
        clock.set(bad)  # type: ignore[arg-type]


def test_manual_clock_advances_from_many_threads_add_up() -> None:
    clock = ManualClock()

    def work() -> None:
        for _ in range(1_000):
            clock.advance(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock() == 8_000


@given(start=st.integers(0, 2**62), steps=st.lists(st.integers(0, 2**40), max_size=50))
def test_manual_clock_readings_never_decrease_and_sum_the_steps(
    start: int, steps: list[int]
) -> None:
    clock = ManualClock(start)
    readings = [clock()]
    for step in steps:
        readings.append(clock.advance(step))
        assert readings[-1] == clock()
    assert readings == sorted(readings)
    assert clock() == start + sum(steps)


def test_anchor_reads_monotonic_then_wall_once_each() -> None:
    calls: list[str] = []

    def monotonic() -> int:
        calls.append("monotonic")
        return 5

    def wall() -> int:
        calls.append("wall")
        return 1_700_000_000_000_000_000

    anchor = ClockAnchor.read(monotonic, wall)
    assert calls == ["monotonic", "wall"]
    assert anchor == ClockAnchor(5, 1_700_000_000_000_000_000, os.getpid(), socket.gethostname())


def test_anchor_maps_monotonic_readings_to_wall_time() -> None:
    anchor = ClockAnchor(monotonic_ns=1_000, wall_ns=50_000, pid=1, hostname="h")
    assert anchor.to_wall_ns(1_000) == 50_000
    assert anchor.to_wall_ns(1_500) == 50_500
    assert anchor.to_wall_ns(900) == 49_900


def test_anchor_rejects_a_clock_that_does_not_return_int_ns() -> None:
    with pytest.raises(InvalidArgumentError, match=r"clock\(\) must be an int"):
        ClockAnchor.read(time.perf_counter)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"wall_clock\(\) must be an int"):
        ClockAnchor.read(ManualClock(), time.time)  # type: ignore[arg-type]


def test_anchor_round_trips_through_a_dict() -> None:
    anchor = ClockAnchor(monotonic_ns=3, wall_ns=4, pid=5, hostname="node-1")
    assert ClockAnchor.from_dict(anchor.to_dict()) == anchor


@pytest.mark.parametrize(
    "data",
    [
        {"monotonic_ns": 3, "wall_ns": 4, "pid": 5},
        {"monotonic_ns": 3, "wall_ns": 4, "pid": 5, "hostname": "h", "extra": 1},
        {"monotonic_ns": 3.0, "wall_ns": 4, "pid": 5, "hostname": "h"},
        {"monotonic_ns": 3, "wall_ns": 4, "pid": 5, "hostname": 7},
        [("monotonic_ns", 3)],
    ],
)
def test_anchor_from_dict_rejects_malformed_data(data: object) -> None:
    with pytest.raises(InvalidArgumentError, match="data"):
        ClockAnchor.from_dict(data)  # type: ignore[arg-type]


def test_anchor_shift_onto_places_another_process_on_the_timeline() -> None:
    run = ClockAnchor(monotonic_ns=1_000, wall_ns=10_000, pid=1, hostname="a")
    same = ClockAnchor(monotonic_ns=2_000, wall_ns=11_003, pid=1, hostname="a")
    other = ClockAnchor(monotonic_ns=500, wall_ns=10_100, pid=2, hostname="a")
    assert same.shift_onto(run) == 0  # one process, one clock: re-read anchors never shift
    assert other.shift_onto(None) == 0
    # other's reading 500 happened at wall 10_100, which is run's monotonic 1_100
    assert 500 + other.shift_onto(run) == 1_100
