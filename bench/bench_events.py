"""Events: what a publish costs the caller, how fast a log replays, what a run keeps.

* ``events.publish``: CPU ns on the publishing thread (``time.thread_time_ns``) per event
  of the per-iteration mix in ``bench._workload`` (the boundary, samples, optimizer
  steps, scalars, memory, snapshot), published on the bus of a started ``RunSession``
  with every built-in observer (timeline, timing, throughput, memory, scalars and the
  four sinks; files in a temp dir). The event is built, stamped, validated, sent on its
  blinker signal and queued for the observers' dispatch thread (the default), which
  dispatches it to every observer in isolation; the records it produces are stamped and
  handed to the writer thread, the event log is batched for the same kind of writer.
  Compared, in turns, with a bare blinker ``send`` of a pre-built event to one no-op
  receiver (the least a signal-based bus can cost), with the same session dispatching
  on the publishing thread (``background_dispatch=False``: the observers' work on the
  caller), and with a session with no observers (the bus and dispatcher alone).
* ``events.plugin``: what one hook call of a third-party plugin costs the dispatching
  thread, made on the plugin's own thread (as a run makes it, so that a hung hook can
  be given up on), against the same call on the dispatching thread.
* ``events.replay``: events/s of :func:`twinkle.run.replay` re-running the built-in
  observers over a recorded ``events.jsonl`` (records, flat file, summary and trace
  rewritten), against the floor of merely splitting the file into lines and
  ``orjson.loads``-ing each.
* ``events.replay profile``: where a replay's time goes, each part as a multiple of that
  floor: reading the log, each observer's hooks (cProfile), the rest.
* ``events.memory``: RSS growth of a run with every built-in observer and no files
  over 10**6 events (after a warm-up): what the run keeps per iteration.
"""

from __future__ import annotations

import cProfile
import gc
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil
from blinker import Signal

from bench._harness import Row, interleaved, interleaved_with_cleanup
from bench._profile import hook_functions, plugin_shares
from bench._workload import (
    CONFIG,
    EVENTS_PER_ITERATION,
    SPAN_NAMES,
    publish_iteration,
    publish_results,
)
from twinkle.events import OVERHEAD_SOURCE, SIGNALS, EventBus
from twinkle.hookspecs import hookimpl
from twinkle.perf import TimeRecorder, memory_stats
from twinkle.plugins import HookCalls, make_plugin_manager
from twinkle.run import RunSession, iter_events, replay

PUBLISH_TARGET = 10.0  # x a bare blinker send, caller-thread CPU
BARE_TARGET = 3.0  # bus + dispatcher, no observers
REPLAY_TARGET = 50_000  # events/s
REPLAY_FLOOR_TARGET = 6.0  # x the orjson.loads floor
MEMORY_TARGET = 1 << 20  # bytes of RSS growth over 10**6 events


def _nothing() -> None:
    pass


class _PublishCpu:
    """The harness's clock for the publish rows: the caller's CPU (``thread_time``) in
    the publishing only, each loop timing its own iterations; what a loop does between
    them (waiting for the dispatch thread to catch up) is left out."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _publish_loop(
    session: RunSession, cpu: _PublishCpu, *, catch_up: bool = False
) -> Callable[[int], None]:
    """``catch_up``: a training loop's iterations, whose work (between the boundary and
    the results, and after them) outlasts the observers' (~0.8 ms per iteration of the
    mix): there, untimed, the loop waits until the dispatch thread dispatched what was
    published. Else the iterations' events go back to back."""
    counter = itertools.count()
    readings = [memory_stats()]
    bus = session.bus
    dispatcher = session.dispatcher
    assert dispatcher is not None
    clock = time.thread_time_ns

    def loop(n: int) -> None:
        for _ in range(n):
            it = next(counter)
            if not catch_up:
                t0 = clock()
                publish_iteration(bus, it, readings)
                cpu.ns += clock() - t0
                continue
            t0 = clock()
            bus.iteration_started(it)
            cpu.ns += clock() - t0
            dispatcher.flush()  # (the iteration's work)
            t0 = clock()
            publish_results(bus, it, readings)
            cpu.ns += clock() - t0
            dispatcher.flush()

    return loop


def _bus_loop(bus: EventBus, cpu: _PublishCpu) -> Callable[[int], None]:
    """The iteration mix on a bus bound to no run: built, stamped, checked, sent to no
    receiver (its boundary flushes the attached recorders)."""
    counter = itertools.count()
    readings = [memory_stats()]
    clock = time.thread_time_ns

    def loop(n: int) -> None:
        t0 = clock()
        for _ in range(n):
            publish_iteration(bus, next(counter), readings)
        cpu.ns += clock() - t0

    return loop


