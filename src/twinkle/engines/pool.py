"""Start independent inference engines concurrently, and shut them all down.

Engines on one host are independent: nothing in one engine's initialisation needs
another's. The steps that truly conflict (choosing ports) are serialised by the port
registry's short lock (:mod:`twinkle.engines.ports`), so the pool runs every factory at
once, up to ``max_concurrency``, instead of one after another under a global lock.

Failure policy: if one engine fails (raises or exceeds ``start_timeout_s``), the pool
cancels the rest (:attr:`StartContext.cancelled`), waits for the starts in flight,
shuts every started engine down (unless ``keep_started_on_failure``) and raises
:class:`~twinkle.errors.EngineStartError` naming the engine, the cause chained.

Shutdown is bounded: each engine's ``shutdown()`` gets ``shutdown_timeout_s`` (default
:data:`DEFAULT_SHUTDOWN_TIMEOUT_S`); one still running then is given up on: the pool
calls the engine's ``kill()`` if it has one (a :class:`~twinkle.engines.SubprocessEngine`
sends SIGKILL to its process group), goes on with the others and finally raises
:class:`EngineShutdownTimeout` naming it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Generic, NoReturn, final

from twinkle.checks import check_seconds, is_safe_name
from twinkle.engines._shutdown import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    EngineShutdownTimeout,
    shutdown_many,
    shutdown_one,
)
from twinkle.engines._start import (
    E,
    Engine,
    EngineFactory,
    EngineStartCancelled,
    EngineStartTimeout,
    StartContext,
)
from twinkle.errors import EngineStartError, InvalidArgumentError
from twinkle.perf import TimeRecorder, current_recorder

# The contract and the shutdown live in their own modules; this module keeps exporting
# their names, as it did before they moved there.
__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "Engine",
    "EngineFactory",
    "EnginePool",
    "EngineShutdownTimeout",
    "EngineStartCancelled",
    "EngineStartTimeout",
    "StartContext",
]

_log = logging.getLogger(__name__)
#: how its seconds messages name what they take: the names end in ``_s``, the unit is in
#: the name ("start_timeout_s=0 must be a finite number > 0, or None for no limit")
_NUMBER: Final = "a finite number"


@dataclass(slots=True, eq=False)
class _Start(Generic[E]):
    name: str
    index: int
    factory: EngineFactory[E]
    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline_monotonic_s: float | None = None
    thread: threading.Thread | None = None
    engine: E | None = None
    error: BaseException | None = None
    done: bool = False
    abandoned: bool = False  # timed out: the worker shuts the engine down if it ever arrives


@final
class EnginePool(Generic[E]):
    """Concurrent start-up and orderly shutdown of independent engines.

    ``recorder`` receives one ``"engine.start"`` span per engine (attrs ``engine=<name>``)
    and one ``"engine.shutdown"`` span per shutdown; default: the current recorder of the
    thread that calls :meth:`start`. ``max_concurrency`` bounds the starts in flight
    (``None``: all at once). ``start_timeout_s`` bounds each engine's start, counted
    from the call of its factory. ``close_wait_s`` bounds how long :meth:`close` waits for
    timed-out factories to return (their engines are shut down when they do).
    ``shutdown_timeout_s`` (``None``: no limit) bounds each engine's ``shutdown()``, counted
    from its call; after it the engine is killed (see :class:`Engine`) and reported by
    :class:`EngineShutdownTimeout`. Shutdowns run ``max_concurrency`` at a time, so
    :meth:`close` returns within about ``ceil(engines / max_concurrency) *
    (shutdown_timeout_s + 5 s)`` plus ``close_wait_s``.
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_engines",
        "_lagging",
        "_recorder",
        "close_wait_s",
        "keep_started_on_failure",
        "max_concurrency",
        "shutdown_timeout_s",
        "start_timeout_s",
    )

    def __init__(
        self,
        *,
        recorder: TimeRecorder | None = None,
        max_concurrency: int | None = None,
        start_timeout_s: float | None = None,
        keep_started_on_failure: bool = False,
        close_wait_s: float = 10.0,
        shutdown_timeout_s: float | None = DEFAULT_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise InvalidArgumentError(
                f"max_concurrency={max_concurrency!r} must be an int >= 1, or None for no limit"
            )
        self._recorder = recorder
        self.max_concurrency = max_concurrency
        self.start_timeout_s = check_seconds(
            "start_timeout_s", start_timeout_s, none_ok=True, zero_ok=False, what=_NUMBER
        )
        self.keep_started_on_failure = keep_started_on_failure
        self.close_wait_s = check_seconds("close_wait_s", close_wait_s, what=_NUMBER)
        self.shutdown_timeout_s = check_seconds(
            "shutdown_timeout_s", shutdown_timeout_s, none_ok=True, zero_ok=False, what=_NUMBER
        )
        self._cond = threading.Condition()
        self._engines: dict[str, E] = {}
        self._lagging: list[threading.Thread] = []  # workers of timed-out starts
        self._closed = False

    # -- mapping view ----------------------------------------------------------------

    @property
    def engines(self) -> Mapping[str, E]:
        """The running engines by name, in the order they were given to :meth:`start`."""
        with self._cond:
            return dict(self._engines)

    def __getitem__(self, name: str) -> E:
        with self._cond:
            return self._engines[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.engines)

    def __len__(self) -> int:
        with self._cond:
            return len(self._engines)

    # -- start -----------------------------------------------------------------------

    def start(self, factories: Mapping[str, EngineFactory[E]]) -> dict[str, E]:
        """Start one engine per ``name -> factory`` concurrently; return them by name.

        Each name is a safe name (:data:`~twinkle.checks.NAME_RULE`: it names the
        engine's log file). Blocks until every engine is ready. May be called again
        with new names. On failure raises :class:`~twinkle.errors.EngineStartError` (a
        timeout: :class:`EngineStartTimeout`) naming the first engine that failed.
        """
        recorder = self._recorder if self._recorder is not None else current_recorder()
        starts = self._plan(factories)
        with self._cond:
            try:
                failure = self._run_starts(starts, recorder)
            except BaseException:
                # Interrupted (e.g. KeyboardInterrupt): whatever is still starting is
                # shut down by its worker when its factory returns; started ones here.
                for st in starts:
                    st.cancelled.set()
                    if not st.done:
                        st.abandoned = True
                self._lagging.extend(st.thread for st in starts if st.thread is not None)
                self._cond.release()
                try:
                    for exc in self._shutdown_many(_started(starts), recorder):
                        _log.error("shutting down after an interrupted start: %s", exc)
                finally:
                    self._cond.acquire()
                raise
            self._lagging.extend(
                st.thread for st in starts if st.abandoned and st.thread is not None
            )
            started = dict(_started(starts))
            if failure is None:
                self._engines.update(started)
                return started
        self._fail(failure, starts, started, recorder)

    def _run_starts(self, starts: list[_Start[E]], recorder: TimeRecorder) -> _Start[E] | None:
        """Launch up to the limit, collect results, enforce timeouts; the first failure."""
        limit = self.max_concurrency or len(starts)
        queue = deque(starts)
        running: list[_Start[E]] = []
        failure: _Start[E] | None = None
        while queue or running:
            while queue and failure is None and len(running) < limit:
                st = queue.popleft()
                self._launch(st, recorder)
                running.append(st)
            if failure is not None:
                queue.clear()  # never started
            if not running:
                break
            self._cond.wait(timeout=_next_wait_s(running))
            now = time.monotonic()
            for st in list(running):
                deadline = st.deadline_monotonic_s
                if not st.done and deadline is not None and now >= deadline:
                    st.abandoned = True
                    st.error = TimeoutError(f"factory still running after {self.start_timeout_s} s")
                if st.done or st.abandoned:
                    running.remove(st)
                    if st.error is not None and failure is None:
                        failure = st
                        for other in starts:
                            other.cancelled.set()
        return failure

    def _plan(self, factories: Mapping[str, EngineFactory[E]]) -> list[_Start[E]]:
        if self._closed:
            raise InvalidArgumentError("this EnginePool is closed; create a new one")
        if not factories:
            raise InvalidArgumentError("factories is empty; pass a mapping name -> factory")
        starts: list[_Start[E]] = []
        for index, (name, factory) in enumerate(factories.items()):
            if not isinstance(name, str) or not is_safe_name(name):
                # It becomes a file name (VllmConfig's <log_dir>/<name>.log) and a label.
                raise InvalidArgumentError(
                    f"engine name {name!r:.100} is not a safe name: use 1-128 letters, "
                    "digits, '.', '_' and '-', starting with a letter or digit, without "
                    "'..' or path separators (e.g. 'vllm-0'); it names the engine's log file"
                )
            if name in self._engines:
                raise InvalidArgumentError(
                    f"engine {name!r} is already running in this pool; choose another name"
                )
            if not callable(factory):
                raise InvalidArgumentError(
                    f"factory for engine {name!r} is {factory!r}, not a callable "
                    "(StartContext) -> engine"
                )
            starts.append(_Start(name=name, index=index, factory=factory))
        return starts

    def _launch(self, st: _Start[E], recorder: TimeRecorder) -> None:
        if self.start_timeout_s is not None:
            # The clock starts when the factory is called, not when it was queued.
            st.deadline_monotonic_s = time.monotonic() + self.start_timeout_s
        ctx = StartContext(
            name=st.name,
            index=st.index,
            cancelled=st.cancelled,
            deadline_monotonic_s=st.deadline_monotonic_s,
        )
        # Daemon: a factory stuck forever must not keep the interpreter from exiting.
        st.thread = threading.Thread(
            target=self._run_factory,
            args=(st, ctx, recorder),
            name=f"twinkle-engine-start-{st.name}",
            daemon=True,
        )
        st.thread.start()

    def _run_factory(self, st: _Start[E], ctx: StartContext, recorder: TimeRecorder) -> None:
        engine: E | None = None
        error: BaseException | None = None
        try:
            with recorder.span("engine.start", engine=st.name):
                ctx.check_cancelled()
                engine = st.factory(ctx)
        except BaseException as exc:
            error = exc
        with self._cond:
            st.done = True
            if not st.abandoned:
                st.engine, st.error = engine, error
                self._cond.notify_all()
                return
        if engine is not None:  # the pool gave up on it: nobody else will stop it
            _log.warning(
                "engine %r started after the pool gave up on it; shutting it down", st.name
            )
            shutdown_one(st.name, engine, recorder)

    def _fail(
        self,
        failure: _Start[E],
        starts: list[_Start[E]],
        started: dict[str, E],
        recorder: TimeRecorder,
    ) -> NoReturn:
        kept = self.keep_started_on_failure
        if kept:
            with self._cond:
                self._engines.update(started)
        else:
            for exc in self._shutdown_many(list(started.items()), recorder):
                _log.error("shutting down after a failed start: %s", exc)
        not_started = [st.name for st in starts if not st.done and not st.abandoned]
        others_failed = [
            st.name
            for st in starts
            if st is not failure
            and st.error is not None
            and not isinstance(st.error, EngineStartCancelled)
        ]
        cls = EngineStartTimeout if failure.abandoned else EngineStartError
        what = (
            f"engine {failure.name!r} did not start within start_timeout_s="
            f"{self.start_timeout_s} s (raise start_timeout_s or look at the engine's log "
            "for what it is waiting on)"
            if failure.abandoned
            else f"engine {failure.name!r} failed to start: "
            f"{type(failure.error).__qualname__}: {failure.error}"
        )
        fate = "kept running (keep_started_on_failure=True)" if kept else "shut down"
        err = cls(
            f"{what}. Started engines {sorted(started)} {fate}; never started: "
            f"{sorted(not_started)}; also failed: {sorted(others_failed)}. "
            "Fix the cause of the first failure (chained below) and start again."
        )
        raise err from failure.error

    # -- shutdown --------------------------------------------------------------------

    def close(self) -> None:
        """Shut every engine down (concurrently), then wait for timed-out starts.

        Each engine is shut down even if another's shutdown raises or hangs; the first
        such exception (a hang: :class:`EngineShutdownTimeout`) is re-raised afterwards
        (with a note naming the engine), the others are logged. Idempotent.
        """
        recorder = self._recorder if self._recorder is not None else current_recorder()
        with self._cond:
            self._closed = True
            items = list(self._engines.items())
            self._engines.clear()
            lagging, self._lagging = self._lagging, []
        errors = self._shutdown_many(items, recorder)
        deadline = time.monotonic() + self.close_wait_s
        for thread in lagging:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _log.warning(
                    "%s is still inside its engine factory after close_wait_s=%s s; its engine "
                    "will be shut down when the factory returns",
                    thread.name,
                    self.close_wait_s,
                )
        for exc in errors[1:]:
            _log.error("engine shutdown failed: %s", exc)
        if errors:
            raise errors[0]

    def _shutdown_many(
        self, items: list[tuple[str, E]], recorder: TimeRecorder
    ) -> list[BaseException]:
        return shutdown_many(
            items,
            recorder,
            max_concurrency=self.max_concurrency,
            shutdown_timeout_s=self.shutdown_timeout_s,
        )

    def __enter__(self) -> EnginePool[E]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"EnginePool(engines={list(self.engines)}, max_concurrency={self.max_concurrency}, "
            f"start_timeout_s={self.start_timeout_s}, "
            f"shutdown_timeout_s={self.shutdown_timeout_s})"
        )


def _started(starts: list[_Start[E]]) -> list[tuple[str, E]]:
    return [(st.name, st.engine) for st in starts if st.engine is not None]


def _next_wait_s(running: list[_Start[E]]) -> float | None:
    deadlines = [
        st.deadline_monotonic_s
        for st in running
        if not st.done and st.deadline_monotonic_s is not None
    ]
    if not deadlines:
        return None
    return max(0.0, min(deadlines) - time.monotonic())
