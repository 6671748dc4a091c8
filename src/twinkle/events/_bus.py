"""``EventBus``: stamps events with the run's clock and sends them on the signals.

The bus is a publisher, so it may read a clock; observers never do. One bus serves one
run: it is the blinker *sender* of every event it publishes, so receivers connected with
``sender=bus`` see exactly that run.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import msgspec

from twinkle.checks import OWN_SOURCE_PREFIX, caller_source
from twinkle.checks import run_id as check_run_id
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.events._build import (
    figure_keys,
    items,
    mapping,
    raise_backwards,
    scalars_name_error,
    segment_fields,
    without_backwards,
)
from twinkle.events._codec import loggable_spans, validate_event
from twinkle.events._signals import SIGNALS
from twinkle.events._types import (
    BackendsClosed,
    EngineAck,
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    Status,
    WeightsPublished,
)
from twinkle.perf import Clock, ClockAnchor, Span, TimeRecorder
from twinkle.perf.stats import MemoryReading
from twinkle.reporting import BackendHealth, is_record_kind

__all__ = ["OVERHEAD_SOURCE", "OVERHEAD_SPAN", "EventBus"]

#: Name of the spans that time twinkle's own work on the caller's threads: every publish
#: (building, validating and dispatching the event, flushing recorders). The timing
#: observer deducts their union from the logical seconds, once.
OVERHEAD_SPAN = "twinkle.observe"
#: Source of the span batches of the overhead recorder: a name of twinkle's own
#: (:data:`~twinkle.checks.OWN_SOURCE_PREFIX`), which no other recorder or worker may take.
OVERHEAD_SOURCE = f"{OWN_SOURCE_PREFIX}observers"

_E = TypeVar("_E", bound=Event)
#: what a run binds a bus to (:meth:`EventBus.bind`): its receiver of an event, of several
Receiver = Callable[[Event], object]
ManyReceiver = Callable[[Sequence[Event]], object]
_log = logging.getLogger("twinkle.events")


class EventBus:
    """Publishes the events of one run: each event goes to the run bound to the bus
    (:meth:`bind`), then to the receivers of its signal.

    ``clock`` is the run's monotonic ns clock (inject a manual clock in tests);
    ``wall_clock`` gives unix-epoch ns. Recorders attached with :meth:`attach` are drained
    into :class:`SpanBatch` events by :meth:`flush_spans`, which runs automatically before
    every iteration boundary and before the run finishes, so a boundary event always comes
    after every span that closed before it.

    ``overhead``: a recorder for twinkle's own time. Every publishing call (event built,
    validated, dispatched; recorders flushed) is then one :data:`OVERHEAD_SPAN` span on
    the calling thread, so the observers can deduct it; attach the recorder too, so its
    spans reach the log.
    """

    __slots__ = (
        "_bound",
        "_bound_many",
        "_clock",
        "_lock",
        "_own",
        "_recorders",
        "_refusal",
        "_reserved",
        "_unbound",
        "_wall_clock",
        "anchor",
        "run_id",
        "validate",
    )

    def __init__(
        self,
        run_id: str,
        *,
        clock: Clock = time.perf_counter_ns,
        wall_clock: Clock = time.time_ns,
        validate: bool = True,
        overhead: TimeRecorder | None = None,
    ) -> None:
        self.run_id = check_run_id(run_id)
        self._clock = clock
        self._wall_clock = wall_clock
        self.validate = validate
        self._recorders: list[tuple[str, TimeRecorder]] = []
        self._own = overhead
        self._bound: Receiver | None = None
        self._bound_many: ManyReceiver | None = None
        self._unbound = False
        self._refusal: str | None = None
        self._reserved: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        mono = clock()
        self.anchor = ClockAnchor(
            monotonic_ns=mono, wall_ns=wall_clock(), pid=os.getpid(), hostname=socket.gethostname()
        )

    @property
    def clock(self) -> Clock:
        """The run's monotonic ns clock."""
        return self._clock

    def now_ns(self) -> int:
        """The run clock's current reading."""
        return self._clock()

    def times(self) -> tuple[int, int]:
        """The run's clocks read now (monotonic ns, unix-epoch ns): an event's stamp."""
        return self._clock(), self._wall_clock()

    # -- publishing -------------------------------------------------------------------

    def own_work(self, what: str) -> AbstractContextManager[object]:
        """A span of twinkle's own time on this thread (when an overhead recorder is set)."""
        own = self._own
        return nullcontext() if own is None else own.span(OVERHEAD_SPAN, event=what)

    def publish(self, event: Event) -> Event:
        """Validate ``event`` and send it on its signal, with this bus as the sender;
        returns what was sent (the checked copy, see :func:`validate_event`)."""
        if type(event) is ScalarsObserved:
            figure_keys(event.name, event.values)
        with self.own_work(event.TYPE):
            return self._send(event)

    def bind(self, receiver: Receiver | None, *, many: ManyReceiver | None = None) -> None:
        """Deliver every event to ``receiver`` first (the run owning this bus; those of
        :meth:`publish_all` to ``many`` at once, when given), then to the signal's; None
        unbinds (the run is over: a later event reaches no observer, the first says so)."""
        with self._lock:
            if receiver is not None and self._bound is not None:
                raise InvalidArgumentError(
                    f"the bus of run {self.run_id!r} already delivers to a run; one run per bus"
                )
            if receiver is None and self._bound is not None:
                self._unbound = True
            self._bound, self._bound_many = receiver, None if receiver is None else many

    def refuse(self, reason: str | None) -> None:
        """While no run is bound, refuse every publish with a
        :class:`~twinkle.errors.TwinkleError` saying ``reason`` (a session's bus before
        its start and after its finish); ``None`` lifts the refusal."""
        self._refusal = reason

    def forget_in_child(self, reason: str) -> None:
        """In a forked child (from an ``os.register_at_fork`` hook): drop the parent's
        run and refuse every publish with ``reason``. Takes no lock (another parent
        thread may have held it at the fork)."""
        self._bound = self._bound_many = None
        self._refusal = reason

    def publish_all(self, events: Sequence[Event], what: str) -> None:
        """Publish ``events`` as one (a span of twinkle's own time named ``what``): each
        is checked before any is sent, so one refused refuses them all."""
        with self.own_work(what):
            checked = [validate_event(e) for e in events] if self.validate else list(events)
            many = self._bound_many
            if many is not None:
                many(checked)  # (the run takes them all, or refuses them all)
            deliver = self._deliver if many is None else self._signal
            for event in checked:
                deliver(event)

    def _send(self, event: _E) -> _E:
        return self._deliver(validate_event(event) if self.validate else event)

    def _deliver(self, event: _E) -> _E:
        bound = self._bound
        if bound is not None:
            bound(event)
        elif self._refusal is not None:
            raise TwinkleError(f"cannot publish {event.TYPE}: {self._refusal}")
        elif self._unbound:
            self._unbound = False  # said once
            _log.warning(
                "run %r is over: its bus published %s after the run finished; that event "
                "(and any later one) reaches no observer and is not in the log",
                self.run_id,
                event.TYPE,
            )
        return self._signal(event)

    def _signal(self, event: _E) -> _E:
        signal = SIGNALS[type(event)]
        # (blinker's send costs as much as the rest of a publish: skipped for no receiver)
        if signal.receivers:
            signal.send(self, event=event)
        return event

    def attach(self, recorder: TimeRecorder, *, source: str) -> None:
        """Drain ``recorder`` into span batches named ``source`` at every flush (a name of
        twinkle's own, :data:`OVERHEAD_SOURCE`, only for the bus's overhead recorder)."""
        if not isinstance(source, str) or not source:
            raise InvalidArgumentError(f"source must be a non-empty string, got {source!r}")
        if recorder is not self._own:
            caller_source(source, "source")
        with self._lock:
            if any(s == source for s, _ in self._recorders):
                raise InvalidArgumentError(
                    f"a recorder is already attached as source {source!r}; pick another name"
                )
            self._recorders.append((source, recorder))

    def detach(self, source: str) -> None:
        """Stop draining the recorder attached as ``source`` (its pending spans are flushed)."""
        with self._lock:
            found = [(s, r) for s, r in self._recorders if s == source]
            self._recorders = [(s, r) for s, r in self._recorders if s != source]
        backwards: list[str] = []
        with self.own_work(SpanBatch.TYPE):
            for s, r in found:
                self._publish_spans(s, r, backwards)
        raise_backwards(backwards)

    def flush_spans(self) -> int:
        """Publish every finished span of the attached recorders; returns how many.

        A span that ends before it starts (its clock went backwards) is left out and the
        flush raises :class:`~twinkle.errors.RecordError` naming it, after every other
        span went out."""
        with self.own_work(SpanBatch.TYPE):
            backwards: list[str] = []
            count = self._flush_spans(backwards)
        raise_backwards(backwards)
        return count

    def _flush_spans(self, backwards: list[str], before: str | None = None) -> int:
        if before is not None and self._bound is None and self._refusal is not None:
            # (``before``, a boundary, refused as itself, its recorders left undrained)
            raise TwinkleError(f"cannot publish {before}: {self._refusal}")
        with self._lock:
            recorders = list(self._recorders)
        return sum(self._publish_spans(s, r, backwards) for s, r in recorders)

    def publish_spans(
        self,
        source: str,
        anchor: ClockAnchor,
        spans: Sequence[Any],
        *,
        dropped: int = 0,
        sent_anchor: ClockAnchor | None = None,
    ) -> None:
        """Publish spans recorded elsewhere (another process) with that process's anchor
        (a span that ends before it starts is refused as for :meth:`flush_spans`);
        ``dropped``: spans the source could not ship; ``sent_anchor``: its clocks read
        when it sent them (a worker report's), checked against this publish's time."""
        if isinstance(spans, str | bytes) or not isinstance(spans, Iterable):
            raise InvalidArgumentError(
                f"spans must be a sequence of twinkle.perf.Span, got {spans!r:.100}"
            )
        if isinstance(source, str):  # (validation names any other source)
            caller_source(source, "source")
        backwards: list[str] = []
        if spans or dropped:
            with self.own_work(SpanBatch.TYPE):
                self._send_spans(
                    source, anchor, spans, backwards, dropped=dropped, sent_anchor=sent_anchor
                )
        raise_backwards(backwards)

    def _publish_spans(self, source: str, recorder: TimeRecorder, backwards: list[str]) -> int:
        spans = recorder.drain()
        if spans:
            self._send_spans(source, recorder.anchor, spans, backwards)
        return len(spans)

    def _send_spans(
        self,
        source: str,
        anchor: ClockAnchor,
        spans: Sequence[Any],
        backwards: list[str],
        *,
        dropped: int = 0,
        sent_anchor: ClockAnchor | None = None,
    ) -> None:
        mono, wall = self.times()
        batch = loggable_spans(tuple(spans), source)
        bad = [s for s in batch if type(s) is Span and s.end_ns < s.start_ns]
        if bad:
            # Drained already: the good spans go out, the bad ones are named.
            batch = without_backwards(batch, bad, source, backwards)
            if not batch and not dropped:
                return
        self._send(SpanBatch(self.run_id, mono, wall, source, anchor, batch, dropped, sent_anchor))

    # -- builders for each event ------------------------------------------------------

    def run_started(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        plugins: Iterable[str] = (),
        plugins_left_out: Mapping[str, str] | None = None,
    ) -> RunStarted:
        """Publish :class:`RunStarted` with the caller's observer configuration, the
        names of the observer plugins the run loaded and those it left out (why)."""
        with self.own_work(RunStarted.TYPE):
            mono, wall = self.times()
            fields = segment_fields(config, plugins, plugins_left_out)
            event = self._send(RunStarted(self.run_id, mono, wall, self.anchor, *fields))
        return event

    def run_resumed(
        self,
        segment: int,
        config: Mapping[str, Any] | None = None,
        *,
        plugins: Iterable[str] = (),
        plugins_left_out: Mapping[str, str] | None = None,
    ) -> RunResumed:
        """Publish :class:`RunResumed`: this process continues the run as ``segment``
        (its anchor is read now: the clock continues the run's timeline), with the
        observer plugins ``plugins`` (and those left out, ``plugins_left_out``)."""
        with self.own_work(RunResumed.TYPE):
            self.anchor = ClockAnchor.read(
                self._clock, self._wall_clock, hostname=self.anchor.hostname
            )
            mono, wall = self.times()
            fields = segment_fields(config, plugins, plugins_left_out)
            event = self._send(RunResumed(self.run_id, mono, wall, self.anchor, segment, *fields))
        return event

    def iteration_started(self, iteration: int) -> IterationStarted:
        """Publish :class:`IterationStarted` after flushing every recorder.

        The boundary time is read *before* the flush, so the observers' work of flushing
        and dispatching belongs to the new iteration and arrives before its end."""
        with self.own_work(IterationStarted.TYPE):
            mono, wall = self.times()
            backwards: list[str] = []
            self._flush_spans(backwards, IterationStarted.TYPE)
            event = self._send(IterationStarted(self.run_id, mono, wall, iteration))
        raise_backwards(backwards)
        return event

    def weights_published(
        self, version: int, *, start_ns: int, end_ns: int, acks: Iterable[tuple[str, int]]
    ) -> WeightsPublished:
        """Publish :class:`WeightsPublished` (``acks``: (engine, acked_ns) pairs)."""
        acks = items(WeightsPublished, "acks", acks, "(engine, acked_ns) pairs")
        with self.own_work(WeightsPublished.TYPE):
            mono, wall = self.times()
            acked = tuple(EngineAck(engine, acked_ns) for engine, acked_ns in acks)
            event = self._send(
                WeightsPublished(self.run_id, mono, wall, version, start_ns, end_ns, acked)
            )
        return event

    def snapshot(self, state: Mapping[str, Any]) -> Snapshot:
        """Publish a :class:`Snapshot` of driver state (a plain dict)."""
        with self.own_work(Snapshot.TYPE):
            mono, wall = self.times()
            event = self._send(Snapshot(self.run_id, mono, wall, mapping(Snapshot, "state", state)))
        return event

    def samples(
        self,
        *,
        iteration: int,
        phase: str,
        lengths: Iterable[int],
        groups: int = 0,
        prompt_lengths: Iterable[int] = (),
    ) -> SamplesObserved:
        """Publish the caller's samples of ``iteration`` tagged with ``phase``
        (``prompt_lengths``: each sample's prompt tokens, counted in its length too; none
        given, none logged)."""
        with self.own_work(SamplesObserved.TYPE):
            mono, wall = self.times()
            event = self._send(
                SamplesObserved(
                    self.run_id,
                    mono,
                    wall,
                    iteration,
                    phase,
                    items(SamplesObserved, "lengths", lengths, "token lengths (ints)"),
                    groups,
                    items(SamplesObserved, "prompt_lengths", prompt_lengths, "token lengths (ints)")
                    or msgspec.UNSET,  # (none given: none logged)
                )
            )
        return event

    def optimizer_step(self, *, iteration: int, step: int, samples: int = 0) -> OptimizerStep:
        """Publish an :class:`OptimizerStep` (``step``: optimizer steps so far, 1-based)."""
        with self.own_work(OptimizerStep.TYPE):
            mono, wall = self.times()
            event = self._send(OptimizerStep(self.run_id, mono, wall, iteration, step, samples))
        return event

    def reserve_scalar_names(self, names: Iterable[str]) -> None:
        """Refuse :meth:`scalars` under ``names``: the kinds of the records the run's own
        observers make (a scalar's records take its name as their kind)."""
        self._reserved = frozenset(names)

    def scalars(
        self, *, iteration: int, name: str, values: Mapping[str, int | float]
    ) -> ScalarsObserved:
        """Publish the caller's named per-iteration figures (reward, loss, ...); ``name``
        becomes their records' kind, so it may not be one the run's observers use
        (:meth:`reserve_scalar_names`)."""
        if not is_record_kind(name) or name in self._reserved:
            raise scalars_name_error(name, self._reserved)
        with self.own_work(ScalarsObserved.TYPE):
            mono, wall = self.times()
            figures = mapping(ScalarsObserved, "values", values)
            figure_keys(name, figures)
            event = self._send(ScalarsObserved(self.run_id, mono, wall, iteration, name, figures))
        return event

    def memory(self, readings: Iterable[MemoryReading], *, iteration: int | None) -> MemoryReadings:
        """Publish raw per-worker memory readings."""
        with self.own_work(MemoryReadings.TYPE):
            mono, wall = self.times()
            event = self._send(
                MemoryReadings(
                    self.run_id,
                    mono,
                    wall,
                    iteration,
                    items(MemoryReadings, "readings", readings, "MemoryReading values"),
                )
            )
        return event

    def run_finished(
        self,
        *,
        status: Status = "ok",
        error: str | None = None,
        terminal_totals: Mapping[str, int | float] | None = None,
        records_dropped: int = 0,
        process_wall_ns: int | None = None,
        observer_slow_calls: Mapping[str, int] | None = None,
    ) -> RunFinished:
        """Publish :class:`RunFinished` after flushing every recorder (the end time is
        read before the flush, as for :meth:`iteration_started`)."""
        with self.own_work(RunFinished.TYPE):
            mono, wall = self.times()
            backwards: list[str] = []
            self._flush_spans(backwards, RunFinished.TYPE)
            event = self._send(
                RunFinished(
                    self.run_id,
                    mono,
                    wall,
                    status,
                    error,
                    dict(terminal_totals or {}),
                    records_dropped,
                    process_wall_ns,
                    dict(observer_slow_calls or {}),
                )
            )
        raise_backwards(backwards)
        return event

    def backends_closed(self, backends: Mapping[str, BackendHealth]) -> BackendsClosed:
        """Publish :class:`BackendsClosed`: what each record backend of this segment did
        with its records (after ``run_finished``, once the plugins' backends closed)."""
        with self.own_work(BackendsClosed.TYPE):
            mono, wall = self.times()
            event = self._send(BackendsClosed(self.run_id, mono, wall, dict(backends)))
        return event
