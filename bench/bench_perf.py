"""twinkle.perf: what a span, a ``@timed`` call and a memory reading cost.

The floor is a loop of two bare ``time.perf_counter_ns()`` calls, the least any span can
do; a span's enter + exit is held to 4x that. Every loop runs interleaved with the
others in one process and the best of many rounds counts. The recorder is drained after
each timed round, outside the timed section (draining is the consumer's cost, not the
instrumented code's), so its queue never grows past one round.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from bench._harness import Row
from twinkle.perf import TimeRecorder, current_recorder, memory_stats, span, timed

Loop = Callable[[int], None]

SPAN_TARGET = 4.0  # x the floor
MEMORY_TARGET = 2.0  # x psutil.Process().memory_info()


def _best_ns(
    subjects: dict[str, tuple[Loop, Callable[[], object]]], n: int, rounds: int
) -> dict[str, float]:
    """Best ns per iteration of each loop; loops take turns; cleanup runs untimed."""
    clock = time.perf_counter_ns
    best = dict.fromkeys(subjects, float("inf"))
    for _ in range(rounds):
        for name, (loop, cleanup) in subjects.items():
            start = clock()
            loop(n)
            elapsed = clock() - start
            cleanup()
            best[name] = min(best[name], elapsed / n)
    return best


def _span_loops(rec: TimeRecorder) -> dict[str, tuple[Loop, Callable[[], object]]]:
    def floor(n: int) -> None:
        read = time.perf_counter_ns
        for _ in range(n):
            read()
            read()

    def recorder_span(n: int) -> None:
        for _ in range(n):
            with rec.span("x"):
                pass

    def module_span(n: int) -> None:
        for _ in range(n):
            with span("x"):
                pass

    class _Nothing:  # the with-statement protocol alone: a lower bound for any span API
        __slots__ = ()

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            pass

    def protocol(n: int) -> None:
        for _ in range(n):
            with _Nothing():
                pass

    @rec.timed
    def timed_fn() -> None:
        pass

    @timed
    def module_timed_fn() -> None:
        pass

    def bare_fn() -> None:
        pass

    def call_timed(n: int) -> None:
        for _ in range(n):
            timed_fn()

    def call_module_timed(n: int) -> None:
        for _ in range(n):
            module_timed_fn()

    def call_bare(n: int) -> None:
        for _ in range(n):
            bare_fn()

    def nothing() -> None:
        pass

    drained = TimeRecorder()

    def drain(n: int) -> None:  # the consumer's side: n spans recorded beforehand
        drained.drain()

    def refill() -> None:
        for _ in range(1_000):
            with drained.span("x"):
                pass

    refill()
    default = current_recorder()
    return {
        "floor": (floor, nothing),
        "recorder_span": (recorder_span, rec.drain),
        "module_span": (module_span, default.drain),
        "protocol": (protocol, nothing),
        "timed": (call_timed, rec.drain),
        "module_timed": (call_module_timed, default.drain),
        "bare": (call_bare, nothing),
        "drain": (drain, refill),
    }


def _memory_loops() -> dict[str, tuple[Loop, Callable[[], object]]]:
    def twinkle_reading(n: int) -> None:
        for _ in range(n):
            memory_stats()

    def psutil_reading(n: int) -> None:
        for _ in range(n):
            psutil.Process().memory_info()

    def nothing() -> None:
        pass

    return {"memory_stats": (twinkle_reading, nothing), "psutil": (psutil_reading, nothing)}


def run(smoke: bool) -> list[Row]:
    """Measure and return the rows of the results table."""
    rec = TimeRecorder()
    ns = _best_ns(_span_loops(rec), n=1_000, rounds=5 if smoke else 300)
    floor = ns["floor"]
    timed_overhead = ns["timed"] - ns["bare"]
    module_timed_overhead = ns["module_timed"] - ns["bare"]
    mem = _best_ns(_memory_loops(), n=20 if smoke else 200, rounds=3 if smoke else 15)

    def vs_floor(subject: str, value: float, target: float | None) -> Row:
        ratio = value / floor
        return Row(
            benchmark="perf.span",
            subject=subject,
            value=value,
            unit="ns",
            ratio=ratio,
            baseline="2x perf_counter_ns()",
            target="" if target is None else f"<= {target:g}x",
            met=None if target is None else ratio <= target,
        )

    memory_ratio = mem["memory_stats"] / mem["psutil"]
    return [
        Row("perf.span", "floor: 2x perf_counter_ns()", floor, "ns", 1.0),
        vs_floor('with rec.span("x")', ns["recorder_span"], SPAN_TARGET),
        vs_floor('with span("x") (current recorder)', ns["module_span"], SPAN_TARGET),
        vs_floor("@rec.timed call - bare call", timed_overhead, SPAN_TARGET),
        vs_floor("@timed call - bare call (current recorder)", module_timed_overhead, None),
        vs_floor("ref: empty with on a new no-op object", ns["protocol"], None),
        vs_floor("drain(), per span (consumer side, untimed above)", ns["drain"], None),
        Row(
            benchmark="perf.memory",
            subject="memory_stats()",
            value=mem["memory_stats"] / 1_000,
            unit="us",
            ratio=memory_ratio,
            baseline="psutil.Process().memory_info()",
            target=f"<= {MEMORY_TARGET:g}x",
            met=memory_ratio <= MEMORY_TARGET,
        ),
    ]
