"""``StreamingDriver``: producers run ahead of the trainer into a bounded, staleness-bounded
buffer; the trainer takes batches and publishes weights back.

The driver knows nothing of what an item means (no tokens, rewards or phases). It
publishes exactly three events on the bus: ``iteration_started``, ``weights_published``
(after every engine acknowledged) and ``snapshot`` (a plain dict of its state).

Threads: one daemon thread per producer (``_producers``), one per weight publication
(``_publication``) and, when the publisher is a list of engines, one per engine load
(``_publish``); ``close()`` joins them (``_close``). All shared state lives in one
``_core.DriverCore`` behind one ``threading.Condition``; every change notifies it, so a
waiting trainer wakes at once (waits also time out every 50 ms as a safety net, never
longer: ``_wait``).

Clocks: every *measured* time (item production, idle and wait seconds, publication and
acknowledgement times) is read from ``bus.now_ns()`` so that a manual clock makes them
deterministic. Timeouts are real waiting and use ``time.monotonic``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from twinkle.driver._close import close_driver
from twinkle.driver._core import DriverCore
from twinkle.driver._producers import producer_threads
from twinkle.driver._publication import begin_publication, wait_publication
from twinkle.driver._publish import PublishTarget, adapt_publisher
from twinkle.driver._state import CloseReport, DriverState, check_int, check_timeout, plain_state
from twinkle.driver._types import (
    DriverTimeoutError,
    Item,
    ProducerLike,
    ProducersExhaustedError,
    Publisher,
    WeightLoader,
    adapt_producers,
)
from twinkle.driver._wait import deadline_after, poll_s
from twinkle.errors import DriverError, InvalidArgumentError
from twinkle.events import EventBus

__all__ = ["CloseReport", "StreamingDriver"]

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
        self._produce: dict[str, Callable[[int], Any]] = adapt_producers(producers)
        self._target: PublishTarget | None = (
            None if publisher is None else adapt_publisher(publisher)
        )
        buffer_size = check_int("buffer_size", buffer_size, 1)
        max_staleness = check_int("max_staleness", max_staleness, 0)
        version = check_int("initial_version", initial_version, 0)
        self._auto_iterations = bool(auto_iterations)
        self._core: DriverCore[T] = DriverCore(
            bus,
            self._produce,
            buffer_size=buffer_size,
            max_staleness=max_staleness,
            version=version,
            first_iteration=check_int("first_iteration", first_iteration, 0),
        )
        self._threads: dict[str, threading.Thread] = {}
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> StreamingDriver[T]:
        """Start the producer threads (idempotent; :meth:`next_batch` calls it too)."""
        core = self._core
        with core.cond:
            if core.closed:
                raise DriverError("the driver is closed; build a new StreamingDriver")
            if self._started:
                return self
            self._started = True
            self._threads = producer_threads(core, self._produce)
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
        return close_driver(
            self._core, self._threads, self._target, seconds, log_failure=log_failure
        )

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
            with self._core.cond:
                if self._core.unreported:
                    self._core.raise_failure_locked()

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
        self._core.check_usable()
        return self._begin()

    def _begin(self) -> int:
        core = self._core
        with core.cond:
            iteration = core.next_iteration
            core.next_iteration += 1
        core.bus.iteration_started(iteration)
        return iteration

    def next_batch(self, n: int, *, timeout: float | None = None) -> list[Item[T]]:
        """The next ``n`` items, oldest first, waiting for producers as needed.

        Items more than ``max_staleness`` versions behind never reach the trainer.
        Raises :class:`DriverTimeoutError` after ``timeout`` seconds (items stay
        buffered), :class:`ProducersExhaustedError` when every producer ended and fewer
        than ``n`` items remain, and :class:`~twinkle.errors.DriverError` for a failed
        producer or publication.
        """
        core = self._core
        n = check_int("n", n, 1)
        if n > core.buffer_size:
            raise InvalidArgumentError(
                f"n={n} is larger than buffer_size={core.buffer_size}; a batch must fit in "
                f"the buffer: build the driver with buffer_size >= {n}"
            )
        seconds = check_timeout("timeout", timeout)
        core.check_usable()
        self.start()
        if self._auto_iterations:
            self._begin()
        deadline = deadline_after(seconds)
        with core.cond:
            waited_from: int | None = None
            try:
                while len(core.buffer) < n:
                    wait_s = self._next_wait_locked(n, deadline, seconds)
                    if waited_from is None:
                        waited_from = core.bus.now_ns()
                        core.trainer_waiting = True
                        core.cond.notify_all()
                    core.cond.wait(wait_s)
                core.check_usable_locked()
            finally:
                if waited_from is not None:
                    core.wait_ns += core.bus.now_ns() - waited_from
                    core.trainer_waiting = False
            return core.take_locked(n)

    def _next_wait_locked(self, n: int, deadline: float | None, seconds: float | None) -> float:
        """How long ``next_batch`` waits next for ``n`` items, or why it stops waiting."""
        core = self._core
        core.check_usable_locked()
        if all(st.state.finished for st in core.tallies.values()):
            raise ProducersExhaustedError(
                f"every producer is exhausted and {len(core.buffer)} item(s) "
                f"remain, fewer than n={n}; take them with a smaller n or close()"
            )
        wait_s = poll_s(deadline)
        if wait_s is None:
            raise DriverTimeoutError(
                f"next_batch(n={n}) got only {len(core.buffer)} item(s) "
                f"within {seconds}s; the items stay buffered; producers: "
                f"{core.producer_states_locked()}"
            )
        return wait_s

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
        self._core.check_usable()
        if self._target is None:
            raise DriverError(
                "this driver has no publisher; build it with publisher=publisher(version, "
                "weights) or publisher=[engines with load_weights(version, weights)]"
            )
        deadline = deadline_after(seconds)
        wait_publication(self._core, self._target, deadline, seconds)
        new = begin_publication(self._core, self._target, weights, version)
        if wait:
            wait_publication(self._core, self._target, deadline, seconds)
        return new

    def wait_published(self, timeout: float | None = None) -> int:
        """Wait for a weight publication in flight; returns the current version."""
        seconds = check_timeout("timeout", timeout)
        self._core.check_usable()
        wait_publication(self._core, self._target, deadline_after(seconds), seconds)
        with self._core.cond:
            return self._core.version

    def snapshot(self) -> DriverState:
        """Publish a ``snapshot`` event of :meth:`state` and return that state.

        The event carries it as a plain dict: the same keys in the same order, producer
        states as their string values. Raises a pending, not yet reported failure first;
        after close it still works (it shows hung producers)."""
        core = self._core
        with core.cond:
            if core.unreported:
                core.raise_failure_locked()
            state = core.state_locked()
        core.bus.snapshot(plain_state(state))
        return state

    # -- inspection -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The weight version producers are handed now."""
        with self._core.cond:
            return self._core.version

    @property
    def iteration(self) -> int | None:
        """The number of the last iteration begun (``None`` before the first)."""
        core = self._core
        with core.cond:
            started = core.next_iteration > core.first_iteration
            return core.next_iteration - 1 if started else None

    def state(self) -> DriverState:
        """The driver's state, without publishing it: a fresh :class:`DriverState` (its
        declaration documents every key; per producer a :class:`ProducerStats` whose
        ``state`` is a :class:`ProducerState`)."""
        with self._core.cond:
            return self._core.state_locked()

    def wait_until(
        self, predicate: Callable[[DriverState], bool], timeout: float | None = None
    ) -> DriverState:
        """Wait until ``predicate(state())`` holds (re-checked at every change of state);
        returns that state, or raises :class:`DriverTimeoutError` after ``timeout``
        seconds (``None``: no limit). For monitors and tests; it raises no failures."""
        seconds = check_timeout("timeout", timeout)
        deadline = deadline_after(seconds)
        core = self._core
        with core.cond:
            while True:
                state = core.state_locked()
                if predicate(state):
                    return state
                wait_s = poll_s(deadline)
                if wait_s is None:
                    raise DriverTimeoutError(
                        f"the driver state did not satisfy the predicate within "
                        f"{seconds}s; last state: {plain_state(state)!r}"
                    )
                core.cond.wait(wait_s)