def _blinker_loop(events: list[Any], cpu: _PublishCpu) -> Callable[[int], None]:
    signal = Signal("bench")

    def receiver(sender: object, **kwargs: Any) -> None:
        pass

    signal.connect(receiver, weak=False)
    sender = object()
    clock = time.thread_time_ns

    def loop(n: int) -> None:
        send = signal.send
        for _ in range(n):
            t0 = clock()
            for event in events:
                send(sender, event=event)
            cpu.ns += clock() - t0

    return loop


def _sample_events() -> list[Any]:
    """One iteration's events as the bus builds them (captured, not timed)."""
    captured: list[Any] = []

    def keep(sender: object, *, event: Any) -> None:
        captured.append(event)

    session = RunSession(out_dir=None, config=CONFIG, builtins=False, autoload=False)
    session.start()
    try:
        for signal in SIGNALS.values():
            signal.connect(keep, sender=session.bus, weak=False)
        try:
            publish_iteration(session.bus, 0, [memory_stats()])
        finally:
            for signal in SIGNALS.values():
                signal.disconnect(keep, sender=session.bus)
    finally:
        session.finish()
    return captured


def _record_log(tmp: str, iterations: int, spans: int) -> Path:
    session = RunSession(out_dir=tmp, run_id="bench-replay", config=CONFIG, autoload=False)
    with session:
        rec = session.recorder
        readings = [memory_stats()]
        for it in range(iterations):
            for j in range(spans):
                with rec.span(SPAN_NAMES[j % len(SPAN_NAMES)], iteration=it):
                    pass
            publish_iteration(session.bus, it, readings)
    if session.out_dir is None:
        raise RuntimeError("the recording session wrote no files")
    return session.out_dir / "events.jsonl"


def _publish_rows(smoke: bool, tmp: str) -> list[Row]:
    observed = RunSession(out_dir=tmp, run_id="bench-publish", config=CONFIG, autoload=False)
    saturated = RunSession(
        out_dir=tmp, run_id="bench-publish-saturated", config=CONFIG, autoload=False
    )
    inline = RunSession(
        out_dir=tmp,
        run_id="bench-publish-inline",
        config=CONFIG,
        autoload=False,
        background_dispatch=False,
    )
    bare = RunSession(out_dir=None, config=CONFIG, builtins=False, autoload=False)
    own = TimeRecorder()
    owned_bus = EventBus("bench-bus-own", overhead=own)
    owned_bus.attach(own, source=OVERHEAD_SOURCE)
    observed.start()
    saturated.start()
    inline.start()
    bare.start()
    try:
        cpu = _PublishCpu()
        subjects = {
            "observed": (_publish_loop(observed, cpu, catch_up=True), observed.recorder.drain),
            "saturated": (_publish_loop(saturated, cpu), saturated.recorder.drain),
            "inline": (_publish_loop(inline, cpu), inline.recorder.drain),
            "bare_session": (_publish_loop(bare, cpu, catch_up=True), bare.recorder.drain),
            "bus": (_bus_loop(EventBus("bench-bus"), cpu), _nothing),
            "bus_own": (_bus_loop(owned_bus, cpu), _nothing),
            "blinker": (_blinker_loop(_sample_events(), cpu), _nothing),
        }
        ns = interleaved_with_cleanup(
            subjects, n=5 if smoke else 150, repeats=2 if smoke else 9, clock=cpu
        )
        dispatcher = observed.dispatcher
        waits = 0 if dispatcher is None else dispatcher.waits
    finally:
        observed.finish()
        saturated.finish()
        inline.finish()
        bare.finish()
    per_event = {k: v / EVENTS_PER_ITERATION for k, v in ns.items()}
    blinker = per_event["blinker"]
    observed_ratio = per_event["observed"] / blinker
    saturated_ratio = per_event["saturated"] / blinker
    inline_ratio = per_event["inline"] / blinker
    bare_ratio = per_event["bare_session"] / blinker
    bus_ratio, own_ratio = per_event["bus"] / blinker, per_event["bus_own"] / blinker
    parts = (
        f"building, stamping and checking each event {bus_ratio:.1f}x (a replay must "
        "accept what the bus accepts), twinkle's own-time span per call "
        f"{own_ratio - bus_ratio:.1f}x, the run's order check, queue and boundary (the "
        "recorders flushed, the dispatch thread woken and kept within one boundary) "
        f"{bare_ratio - own_ratio:.1f}x (the rows below)"
    )
    return [
        Row(
            "events.publish",
            "publish to every built-in observer (8-event iteration mix), the default "
            "(observers on their dispatch thread), caller CPU",
            per_event["observed"] / 1_000,
            "us/event",
            observed_ratio,
            "blinker send, 1 no-op receiver",
            target=f"<= {PUBLISH_TARGET:g}x",
            met=observed_ratio <= PUBLISH_TARGET,
            note="the caller builds, validates and queues; the observers' work is on one "
            "thread (the records of inline dispatch, its time counted as twinkle's own), "
            "which catches up after each iteration (untimed: as during a training "
            "iteration's work); "
            f"it waited for room {waits} time(s)",
        ),
        Row(
            "events.publish",
            "same, iterations back to back: the observers cannot keep up, caller CPU",
            per_event["saturated"] / 1_000,
            "us/event",
            saturated_ratio,
            "blinker send, 1 no-op receiver",
            note="each boundary waits until the events before it were dispatched: the "
            "caller's CPU of that waiting (lock, wake-up, the GIL handed back and forth) is "
            "in it",
        ),
        Row(
            "events.publish",
            "same, background_dispatch=False (observers on the publishing thread), caller CPU",
            per_event["inline"] / 1_000,
            "us/event",
            inline_ratio,
            "blinker send, 1 no-op receiver",
            note=f"{ns['inline'] / 1_000:,.0f} us per iteration: the observers' work itself, "
            "incl. the per-iteration records (timing, throughput, memory, scalars) computed "
            "at the boundary",
        ),
        Row(
            "events.publish",
            "publish, RunSession without observers (bus + dispatcher), caller CPU",
            per_event["bare_session"] / 1_000,
            "us/event",
            bare_ratio,
            "blinker send, 1 no-op receiver",
            target=f"<= {BARE_TARGET:g}x",
            met=bare_ratio <= BARE_TARGET,
            note=f"build + stamp + validate + send + overhead span + lifecycle check + queue: "
            f"{parts}",
        ),
        Row(
            "events.publish",
            "part: an EventBus bound to no run (build, stamp, check; no receiver), caller CPU",
            per_event["bus"] / 1_000,
            "us/event",
            bus_ratio,
            "blinker send, 1 no-op receiver",
        ),
        Row(
            "events.publish",
            "part: the same with twinkle's own-time recorder (a span per call), caller CPU",
            per_event["bus_own"] / 1_000,
            "us/event",
            own_ratio,
            "blinker send, 1 no-op receiver",
        ),
        Row(
            "events.publish",
            "peer: blinker Signal.send, 1 no-op receiver, caller CPU",
            blinker / 1_000,
            "us/event",
            1.0,
        ),
    ]


