"""``StreamingDriver``: producers run ahead of the trainer into a bounded, staleness-bounded
buffer; the trainer takes batches and publishes weights back.

The driver knows nothing of what an item means (no tokens, rewards or phases). It
publishes exactly three events on the bus: ``iteration_started``, ``weights_published``
(after every engine acknowledged) and ``snapshot`` (a plain dict of its state).

Threads: one daemon thread per producer, one per weight publication and, when the
publisher is a list of engines, one per engine load. All shared state lives behind one
``threading.Condition``; every change notifies it, so a waiting trainer wakes at once
(waits also time out every 50 ms as a safety net, never longer).

Clocks: every *measured* time (item production, idle and wait seconds, publication and
acknowledgement times) is read from ``bus.now_ns()`` so that a manual clock makes them
deterministic. Timeouts are real waiting and use ``time.monotonic``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from twinkle.driver._publish import PublishFailure, PublishTarget, adapt_publisher
from twinkle.driver._state import (
    CloseReport,
    DriverState,
    ProducerState,
    ProducerStats,
    ProducerTally,
    Publication,
    check_int,
    check_timeout,
    plain_state,
)
from twinkle.driver._types import (
    DriverTimeoutError,
    Item,
    ProducerLike,
    ProducersExhaustedError,
    Publisher,
    WeightLoader,
    adapt_producers,
)
from twinkle.errors import DriverError, InvalidArgumentError
from twinkle.events import EventBus

__all__ = ["CloseReport", "StreamingDriver"]

_log = logging.getLogger("twinkle.driver")
_POLL_S = 0.05
_CLOSE_TIMEOUT_S = 5.0

T = TypeVar("T")


class StreamingDriver(Generic[T]):
    """Runs rollout producers ahead of the trainer and publishes weights back.

    :param producers: ``{name: producer}`` or a sequence (named by a producer's ``name``
        attribute, else ``producer0``, ``producer1``...). A producer is a callable
        ``producer(version) -> payload``, an engine handle with ``produce(version)``, or an
        iterable of payloads (a generator function is a callable: pass the generator it
        returns). Each runs on its own daemon thread; ``StopIteration`` ends it
        (exhausted), any other exception fails the driver.
    :param bus: the run's :class:`~twinkle.events.EventBus` (events and clock).
    :param publisher: where :meth:`publish_weights` sends weights: a callable
        ``publisher(version, weights) -> Iterable[ack]`` yielding one ack per engine as
        each engine loaded them (an engine name, stamped when received, or
        ``(engine, acked_ns)`` on the bus clock), or an engine / a sequence / a mapping of
        engines with ``load_weights(version, weights)`` (run concurrently, one thread per
        engine; returning is the acknowledgement).
    :param buffer_size: the most items buffered; a producer finding it full blocks
        (counted as its idle time) until the trainer consumes.
    :param max_staleness: the most weight versions an item may lag the current version
        and still be consumed; staler items are dropped and counted per producer.
    :param initial_version: the weight version producers start with.
    :param first_iteration: the number of the first iteration it begins (a resumed run
        continues after its last one: ``RunSession.resumed.next_iteration``).
    :param auto_iterations: when true (default) every :meth:`next_batch` call begins the
        next iteration (0, 1, 2, ...) and publishes ``iteration_started`` *before* it
        waits, so waiting for rollouts is part of the iteration. Set it false to begin
        iterations yourself with :meth:`begin_iteration` (e.g. several batches per
        iteration).

    Use it as a context manager (``with StreamingDriver(...) as driver:``) or call
    :meth:`start` / :meth:`close`. A failure of any producer or of a background weight
    publication is raised in the trainer's thread at its next :meth:`next_batch`,
    :meth:`publish_weights` or :meth:`snapshot` call as :class:`~twinkle.errors.DriverError`
    naming the culprit, with the original exception as ``__cause__``.
    """

    def __init__(
        self,
        producers: Mapping[str, ProducerLike[T]] | Sequence[ProducerLike[T]],
        *,
        bus: EventBus,
        publisher: Publisher
        | WeightLoader
        | Sequence[WeightLoader]
        | Mapping[str, WeightLoader]
        | None = None,
        buffer_size: int = 64,
        max_staleness: int = 1,
        initial_version: int = 0,
        auto_iterations: bool = True,
        first_iteration: int = 0,
    ) -> None:
        if not isinstance(bus, EventBus):
            raise InvalidArgumentError(
                f"bus must be a twinkle.events.EventBus, got {type(bus).__name__}; pass "
                "run.bus of a RunSession or EventBus(run_id)"
            )
        self._bus = bus
        self._produce: dict[str, Callable[[int], Any]] = adapt_producers(producers)
        self._target: PublishTarget | None = (
            None if publisher is None else adapt_publisher(publisher)
        )
        self._buffer_size = check_int("buffer_size", buffer_size, 1)
        self._max_staleness = check_int("max_staleness", max_staleness, 0)
        self._version = check_int("initial_version", initial_version, 0)
        self._auto_iterations = bool(auto_iterations)
        self._cond = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._buffer: deque[Item[T]] = deque()
        self._states = {name: ProducerTally(name) for name in self._produce}
        self._threads: dict[str, threading.Thread] = {}
        self._publication: Publication | None = None
        self._first_iteration = check_int("first_iteration", first_iteration, 0)
        self._next_iteration = self._first_iteration
        self._high_water = 0
        self._wait_ns = 0
        self._trainer_waiting = False
        self._failure: tuple[str, BaseException] | None = None
        self._failure_surfaced = False
        self._started = False
        self._closed = False
        self._report: CloseReport | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> StreamingDriver[T]:
        """Start the producer threads (idempotent; :meth:`next_batch` calls it too)."""
        with self._cond:
            if self._closed:
                raise DriverError("the driver is closed; build a new StreamingDriver")
            if self._started:
                return self
            self._started = True
            for name, produce in self._produce.items():
                thread = threading.Thread(
                    target=self._run_producer,
                    args=(self._states[name], produce),
                    name=f"twinkle-producer-{name}",
                    daemon=True,
                )
                self._threads[name] = thread
                self._states[name].state = ProducerState.PRODUCING
        for thread in self._threads.values():
            thread.start()
        return self

    def close(self, timeout: float | None = _CLOSE_TIMEOUT_S) -> CloseReport:
        """Stop the producers and join every thread the driver started.

        Waits at most ``timeout`` seconds in all (``None``: as long as it takes);
        whatever still runs then (a producer stuck inside its own code, an engine that
        never returns from ``load_weights``) is reported in the returned
        :class:`CloseReport`, logged, and shown in :meth:`state` under ``"hung"``, not
        waited on forever. Idempotent. A failure
        no driver call has reported yet is logged (the ``with`` block raises it instead).
        """
        return self._close(check_timeout("timeout", timeout), log_failure=True)

    def _close(self, seconds: float | None, *, log_failure: bool) -> CloseReport:
        with self._cond:
            if self._report is not None:
                return self._report
            self._closed = True
            self._stop.set()
            self._cond.notify_all()
        deadline = None if seconds is None else time.monotonic() + seconds

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        hung_producers: list[str] = []
        for name, thread in self._threads.items():
            thread.join(left())
            if thread.is_alive():
                hung_producers.append(name)
        hung_publishing: list[str] = []
        with self._cond:
            publication = self._publication
        if publication is not None and publication.thread is not None:
            publication.thread.join(left())
            if publication.thread.is_alive():
                hung_publishing.append(f"publishing weights version {publication.version}")
        engine_threads = [] if self._target is None else list(self._target.threads)
        for label, thread in engine_threads:
            thread.join(left())
            if thread.is_alive():
                hung_publishing.append(f"engine {label!r} loading weights")
        report = CloseReport(tuple(hung_producers), tuple(hung_publishing))
        with self._cond:
            now = self._bus.now_ns()
            for name, st in self._states.items():
                self._unblock_locked(st, now)
                if name in hung_producers:
                    st.state = ProducerState.HUNG
                elif st.state not in (ProducerState.EXHAUSTED, ProducerState.FAILED):
                    st.state = ProducerState.STOPPED
            self._report = report
            self._cond.notify_all()
        if not report.clean:
            _log.warning(
                "StreamingDriver.close: still running after %.3gs (daemon threads, left "
                "behind): producers %s; publishing %s",
                seconds,
                list(report.hung_producers),
                list(report.hung_publishing),
            )
        with self._cond:
            if log_failure and self._failure is not None and not self._failure_surfaced:
                where, exc = self._failure
                _log.error(
                    "StreamingDriver closed with an unreported failure in %s: %r", where, exc
                )
        return report

    def __enter__(self) -> StreamingDriver[T]:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(_CLOSE_TIMEOUT_S, log_failure=exc is not None)
        if exc is None:
            with self._cond:
                if self._failure is not None and not self._failure_surfaced:
                    self._raise_failure_locked()

    # -- trainer side -------------------------------------------------------------------

    def begin_iteration(self) -> int:
        """Begin the next iteration and publish ``iteration_started``; returns its number.

        Only with ``auto_iterations=False``; otherwise :meth:`next_batch` does it.
        """
        if self._auto_iterations:
            raise DriverError(
                "begin_iteration() is for auto_iterations=False; this driver begins an "
                "iteration at every next_batch() call"
            )
        self._check_usable()
        return self._begin()

    def _begin(self) -> int:
        with self._cond:
            iteration = self._next_iteration
            self._next_iteration += 1
        self._bus.iteration_started(iteration)
        return iteration

    def next_batch(self, n: int, *, timeout: float | None = None) -> list[Item[T]]:
        """The next ``n`` items, oldest first, waiting for producers as needed.

        Items more than ``max_staleness`` versions behind never reach the trainer.
        Raises :class:`DriverTimeoutError` after ``timeout`` seconds (items stay
        buffered), :class:`ProducersExhaustedError` when every producer ended and fewer
        than ``n`` items remain, and :class:`~twinkle.errors.DriverError` for a failed
        producer or publication.
        """
        n = check_int("n", n, 1)
        if n > self._buffer_size:
            raise InvalidArgumentError(
                f"n={n} is larger than buffer_size={self._buffer_size}; a batch must fit in "
                f"the buffer: build the driver with buffer_size >= {n}"
            )
        seconds = check_timeout("timeout", timeout)
        self._check_usable()
        self.start()
        if self._auto_iterations:
            self._begin()
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._cond:
            waited_from: int | None = None
            try:
                while len(self._buffer) < n:
                    self._check_usable_locked()
                    if all(st.state.finished for st in self._states.values()):
                        raise ProducersExhaustedError(
                            f"every producer is exhausted and {len(self._buffer)} item(s) "
                            f"remain, fewer than n={n}; take them with a smaller n or close()"
                        )
                    wait_s = _POLL_S
                    if deadline is not None:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise DriverTimeoutError(
                                f"next_batch(n={n}) got only {len(self._buffer)} item(s) "
                                f"within {seconds}s; the items stay buffered; producers: "
                                f"{self._producer_states_locked()}"
                            )
                        wait_s = min(wait_s, remaining)
                    if waited_from is None:
                        waited_from = self._bus.now_ns()
                        self._trainer_waiting = True
                        self._cond.notify_all()
                    self._cond.wait(wait_s)
                self._check_usable_locked()
            finally:
                if waited_from is not None:
                    self._wait_ns += self._bus.now_ns() - waited_from
                    self._trainer_waiting = False
            batch = [self._buffer.popleft() for _ in range(n)]
            for item in batch:
                st = self._states[item.producer]
                st.buffered -= 1
                st.consumed += 1
            self._cond.notify_all()
        return batch

    def publish_weights(
        self,
        weights: Any,
        *,
        version: int | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> int:
        """Publish ``weights`` to every engine as ``version`` (default: current + 1).

        A publication still in flight is waited for first, so versions complete in order.
        Once every engine acknowledged, the driver publishes ``weights_published`` (start,
        end and per-engine ack times on the bus clock) and only then makes ``version``
        the one producers get. ``wait=False`` returns at once (the next iteration overlaps
        the loading); a failure then surfaces at the next driver call. With ``wait=True``
        a ``timeout`` raises :class:`DriverTimeoutError` naming the engines that have not
        acknowledged (the publication keeps going). Returns the version.
        """
        if version is not None:
            check_int("version", version, 0)
        seconds = check_timeout("timeout", timeout)
        self._check_usable()
        if self._target is None:
            raise DriverError(
                "this driver has no publisher; build it with publisher=publisher(version, "
                "weights) or publisher=[engines with load_weights(version, weights)]"
            )
        deadline = None if seconds is None else time.monotonic() + seconds
        self._wait_publication(deadline, seconds)
        with self._cond:
            new = self._version + 1 if version is None else version
            if new <= self._version:
                raise InvalidArgumentError(
                    f"version={new} is not newer than the current weight version "
                    f"{self._version}; pass a larger version or leave it None"
                )
            publication = Publication(new)
            thread = threading.Thread(
                target=self._run_publication,
                args=(publication, weights, self._bus.now_ns()),
                name=f"twinkle-publish-v{new}",
                daemon=True,
            )
            publication.thread = thread
            self._publication = publication
        thread.start()
        if wait:
            self._wait_publication(deadline, seconds)
        return new

    def wait_published(self, timeout: float | None = None) -> int:
        """Wait for a weight publication in flight; returns the current version."""
        seconds = check_timeout("timeout", timeout)
        self._check_usable()
        self._wait_publication(None if seconds is None else time.monotonic() + seconds, seconds)
        with self._cond:
            return self._version

    def snapshot(self) -> DriverState:
        """Publish a ``snapshot`` event of :meth:`state` and return that state.

        The event carries it as a plain dict: the same keys in the same order, producer
        states as their string values. Raises a pending, not yet reported failure first;
        after close it still works (it shows hung producers)."""
        with self._cond:
            if self._failure is not None and not self._failure_surfaced:
                self._raise_failure_locked()
            state = self._state_locked()
        self._bus.snapshot(plain_state(state))
        return state

    # -- inspection -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The weight version producers are handed now."""
        with self._cond:
            return self._version

    @property
    def iteration(self) -> int | None:
        """The number of the last iteration begun (``None`` before the first)."""
        with self._cond:
            started = self._next_iteration > self._first_iteration
            return self._next_iteration - 1 if started else None

    def state(self) -> DriverState:
        """The driver's state, without publishing it: a fresh :class:`DriverState` (its
        declaration documents every key; per producer a :class:`ProducerStats` whose
        ``state`` is a :class:`ProducerState`)."""
        with self._cond:
            return self._state_locked()

    def wait_until(
        self, predicate: Callable[[DriverState], bool], timeout: float | None = None
    ) -> DriverState:
        """Wait until ``predicate(state())`` holds (re-checked at every change of state);
        returns that state, or raises :class:`DriverTimeoutError` after ``timeout``
        seconds (``None``: no limit). For monitors and tests; it raises no failures."""
        seconds = check_timeout("timeout", timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._cond:
            while True:
                state = self._state_locked()
                if predicate(state):
                    return state
                wait_s = _POLL_S
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DriverTimeoutError(
                            f"the driver state did not satisfy the predicate within "
                            f"{seconds}s; last state: {plain_state(state)!r}"
                        )
                    wait_s = min(wait_s, remaining)
                self._cond.wait(wait_s)

    # -- producer threads -------------------------------------------------------------------

    def _run_producer(self, st: ProducerTally, produce: Callable[[int], Any]) -> None:
        while not self._stop.is_set():
            with self._cond:
                version = self._version
            try:
                payload = produce(version)
            except StopIteration:
                with self._cond:
                    st.state = ProducerState.EXHAUSTED
                    self._cond.notify_all()
                return
            except BaseException as exc:
                with self._cond:
                    st.state = ProducerState.FAILED
                    self._set_failure_locked(f"producer {st.name!r}", exc)
                return
            item = Item(payload, version, st.name, self._bus.now_ns())
            if not self._offer(st, item):
                return

    def _offer(self, st: ProducerTally, item: Item[T]) -> bool:
        with self._cond:
            while True:
                if self._stop.is_set():
                    self._unblock_locked(st, self._bus.now_ns())
                    return False
                if self._version - item.version > self._max_staleness:
                    st.produced += 1
                    st.dropped += 1
                    self._unblock_locked(st, self._bus.now_ns())
                    self._cond.notify_all()
                    return True
                if len(self._buffer) < self._buffer_size:
                    break
                if st.blocked_since_ns is None:
                    st.blocked_since_ns = self._bus.now_ns()
                    st.state = ProducerState.BLOCKED
                    self._cond.notify_all()
                self._cond.wait(_POLL_S)
            self._unblock_locked(st, self._bus.now_ns())
            self._buffer.append(item)
            st.produced += 1
            st.buffered += 1
            self._high_water = max(self._high_water, len(self._buffer))
            self._cond.notify_all()
            return True

    @staticmethod
    def _unblock_locked(st: ProducerTally, now_ns: int) -> None:
        if st.blocked_since_ns is not None:
            st.idle_ns += now_ns - st.blocked_since_ns
            st.blocked_since_ns = None
            if st.state is ProducerState.BLOCKED:
                st.state = ProducerState.PRODUCING

    # -- publication thread -------------------------------------------------------------------

    def _run_publication(self, publication: Publication, weights: Any, start_ns: int) -> None:
        target = self._target
        if target is None:  # pragma: no cover - publish_weights checks first
            return
        version = publication.version
        try:
            acks = target.run(version, weights, self._bus.now_ns, self._stop, publication.acked)
        except PublishFailure as failure:
            with self._cond:
                if not self._stop.is_set():  # a close() cancelling the wait is no failure
                    self._set_failure_locked(
                        f"{failure.where} (publishing weights version {version})", failure.exc
                    )
                self._publication = None
                self._cond.notify_all()
            return
        if self._stop.is_set():
            # Finished after close() gave up on it (an interrupted run, typically): the
            # run may be over, publish nothing; worth a note, not a warning.
            _log.info(
                "StreamingDriver: weights version %d finished loading after close(); "
                "no weights_published event",
                version,
            )
            with self._cond:
                self._publication = None
            return
        try:
            end_ns = max(acked_ns for _, acked_ns in acks)
            self._bus.weights_published(version, start_ns=start_ns, end_ns=end_ns, acks=acks)
        except BaseException as exc:
            with self._cond:
                self._set_failure_locked(
                    f"publishing the weights_published event of version {version}", exc
                )
        finally:
            # Every engine serves the new weights now, whatever an observer did with the
            # event: producers must get the version the engines really hold.
            with self._cond:
                self._set_version_locked(version)
                self._publication = None
                self._cond.notify_all()

    def _set_version_locked(self, version: int) -> None:
        self._version = version
        fresh: deque[Item[T]] = deque()
        for item in self._buffer:
            if version - item.version > self._max_staleness:
                st = self._states[item.producer]
                st.buffered -= 1
                st.dropped += 1
            else:
                fresh.append(item)
        self._buffer = fresh

    def _wait_publication(self, deadline: float | None, seconds: float | None) -> None:
        with self._cond:
            while self._publication is not None:
                self._check_usable_locked()
                wait_s = _POLL_S
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        pending = (
                            None
                            if self._target is None
                            else self._target.pending(self._publication.acked)
                        )
                        who = (
                            "the publisher has not finished"
                            if pending is None
                            else f"engines not acknowledged yet: {pending}"
                        )
                        raise DriverTimeoutError(
                            f"publishing weights version {self._publication.version} did not "
                            f"complete within {seconds}s ({who}); it keeps going: call "
                            "wait_published() or close()"
                        )
                    wait_s = min(wait_s, remaining)
                self._cond.wait(wait_s)
            self._check_usable_locked()

    # -- failures -------------------------------------------------------------------------------

    def _set_failure_locked(self, where: str, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (where, exc)
        else:
            _log.error("StreamingDriver: %s also failed: %r", where, exc)
        self._cond.notify_all()

    def _raise_failure_locked(self) -> None:
        if self._failure is None:  # pragma: no cover - callers check
            return
        where, exc = self._failure
        self._failure_surfaced = True
        raise DriverError(
            f"{where} raised {type(exc).__qualname__}: {exc}; the driver cannot continue: "
            "fix the cause (chained below) and close() the driver"
        ) from exc

    def _check_usable_locked(self) -> None:
        if self._failure is not None:
            self._raise_failure_locked()
        if self._closed:
            raise DriverError("the driver is closed; build a new StreamingDriver")

    def _check_usable(self) -> None:
        with self._cond:
            self._check_usable_locked()

    # -- state ----------------------------------------------------------------------------------

    def _producer_states_locked(self) -> dict[str, str]:
        return {name: st.state.value for name, st in self._states.items()}

    def _state_locked(self) -> DriverState:
        now = self._bus.now_ns()
        producers: dict[str, ProducerStats] = {}
        for name, st in self._states.items():
            idle = st.idle_ns
            if st.blocked_since_ns is not None:
                idle += now - st.blocked_since_ns
            producers[name] = {
                "produced": st.produced,
                "consumed": st.consumed,
                "buffered": st.buffered,
                "dropped": st.dropped,
                "idle_seconds": idle / 1e9,
                "state": st.state,
            }
        report = self._report
        hung = [] if report is None else [*report.hung_producers, *report.hung_publishing]
        failure: str | None = None
        if self._failure is not None:
            where, exc = self._failure
            failure = f"{where}: {type(exc).__qualname__}: {exc}"
        return {
            "version": self._version,
            "iterations_started": self._next_iteration - self._first_iteration,
            "buffer_size": self._buffer_size,
            "buffered": len(self._buffer),
            "high_water_mark": self._high_water,
            "max_staleness": self._max_staleness,
            "produced": sum(p["produced"] for p in producers.values()),
            "consumed": sum(p["consumed"] for p in producers.values()),
            "dropped": sum(p["dropped"] for p in producers.values()),
            "trainer_wait_seconds": self._wait_ns / 1e9,
            "trainer_waiting": self._trainer_waiting,
            "publishing": None if self._publication is None else self._publication.version,
            "failure": failure,
            "hung": hung,
            "producers": producers,
        }
