"""twinkle.perf: what a span, a ``@timed`` call and a memory reading cost, against peers.

The floor is a loop of two bare ``time.perf_counter_ns()`` calls, the least any span can
do; a span's enter + exit is held to 4x that, and to less than what people time steps
with today:

* ``codetiming.Timer(name=..., logger=None)`` — what verl's step timers (``_timer`` /
  ``marked_timer``) open around every phase; a new ``Timer`` per use, as there.
* ``torch.profiler.record_function(name)`` with no profiler running — what torch code
  leaves in place to label regions.

Every loop runs interleaved with the others in one process and the best of many rounds
counts. Recorders are drained (and codetiming's class-level registry of timings cleared)
after each timed round, outside the timed section: that is the consumer's cost, not the
instrumented code's, and it keeps the state from growing.

The ``perf.span profile`` rows split a ``with rec.span("x")`` into its parts, measured
in the same run, each as its own loop minus the empty loop: the two clock readings, the
``span()`` call that makes the context object, the ``with`` statement's enter/exit
dispatch, and the record tuple queued on exit.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import psutil

from bench._harness import Loop, Row, has_module, interleaved_with_cleanup, missing_peer
from twinkle.perf import TimeRecorder, current_recorder, memory_stats, span, timed

SPAN_TARGET = 4.0  # x the floor
MEMORY_TARGET = 2.0  # x psutil.Process().memory_info()
FLOOR = "2x perf_counter_ns()"

Subjects = dict[str, tuple[Loop, Callable[[], object]]]


def _nothing() -> None:
    pass


class _Nothing:
    """The with-statement protocol alone: a lower bound for any context-manager span API."""

    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def _twinkle_loops(rec: TimeRecorder) -> Subjects:
    def floor(n: int) -> None:
        read = time.perf_counter_ns
        for _ in range(n):
            read()
            read()

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def recorder_span(n: int) -> None:
        for _ in range(n):
            with rec.span("x"):
                pass

    def module_span(n: int) -> None:
        for _ in range(n):
            with span("x"):
                pass

    reused = rec.span("x")

    def reused_span(n: int) -> None:
        ctx = reused
        for _ in range(n):
            with ctx:
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

    # -- the parts of a span, each alone -------------------------------------------------
    def protocol_new(n: int) -> None:
        for _ in range(n):
            with _Nothing():
                pass

    existing = _Nothing()

    def protocol_existing(n: int) -> None:
        ctx = existing
        for _ in range(n):
            with ctx:
                pass

    def make_context(n: int) -> None:
        make = rec.span
        for _ in range(n):
            make("x")

    queue: deque[tuple[object, ...]] = deque()
    get_ident = threading.get_ident

    def queue_record(n: int) -> None:
        append = queue.append
        for _ in range(n):
            append(("x", None, 1, 2, get_ident(), None))

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
        "floor": (floor, _nothing),
        "empty": (empty, _nothing),
        "recorder_span": (recorder_span, rec.drain),
        "module_span": (module_span, default.drain),
        "reused_span": (reused_span, rec.drain),
        "timed": (call_timed, rec.drain),
        "module_timed": (call_module_timed, default.drain),
        "bare": (call_bare, _nothing),
        "protocol_new": (protocol_new, _nothing),
        "protocol_existing": (protocol_existing, _nothing),
        "make_context": (make_context, _nothing),
        "queue_record": (queue_record, queue.clear),
        "drain": (drain, refill),
    }


def _peer_loops() -> Subjects:
    loops: Subjects = {}
    if has_module("codetiming"):
        from codetiming import Timer

        def codetiming_with(n: int) -> None:
            for _ in range(n):
                with Timer(name="x", logger=None):
                    pass

        @Timer(name="y", logger=None)
        def codetiming_fn() -> None:
            pass

        def codetiming_decorated(n: int) -> None:
            for _ in range(n):
                codetiming_fn()

        clear = Timer.timers.clear  # every named timing is kept in a class-level list
        loops["codetiming_with"] = (codetiming_with, clear)
        loops["codetiming_decorated"] = (codetiming_decorated, clear)
    if has_module("torch"):
        from torch.profiler import record_function

        def record_function_with(n: int) -> None:
            for _ in range(n):
                with record_function("x"):
                    pass

        @record_function("y")
        def record_function_fn() -> None:
            pass

        def record_function_decorated(n: int) -> None:
            for _ in range(n):
                record_function_fn()

        loops["record_function_with"] = (record_function_with, _nothing)
        loops["record_function_decorated"] = (record_function_decorated, _nothing)
    return loops


def _memory_loops() -> Subjects:
    def twinkle_reading(n: int) -> None:
        for _ in range(n):
            memory_stats()

    def psutil_reading(n: int) -> None:
        for _ in range(n):
            psutil.Process().memory_info()

    process = psutil.Process()

    def psutil_cached(n: int) -> None:
        for _ in range(n):
            process.memory_info()

    return {
        "memory_stats": (twinkle_reading, _nothing),
        "psutil": (psutil_reading, _nothing),
        "psutil_cached": (psutil_cached, _nothing),
    }


def _span_rows(ns: dict[str, float]) -> list[Row]:
    floor = ns["floor"]
    empty = ns["empty"]
    bare = ns["bare"]

    def vs_floor(subject: str, value: float, target: float | None = None, note: str = "") -> Row:
        ratio = value / floor
        return Row(
            benchmark="perf.span",
            subject=subject,
            value=value,
            unit="ns",
            ratio=ratio,
            baseline=FLOOR,
            target="" if target is None else f"<= {target:g}x",
            met=None if target is None else ratio <= target,
            note=note,
        )

    protocol_new = (ns["protocol_new"] - empty) / floor
    clocks = (floor - empty) / floor
    record = (ns["queue_record"] - empty) / floor
    bound = protocol_new + clocks + record
    why = (
        f"CPython floor of any new-object span: with on a new object {protocol_new:.1f}x + "
        f"2 clock reads {clocks:.1f}x + queueing a record {record:.1f}x = {bound:.1f}x, "
        "before the span() call's own cost (perf.span profile); @timed and a reused "
        "context meet 4x"
    )
    span_ratio = ns["recorder_span"] / floor
    rows = [
        Row("perf.span", "floor: 2x perf_counter_ns()", floor, "ns", 1.0),
        vs_floor(
            'with rec.span("x")',
            ns["recorder_span"],
            SPAN_TARGET,
            "" if span_ratio <= SPAN_TARGET else why,
        ),
        vs_floor(
            'with span("x") (current recorder)',
            ns["module_span"],
            SPAN_TARGET,
            "" if ns["module_span"] / floor <= SPAN_TARGET else why + "; + a contextvar read",
        ),
        vs_floor(
            "with ctx (ctx = rec.span(...) made once, entered each time)",
            ns["reused_span"],
            SPAN_TARGET,
            "the way to <= 4x in a hot loop: no object made per use",
        ),
        vs_floor("@rec.timed call - bare call", ns["timed"] - bare, SPAN_TARGET),
        vs_floor(
            "@timed call - bare call (current recorder)",
            ns["module_timed"] - bare,
            SPAN_TARGET,
        ),
    ]
    # (peer loop, peer label, short name, package); decorated loops pair with @rec.timed.
    peers = [
        (
            "codetiming_with",
            'with codetiming.Timer(name="x", logger=None)',
            "codetiming",
            "codetiming",
        ),
        (
            "codetiming_decorated",
            '@codetiming.Timer(name="y", logger=None) call',
            "codetiming",
            "codetiming",
        ),
        (
            "record_function_with",
            'with torch.profiler.record_function("x"), no profiler',
            "record_function",
            "torch",
        ),
        (
            "record_function_decorated",
            '@record_function("y") call, no profiler',
            "record_function",
            "torch",
        ),
    ]
    for peer, label, short, package in peers:
        decorated = peer.endswith("decorated")
        if peer not in ns:
            rows.append(missing_peer("perf.span", f"peer: {label}", package))
            continue
        ours, ours_label = ("timed", "@rec.timed") if decorated else ("recorder_span", "rec.span")
        peer_ns = ns[peer] - bare if decorated else ns[peer]
        ours_ns = ns[ours] - bare if decorated else ns[ours]
        rows.append(vs_floor(f"peer: {label}{' - bare call' if decorated else ''}", peer_ns))
        ratio = ours_ns / peer_ns
        rows.append(
            Row(
                benchmark="perf.span",
                subject=f"{ours_label} vs {short}{' (decorator)' if decorated else ''}",
                value=ours_ns,
                unit="ns",
                ratio=ratio,
                baseline=short,
                target="< 1x (faster)",
                met=ratio < 1.0,
            )
        )

    # -- profile: where a span's time goes ----------------------------------------------
    def part(subject: str, value: float, note: str = "") -> Row:
        return Row(
            benchmark="perf.span profile",
            subject=subject,
            value=value,
            unit="ns",
            ratio=value / floor,
            baseline=FLOOR,
            note=note,
        )

    make = ns["make_context"] - empty
    dispatch = ns["protocol_existing"] - empty
    clocks_ns = floor - empty
    record = ns["queue_record"] - empty
    parts_sum = empty + clocks_ns + make + dispatch + record
    rows += [
        part("empty for-loop (per iteration)", empty),
        part("two clock reads (floor - empty loop)", clocks_ns),
        part(
            'rec.span("x") call: make the context object',
            make,
            "method call + new 3-slot object + 2 slot stores",
        ),
        part("with-statement enter+exit on an existing object", dispatch),
        part(
            "ref: with on a new no-op object (make + enter/exit)",
            ns["protocol_new"] - empty,
            "any new-object context-manager API pays this",
        ),
        part("record: tuple + get_ident() + deque.append", record),
        part(
            "sum of the parts",
            parts_sum,
            f"measured span {ns['recorder_span']:.0f} ns; difference = slot reads in "
            "__enter__/__exit__ and cache effects",
        ),
        part("drain(), per span (consumer side, untimed above)", ns["drain"]),
    ]
    return rows


def _memory_rows(mem: dict[str, float]) -> list[Row]:
    ratio = mem["memory_stats"] / mem["psutil"]
    return [
        Row(
            benchmark="perf.memory",
            subject="memory_stats() (host-only worker)",
            value=mem["memory_stats"] / 1_000,
            unit="us",
            ratio=ratio,
            baseline="psutil.Process().memory_info()",
            target=f"<= {MEMORY_TARGET:g}x",
            met=ratio <= MEMORY_TARGET,
            note="includes identity (hostname, pid, rank) and peak RSS; psutil gives RSS only",
        ),
        Row(
            benchmark="perf.memory",
            subject="ref: memory_info() on a cached psutil.Process",
            value=mem["psutil_cached"] / 1_000,
            unit="us",
            ratio=mem["memory_stats"] / mem["psutil_cached"],
            baseline="memory_stats() / this",
        ),
    ]


def run(smoke: bool) -> list[Row]:
    """Measure and return the rows of the results table."""
    rec = TimeRecorder()
    subjects = {**_twinkle_loops(rec), **_peer_loops()}
    ns = interleaved_with_cleanup(subjects, n=1_000, repeats=5 if smoke else 200)
    mem = interleaved_with_cleanup(
        _memory_loops(), n=20 if smoke else 200, repeats=3 if smoke else 15
    )
    return _span_rows(ns) + _memory_rows(mem)
