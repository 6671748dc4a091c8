"""The streaming loop re-simulated: a deterministic discrete-event simulation (SimPy) of
the recorded run's engines, trainer, buffer and weight publications under
:class:`Changes` (docs/metrics.md, "What if: predicting another configuration").

The schedule is the :class:`~twinkle.driver.StreamingDriver`'s as the demo drives it:

* each engine makes its share of every iteration in order; iteration ``i`` needs weight
  version ``max(first, i - lag)``, and the engine waits until it holds it;
* a finished item goes into the buffer (``buffer`` items at most: a full buffer holds
  the engine until the trainer takes one);
* the trainer begins iteration ``i``, takes items until it holds every engine's share
  of ``i`` (items of later iterations are kept for them), then trains;
* version ``v`` (trained through ``v - 1``) is published once the rollouts of
  ``v - 1 + lag`` are in (right after training ``v - 1`` when the lag is 0), only when
  a rollout uses it; a publication still loading holds the trainer until it is done;
  each engine loads ``v`` once it has made its item of ``v - 1 + lag``.

Each piece of work takes its recorded time, scaled by the changes (see
:mod:`twinkle.whatif._work`); the gaps between pieces are the recorded ones.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from twinkle.events import Event, WeightsPublished
from twinkle.events._types import EngineAck
from twinkle.perf import Span
from twinkle.whatif._recorded import Piece, Recorded

__all__ = ["Timeline", "simulate"]

#: the work of an engine's item, of a trainer iteration: the pieces to run, scaled
Work = Callable[[int], tuple[Piece, ...]]


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """One predicted engine: its name, thread, first start, gaps, its items' work and
    its load time per version."""

    name: str
    pid: int
    thread: int
    load_thread: int
    start_ns: int
    item_gap_ns: int
    load_gap_ns: int
    items: Work
    load_ns: Callable[[int], int]


@dataclass(frozen=True, slots=True)
class Plan:
    """What the simulation runs: the iterations, the lag, the buffer (None: unbounded),
    the engines and the trainer's work per iteration."""

    iterations: tuple[int, ...]
    lag: int
    buffer: int | None
    engines: tuple[EnginePlan, ...]
    trainer: Work
    trainer_pid: int
    trainer_thread: int
    handoff_ns: int
    engine_wait: str
    trainer_wait: str | None
    load_name: str


@dataclass(slots=True)
class Timeline:
    """What the simulation made: spans, the iterations' begin times, each iteration's
    wait end and its pieces' ends (to place its events), the publications, the end."""

    spans: list[Span] = field(default_factory=list)
    begins: dict[int, int] = field(default_factory=dict)
    ready: dict[int, int] = field(default_factory=dict)
    piece_ends: dict[int, list[int]] = field(default_factory=dict)
    published: list[Event] = field(default_factory=list)
    end_ns: int = 0