def _orjson_floor(log: Path) -> int:
    with log.open("rb") as fh:
        return sum(1 for line in fh if orjson.loads(line) is not None)


def _replay_rows(smoke: bool, tmp: str) -> list[Row]:
    log = _record_log(tmp, iterations=20 if smoke else 400, spans=20)
    repeats = 1 if smoke else 3
    best_replay = best_floor = best_read = float("inf")
    events = 0
    for k in range(repeats):
        t0 = time.perf_counter_ns()
        events = _orjson_floor(log)
        best_floor = min(best_floor, time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        read = sum(1 for _ in iter_events(log))
        best_read = min(best_read, time.perf_counter_ns() - t0)
        target = Path(tmp, f"replay-{k}")
        t0 = time.perf_counter_ns()
        result = replay(log, target, autoload=False)
        best_replay = min(best_replay, time.perf_counter_ns() - t0)
        if result.events != events or read != events:
            raise RuntimeError(f"replay saw {result.events} events, the log holds {events}")
    replay_rate = events / (best_replay / 1e9)
    floor_rate = events / (best_floor / 1e9)
    read_rate = events / (best_read / 1e9)
    floor_ratio = floor_rate / replay_rate
    profile = _replay_profile(log, Path(tmp, "replay-profiled"), best_replay, best_floor, best_read)
    top = ", ".join(f"{row.subject.split()[1]} {row.ratio:.0f}x" for row in profile[1:4])
    why = (
        ""
        if floor_ratio <= REPLAY_FLOOR_TARGET
        else f"; not met: decoding alone is "
        f"{floor_rate / read_rate:.1f}x the floor and each observer recomputes its figures "
        f"in Python ({top}: events.replay profile)"
    )
    return [
        Row(
            "events.replay",
            f"replay(events.jsonl) through the built-in observers ({events:,} events)",
            replay_rate,
            "events/s",
            floor_ratio,
            "orjson.loads of each line (time ratio)",
            target=f">= {REPLAY_TARGET:,} events/s, <= {REPLAY_FLOOR_TARGET:g}x floor",
            met=replay_rate >= REPLAY_TARGET and floor_ratio <= REPLAY_FLOOR_TARGET,
            note="rewrites records, flat file, summary and trace; 20 spans per iteration" + why,
        ),
        Row(
            "events.replay",
            "ref: iter_events(events.jsonl), read + decode + validate",
            read_rate,
            "events/s",
            floor_rate / read_rate,
            "orjson.loads of each line (time ratio)",
        ),
        Row(
            "events.replay",
            "floor: orjson.loads of each line",
            floor_rate,
            "events/s",
        ),
        *profile,
    ]


def _replay_profile(
    log: Path, target: Path, replay_ns: float, floor_ns: float, read_ns: float
) -> list[Row]:
    """Where a replay's time goes, as multiples of the ``orjson.loads`` floor: the log's
    reading (read, decode, validate: ``iter_events``, unprofiled), each observer's hooks
    (cProfile, cumulative, scaled to the unprofiled replay), and the rest (dispatch, the
    records' check, stamp and write, the summary). The times are the best of the
    replay rows' rounds."""
    pm = make_plugin_manager(autoload=False)
    hooks = hook_functions(pm)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        replay(log, target, plugin_manager=pm)
    finally:
        profiler.disable()
    shares, _ = plugin_shares(profiler, hooks)
    observers = sum(shares.values()) * replay_ns
    rows = [
        Row(
            "events.replay profile",
            "reading the log: read + decode + validate (iter_events, unprofiled)",
            read_ns / 1e6,
            "ms",
            read_ns / floor_ns,
            "orjson.loads floor",
        )
    ]
    for plugin, share in shares.items():
        rows.append(
            Row(
                "events.replay profile",
                f"observer: {plugin} (its hooks, cumulative)",
                share * replay_ns / 1e6,
                "ms",
                share * replay_ns / floor_ns,
                "orjson.loads floor",
            )
        )
    rest = max(0.0, replay_ns - observers - read_ns)
    rows.append(
        Row(
            "events.replay profile",
            "rest: dispatch, the records' check, stamp and write, summary",
            rest / 1e6,
            "ms",
            rest / floor_ns,
            "orjson.loads floor",
            note="the replay's time less the reading and the observers' hooks",
        )
    )
    return rows


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


class _EveryEvent:
    """A third-party observer with one hook for every event, doing nothing."""

    @hookimpl
    def twinkle_event(self, event: Any) -> None:
        pass


def _plugin_call_rows(smoke: bool) -> list[Row]:
    """What a third-party plugin's hook call costs the dispatching thread: on the
    plugin's own thread, waited for within backend_timeout_s (the run's calls), against
    the same call made on the dispatching thread (no time limit)."""
    pm = make_plugin_manager(autoload=False, builtins=False, plugins=[("p", _EveryEvent())])
    event = _sample_events()[0]
    isolated, direct = HookCalls(pm, hook_timeout_s=30.0), HookCalls(pm)

    def calling(calls: HookCalls) -> Callable[[int], None]:
        def loop(n: int) -> None:
            for _ in range(n):
                calls.call("twinkle_event", event=event)

        return loop

    n = 500 if smoke else 5_000
    ns = interleaved({"isolated": calling(isolated), "direct": calling(direct)}, n)
    isolated.close()
    return [
        Row(
            "events.plugin",
            "a third-party plugin's hook call, on the plugin's own thread (the run's)",
            ns["isolated"] / 1000,
            "us/call",
            ratio=ns["isolated"] / ns["direct"],
            baseline="the same call on the dispatching thread",
            note=f"{(ns['isolated'] - ns['direct']) / 1000:.1f} us a call for the hand-over "
            "(a queue put, a wake-up, an event set): what bounds a hung hook's wait "
            "(docs/hooks.md); twinkle's own observers are called directly",
        )
    ]


def _memory_rows(smoke: bool) -> list[Row]:
    iterations = 1_000 if smoke else 1_000_000 // EVENTS_PER_ITERATION
    session = RunSession(out_dir=None, config=CONFIG, autoload=False)
    session.start()
    assert session.dispatcher is not None
    try:
        loop = _publish_loop(session, _PublishCpu())
        loop(2_000 if not smoke else 100)  # warm-up: allocator pools, caches, first records
        session.dispatcher.flush()
        before = _rss()
        loop(iterations)
        session.dispatcher.flush()
        grown = _rss() - before
    finally:
        session.finish()
    events = iterations * EVENTS_PER_ITERATION
    return [
        Row(
            "events.memory",
            f"RSS growth over {events:,} events, every built-in observer, no files",
            grown / 2**10,
            "KiB",
            target=f"<= {MEMORY_TARGET >> 20} MiB",
            met=None if smoke else grown <= MEMORY_TARGET,
            note=f"{grown / iterations:.2f} B per iteration (after a warm-up)",
        )
    ]


def run(smoke: bool) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-events-") as tmp:
        return (
            _publish_rows(smoke, tmp)
            + _plugin_call_rows(smoke)
            + _replay_rows(smoke, tmp)
            + _memory_rows(smoke)
        )
