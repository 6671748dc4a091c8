"""The recorded run ``twinkle whatif``'s tests predict from (tests/whatif): small
enough to work out by hand.

The recorded run (milliseconds): one engine ``e0`` generates each iteration's 100
tokens in 10 ms; the trainer trains each iteration in 6 ms (one ``train.step``); lag 1;
loading a version takes 2 ms. As the streaming driver runs it:

====  =========================  ================================================
it    engine e0                  trainer
====  =========================  ================================================
0     generate 0-10 (v0)         begin 0, rollouts in at 10, train 10-16
1     generate 10-20 (v0)        begin 16, in at 20: publish v1 (load 20-22), train 20-26
2     waits v1 20-22, gen 22-32  begin 26, in at 32, train 32-38; the run ends at 38
====  =========================  ================================================
"""

from __future__ import annotations

from typing import Any

from twinkle.events import (
    Event,
    IterationStarted,
    RunFinished,
    RunStarted,
    SamplesObserved,
    SpanBatch,
    WeightsPublished,
)
from twinkle.events._types import EngineAck
from twinkle.perf import ClockAnchor, Span

MS = 1_000_000
WALL = 1_700_000_000_000_000_000
ANCHOR = ClockAnchor(0, WALL, 1, "h")
PID, TRAINER, ENGINE, LOADER = 1, 10, 20, 21
CONFIG: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"], "publish": ["weights.load"]},
    "throughput": {"rollout": {"samples": "rollout"}, "train": {"samples": "train"}},
    "window": {"samples": "rollout"},
    "placement": {
        "trainer": {"device_type": "gpu", "devices": ["gpu:t"], "phases": ["train"]},
        "e0": {"device_type": "gpu", "devices": ["gpu:e0"], "phases": ["rollout", "publish"]},
    },
    "streaming": {"generation": "rollout", "training": "train", "publish": "publish"},
    "total_steps": 3,
}


def _span(name: str, start: int, end: int, thread: int, **attrs: Any) -> Span:
    return Span(name, start * MS, end * MS, thread, PID, attrs, None)


def _at(ms: int) -> tuple[str, int, int]:
    return ("r", ms * MS, WALL + ms * MS)


def recorded_events() -> list[Event]:
    """The recorded run of the module's table."""
    gen = [(0, 10, 0), (10, 20, 0), (22, 32, 1)]  # (start, end, version) per iteration
    begins, ready, train = [0, 16, 26], [10, 20, 32], [(10, 16), (20, 26), (32, 38)]
    out: list[Event] = [RunStarted(*_at(0), ANCHOR, CONFIG)]
    for it in range(3):
        spans = [_span("wait.rollout", begins[it], ready[it], TRAINER, iteration=it)]
        if it == 2:
            spans.append(_span("wait.weights", 20, 22, ENGINE, engine="e0", version=1))
        start, end, version = gen[it]
        attrs = {"iteration": it, "engine": "e0", "version": version, "tokens": 100}
        spans.append(_span("generate", start, end, ENGINE, **attrs))
        out.append(IterationStarted(*_at(begins[it]), it))
        out.append(SamplesObserved(*_at(ready[it]), it, "rollout", (50, 50)))
        if it == 1:
            spans.append(_span("weights.load", 20, 22, LOADER, engine="e0", version=1))
            out.append(WeightsPublished(*_at(22), 1, 20 * MS, 22 * MS, (EngineAck("e0", 22 * MS),)))
        spans.append(_span("train.step", *train[it], TRAINER, iteration=it))
        out.append(SamplesObserved(*_at(train[it][1]), it, "train", (50, 50)))
        out.append(SpanBatch(*_at(train[it][1]), "main", ANCHOR, tuple(spans)))
    out.append(RunFinished(*_at(38)))
    return out
