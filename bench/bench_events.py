"""Events: what a publish costs with the built-in observers, and how fast a log replays.

* ``events.publish``: ns per event of the per-iteration mix in ``bench._workload`` (the
  boundary, samples, optimizer steps, scalars, memory, snapshot), published on the bus
  of a started ``RunSession`` with every built-in observer (timing, throughput, memory,
  scalars and the four sinks; files in a temp dir). This is the caller-thread cost:
  the event is built, stamped, validated, sent on its blinker signal and dispatched to
  every observer in isolation; the records it produces are stamped and queued for the
  writer thread, the event log is batched for its own thread. Compared, in turns, with
  a bare blinker ``send`` of a pre-built event to one no-op receiver (the least a
  signal-based bus can cost), and with the same session with no observers (the bus and
  dispatcher alone).
* ``events.replay``: events/s of :func:`twinkle.replay.replay` re-running the built-in
  observers over a recorded ``events.jsonl`` (records, flat file, summary and trace
  rewritten), against merely reading and decoding the same log
  (:func:`twinkle.replay.iter_events`).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blinker import Signal

from bench._harness import Row, interleaved_with_cleanup
from bench._workload import CONFIG, EVENTS_PER_ITERATION, SPAN_NAMES, publish_iteration
from twinkle.events import SIGNALS
from twinkle.perf import memory_stats
from twinkle.replay import iter_events, replay
from twinkle.session import RunSession


def _nothing() -> None:
    pass


def _publish_loop(session: RunSession) -> Callable[[int], None]:
    counter = itertools.count()
    readings = [memory_stats()]
    bus = session.bus

    def loop(n: int) -> None:
        for _ in range(n):
            publish_iteration(bus, next(counter), readings)

    return loop


def _blinker_loop(events: list[Any]) -> Callable[[int], None]:
    signal = Signal("bench")

    def receiver(sender: object, **kwargs: Any) -> None:
        pass

    signal.connect(receiver, weak=False)
    sender = object()

    def loop(n: int) -> None:
        send = signal.send
        for _ in range(n):
            for event in events:
                send(sender, event=event)

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
    bare = RunSession(out_dir=None, config=CONFIG, builtins=False, autoload=False)
    observed.start()
    bare.start()
    try:
        subjects = {
            "observed": (_publish_loop(observed), observed.recorder.drain),
            "bare_session": (_publish_loop(bare), bare.recorder.drain),
            "blinker": (_blinker_loop(_sample_events()), _nothing),
        }
        ns = interleaved_with_cleanup(subjects, n=5 if smoke else 150, repeats=2 if smoke else 7)
    finally:
        observed.finish()
        bare.finish()
    per_event = {k: v / EVENTS_PER_ITERATION for k, v in ns.items()}
    blinker = per_event["blinker"]
    return [
        Row(
            "events.publish",
            "publish to the built-in observers (8-event iteration mix)",
            per_event["observed"] / 1_000,
            "us/event",
            per_event["observed"] / blinker,
            "blinker send, 1 no-op receiver",
            note=f"{ns['observed'] / 1_000:,.0f} us per iteration; incl. the per-iteration "
            "records (timing, throughput, memory, scalars) computed at the boundary",
        ),
        Row(
            "events.publish",
            "publish, RunSession without observers (bus + dispatcher)",
            per_event["bare_session"] / 1_000,
            "us/event",
            per_event["bare_session"] / blinker,
            "blinker send, 1 no-op receiver",
            note="build + stamp + validate + send + overhead span",
        ),
        Row(
            "events.publish",
            "peer: blinker Signal.send, 1 no-op receiver",
            blinker / 1_000,
            "us/event",
            1.0,
        ),
    ]


def _replay_rows(smoke: bool, tmp: str) -> list[Row]:
    log = _record_log(tmp, iterations=20 if smoke else 400, spans=20)
    repeats = 1 if smoke else 3
    best_replay = best_read = float("inf")
    events = 0
    for k in range(repeats):
        t0 = time.perf_counter_ns()
        events = sum(1 for _ in iter_events(log))
        best_read = min(best_read, time.perf_counter_ns() - t0)
        target = Path(tmp, f"replay-{k}")
        t0 = time.perf_counter_ns()
        result = replay(log, target, autoload=False)
        best_replay = min(best_replay, time.perf_counter_ns() - t0)
        if result.events != events:
            raise RuntimeError(f"replay saw {result.events} events, the log holds {events}")
    replay_rate = events / (best_replay / 1e9)
    read_rate = events / (best_read / 1e9)
    return [
        Row(
            "events.replay",
            f"replay(events.jsonl) through the built-in observers ({events:,} events)",
            replay_rate,
            "events/s",
            replay_rate / read_rate,
            "read + decode only",
            note="rewrites records, flat file, summary and trace; 20 spans per iteration",
        ),
        Row(
            "events.replay",
            "ref: iter_events(events.jsonl), read + decode only",
            read_rate,
            "events/s",
        ),
    ]


def run(smoke: bool) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-events-") as tmp:
        return _publish_rows(smoke, tmp) + _replay_rows(smoke, tmp)