class _Loop:
    def __init__(self, plan: Plan, recorded: Recorded) -> None:
        self.plan = plan
        self.recorded = recorded
        self.env = simpy.Environment(initial_time=min(e.start_ns for e in plan.engines))
        capacity = plan.buffer if plan.buffer is not None else float("inf")
        self.buffer = simpy.Store(self.env, capacity=capacity)
        self.out = Timeline()
        first = plan.iterations[0]
        self.version = {e.name: first for e in plan.engines}
        self.loaded: dict[str, dict[int, simpy.Event]] = {e.name: {} for e in plan.engines}
        self.made = {e.name: {i: self.env.event() for i in plan.iterations} for e in plan.engines}
        self.publishing: simpy.Event | None = None

    def _loaded(self, engine: str, version: int) -> simpy.Event:
        return self.loaded[engine].setdefault(version, self.env.event())

    def _span(self, name: str, start: int, where: tuple[int, int], attrs: Any) -> None:
        """A span from ``start`` to now on ``where`` (pid, thread)."""
        pid, thread = where
        self.out.spans.append(Span(name, start, int(self.env.now), thread, pid, dict(attrs), None))

    def _run(
        self, pieces: tuple[Piece, ...], pid: int, thread: int
    ) -> Generator[Any, Any, list[int]]:
        ends = []
        for p in pieces:
            yield self.env.timeout(p.gap_ns)
            start = int(self.env.now)
            yield self.env.timeout(p.duration_ns)
            self._span(p.name, start, (pid, thread), p.attrs)
            ends.append(int(self.env.now))
        return ends

    def engine(self, e: EnginePlan) -> Generator[Any, Any, None]:
        env, plan = self.env, self.plan
        yield env.timeout(e.start_ns - env.now)
        first = plan.iterations[0]
        for it in plan.iterations:
            need = max(first, it - plan.lag)
            if self.version[e.name] < need:
                waited = int(env.now)
                yield self._loaded(e.name, need)
                attrs = {"engine": e.name, "version": need}
                self._span(plan.engine_wait, waited, (e.pid, e.thread), attrs)
            yield env.timeout(e.item_gap_ns)
            yield from self._run(_with_version(e.items(it), need), e.pid, e.thread)
            self.made[e.name][it].succeed()
            yield self.buffer.put((it, e.name))

    def load(self, e: EnginePlan, version: int) -> Generator[Any, Any, tuple[str, int]]:
        needed = version - 1 + self.plan.lag
        if needed in self.made[e.name]:
            yield self.made[e.name][needed]
        yield self.env.timeout(e.load_gap_ns)
        start = int(self.env.now)
        yield self.env.timeout(e.load_ns(version))
        attrs = {"engine": e.name, "version": version}
        self._span(self.plan.load_name, start, (e.pid, e.load_thread), attrs)
        self.version[e.name] = version
        self._loaded(e.name, version).succeed()
        return e.name, int(self.env.now)

    def publish(self, version: int) -> Generator[Any, Any, None]:
        """The trainer publishes ``version``: it waits for one still loading first."""
        if self.publishing is not None and not self.publishing.triggered:
            yield self.publishing
        start = int(self.env.now)
        loads = [self.env.process(self.load(e, version)) for e in self.plan.engines]
        done = self.env.all_of(loads)
        self.publishing = done
        self.env.process(self._announce(version, start, done))

    def _announce(self, version: int, start: int, done: simpy.Event) -> Generator[Any, Any, None]:
        acks = yield done
        end = int(self.env.now)
        r = self.recorded.first
        self.out.published.append(
            WeightsPublished(
                r.run_id,
                end,
                end + self.recorded.wall_offset_ns,
                version,
                start,
                end,
                tuple(EngineAck(name, at) for name, at in acks.values()),
            )
        )

    def trainer(self) -> Generator[Any, Any, None]:
        env, plan, out = self.env, self.plan, self.out
        its = plan.iterations
        stash: dict[int, int] = {}
        t0 = self.recorded.trainer[0].begin_ns
        yield env.timeout(max(0, t0 - env.now))
        for k, it in enumerate(its):
            begin = out.begins[it] = int(env.now)
            for p in self.recorded.trainer[k].lead:  # (drawn, taking no time of their own)
                start = begin + p.gap_ns
                span = Span(p.name, start, start + p.duration_ns, plan.trainer_thread,
                            plan.trainer_pid, dict(p.attrs), None)  # fmt: skip
                out.spans.append(span)
            while stash.get(it, 0) < len(plan.engines):
                item_it, _ = yield self.buffer.get()
                stash[item_it] = stash.get(item_it, 0) + 1
            yield env.timeout(plan.handoff_ns)
            out.ready[it] = int(env.now)
            if plan.trainer_wait is not None:
                where = (plan.trainer_pid, plan.trainer_thread)
                self._span(plan.trainer_wait, begin, where, {"iteration": it})
            if plan.lag:
                for version in self._due(it):
                    yield from self.publish(version)
            out.piece_ends[it] = yield from self._run(
                plan.trainer(it), plan.trainer_pid, plan.trainer_thread
            )
            if not plan.lag:
                for version in self._due(it):
                    yield from self.publish(version)
            yield env.timeout(self.recorded.trainer[k].tail_ns)
        out.end_ns = int(env.now)

    def _due(self, rollouts_in: int) -> list[int]:
        """The versions published once the rollouts of ``rollouts_in`` are in (and,
        with lag 0, its training done): ``v`` with ``v - 1 + lag == rollouts_in``,
        trained already and used by a rollout."""
        v = rollouts_in + 1 - self.plan.lag
        last = self.plan.iterations[-1]
        # (trained through v - 1 = rollouts_in - lag: done before rollouts_in trains
        # when lag >= 1, and the call comes after it trained when lag is 0)
        if v > self.plan.iterations[0] and v + self.plan.lag <= last:
            return [v]
        return []


def _with_version(pieces: tuple[Piece, ...], version: int) -> tuple[Piece, ...]:
    """``pieces`` whose ``version`` attribute is the one the item is generated with."""
    return tuple(
        replace(p, attrs={**p.attrs, "version": version}) if "version" in p.attrs else p
        for p in pieces
    )


def simulate(plan: Plan, recorded: Recorded) -> Timeline:
    """Run ``plan`` to its end; the timeline it made."""
    loop = _Loop(plan, recorded)
    for e in plan.engines:
        loop.env.process(loop.engine(e))
    trainer = loop.env.process(loop.trainer())
    loop.env.run(until=trainer)
    return loop.out
