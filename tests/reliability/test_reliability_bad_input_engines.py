"""Bad input to the engine pool, the port registry and the observer calls: a clear error
naming the argument and the value, never a ``TypeError`` from deep inside or a value
that is silently taken (an infinite timeout, a negative budget)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reliability._cases import Case
from twinkle.engines import Engine, EnginePool, PortRegistry
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.plugins import HookCalls, make_plugin_manager


def pool(**options: Any) -> Callable[[Path], object]:
    return lambda _: EnginePool(**options)


def hook_calls(**options: Any) -> Callable[[Path], object]:
    return lambda _: HookCalls(make_plugin_manager(autoload=False, builtins=False), **options)


NAN, INF = float("nan"), float("inf")

CASES = [
    # EnginePool
    Case(
        "max_concurrency 0",
        pool(max_concurrency=0),
        InvalidArgumentError,
        r"max_concurrency=0 must",
    ),
    Case(
        "max_concurrency bool",
        pool(max_concurrency=True),
        InvalidArgumentError,
        r"max_concurrency=True",
    ),
    Case(
        "max_concurrency str",
        pool(max_concurrency="2"),
        InvalidArgumentError,
        r"max_concurrency='2'",
    ),
    Case(
        "start_timeout 0",
        pool(start_timeout_s=0),
        InvalidArgumentError,
        r"start_timeout_s=0 must be a finite number > 0",
    ),
    Case(
        "start_timeout str", pool(start_timeout_s="5"), InvalidArgumentError, r"start_timeout_s='5'"
    ),
    Case(
        "start_timeout nan", pool(start_timeout_s=NAN), InvalidArgumentError, r"start_timeout_s=nan"
    ),
    Case(
        "start_timeout inf",
        pool(start_timeout_s=INF),
        InvalidArgumentError,
        r"start_timeout_s=inf .*or None for no limit",
    ),
    Case(
        "close_wait<0",
        pool(close_wait_s=-1),
        InvalidArgumentError,
        r"close_wait_s=-1 must be a finite number >= 0",
    ),
    Case("close_wait None", pool(close_wait_s=None), InvalidArgumentError, r"close_wait_s=None"),
    Case(
        "shutdown_timeout 0",
        pool(shutdown_timeout_s=0),
        InvalidArgumentError,
        r"shutdown_timeout_s=0 must be a finite number > 0",
    ),
    Case(
        "shutdown_timeout<0",
        pool(shutdown_timeout_s=-1.5),
        InvalidArgumentError,
        r"shutdown_timeout_s=-1\.5",
    ),
    Case(
        "shutdown_timeout nan",
        pool(shutdown_timeout_s=NAN),
        InvalidArgumentError,
        r"shutdown_timeout_s=nan",
    ),
    Case(
        "shutdown_timeout inf",
        pool(shutdown_timeout_s=INF),
        InvalidArgumentError,
        r"shutdown_timeout_s=inf .*or None for no limit",
    ),
    Case(
        "shutdown_timeout str",
        pool(shutdown_timeout_s="30"),
        InvalidArgumentError,
        r"shutdown_timeout_s='30'",
    ),
    Case(
        "shutdown_timeout bool",
        pool(shutdown_timeout_s=True),
        InvalidArgumentError,
        r"shutdown_timeout_s=True",
    ),
    # PortRegistry
    Case(
        "port_range privileged",
        lambda tmp: PortRegistry(tmp, port_range=(80, 90)),
        InvalidArgumentError,
        r"port_range=\(80, 90\)",
    ),
    Case(
        "port_range reversed",
        lambda tmp: PortRegistry(tmp, port_range=(20001, 20000)),
        InvalidArgumentError,
        r"port_range=\(20001, 20000\)",
    ),
    Case(
        "reserve 0",
        lambda tmp: PortRegistry(tmp, port_range=(15000, 15009)).reserve(0),
        InvalidArgumentError,
        r"count=0 must be an int between 1 and the size of port_range \(15000, 15009\) \(10\)",
    ),
    Case(
        "reserve > range",
        lambda tmp: PortRegistry(tmp, port_range=(15000, 15009)).reserve(11),
        InvalidArgumentError,
        r"count=11",
    ),
    # HookCalls
    Case(
        "slow_call<0",
        hook_calls(slow_call_s=-1),
        InvalidArgumentError,
        r"slow_call_s=-1 must be a finite number of seconds >= 0",
    ),
    Case("slow_call nan", hook_calls(slow_call_s=NAN), InvalidArgumentError, r"slow_call_s=nan"),
    Case(
        "slow_call inf",
        hook_calls(slow_call_s=INF),
        InvalidArgumentError,
        r"slow_call_s=inf .*or None to not time",
    ),
    Case("slow_call str", hook_calls(slow_call_s="1"), InvalidArgumentError, r"slow_call_s='1'"),
    Case("slow_call bool", hook_calls(slow_call_s=True), InvalidArgumentError, r"slow_call_s=True"),
    Case(
        "clock not callable",
        hook_calls(clock=3),
        InvalidArgumentError,
        r"clock=3 must be a callable",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_engine_and_observer_call_input_raises_a_clear_error(
    case: Case, tmp_path: Path
) -> None:
    with pytest.raises(case.error, match=case.match) as info:
        case.call(tmp_path)
    assert isinstance(info.value, TwinkleError)


@pytest.mark.parametrize(
    "options",
    [
        {"shutdown_timeout_s": None, "start_timeout_s": None, "close_wait_s": 0},
        {"shutdown_timeout_s": 0.01, "start_timeout_s": 1, "close_wait_s": 0.0},
    ],
)
def test_edge_values_that_mean_something_are_taken(options: dict[str, Any]) -> None:
    created: EnginePool[Engine] = EnginePool(**options)
    assert {k: getattr(created, k) for k in options} == options


def test_slow_call_s_zero_and_none_are_taken() -> None:
    pm = make_plugin_manager(autoload=False, builtins=False)
    assert HookCalls(pm, slow_call_s=0).slow_call_s == 0  # every call counts: a probe
    assert HookCalls(pm, slow_call_s=None).slow_call_s is None
