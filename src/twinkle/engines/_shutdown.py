"""Bounded shutdown of engines: each ``shutdown()`` on its own thread, a kill after the
timeout.

:func:`shutdown_many` stops engines ``max_concurrency`` at a time; one whose
``shutdown()`` is still running after ``shutdown_timeout_s`` is given up on: its
``kill()`` is called if it has one (a :class:`~twinkle.engines.SubprocessEngine` sends
SIGKILL to its process group), the others go on, and it is reported as an
:class:`EngineShutdownTimeout` naming it. :class:`~twinkle.engines.EnginePool` shuts its
engines down through here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from twinkle.engines._start import Engine
from twinkle.errors import TwinkleError
from twinkle.perf import TimeRecorder

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "EngineShutdownTimeout",
    "shutdown_many",
    "shutdown_one",
]

# The pool's logger: these messages are the pool's, as they were before this module.
_log = logging.getLogger("twinkle.engines.pool")

#: default ``EnginePool(shutdown_timeout_s=...)``: above a SubprocessEngine's own
#: SIGTERM-to-SIGKILL wait (``stop_timeout_s``, 10 s), so that escalation comes first
DEFAULT_SHUTDOWN_TIMEOUT_S: Final = 30.0
# How long the pool waits for an engine's kill() (and for its shutdown to return after
# it) once it gave up on the shutdown: SIGKILL takes effect at once, a hung kill() is
# abandoned too.
_KILL_WAIT_S: Final = 5.0


class EngineShutdownTimeout(TwinkleError, TimeoutError):
    """An engine's shutdown did not return within ``shutdown_timeout_s`` (names it)."""


def shutdown_many(
    items: Sequence[tuple[str, Engine]],
    recorder: TimeRecorder,
    *,
    max_concurrency: int | None,
    shutdown_timeout_s: float | None,
) -> list[BaseException]:
    """Shut ``items`` (name, engine) down, ``max_concurrency`` at a time (``None``: all at
    once), each within ``shutdown_timeout_s`` (``None``: no limit); what each that failed
    or hung raised (noted with its name), in no particular order."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def stop(name: str, engine: Engine) -> None:
        try:
            shutdown_one(name, engine, recorder, raise_errors=True)
        except BaseException as exc:  # on its own thread: nothing may end it unseen
            exc.add_note(f"while shutting down engine {name!r}")
            with lock:
                errors.append(exc)

    # Daemon: a shutdown that never returns must not keep the interpreter alive.
    threads = [
        threading.Thread(target=stop, args=item, name=f"twinkle-engine-stop-{item[0]}", daemon=True)
        for item in items
    ]
    limit = max_concurrency or len(threads) or 1
    timeout = shutdown_timeout_s
    for i in range(0, len(threads), limit):
        batch = threads[i : i + limit]
        for t in batch:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in batch:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        hung = [(items[i + k], t) for k, t in enumerate(batch) if t.is_alive()]
        errors.extend(_give_up(hung, shutdown_timeout_s))
    return errors


def _give_up(
    hung: list[tuple[tuple[str, Engine], threading.Thread]], shutdown_timeout_s: float | None
) -> list[EngineShutdownTimeout]:
    """Kill the engines whose shutdown overran (all at once); what became of each."""
    kills: list[tuple[threading.Thread, list[BaseException]] | None] = []
    for (name, engine), _ in hung:
        kill = getattr(engine, "kill", None)
        if not callable(kill):
            kills.append(None)
            continue
        failed: list[BaseException] = []
        killer = threading.Thread(
            target=_call_into,
            args=(kill, failed),
            name=f"twinkle-engine-kill-{name}",
            daemon=True,
        )
        killer.start()
        kills.append((killer, failed))
    deadline = time.monotonic() + _KILL_WAIT_S
    for killing, ((_, _), stopping) in zip(kills, hung, strict=True):
        if killing is not None:
            killing[0].join(max(0.0, deadline - time.monotonic()))
            stopping.join(max(0.0, deadline - time.monotonic()))  # it may return now
    errors: list[EngineShutdownTimeout] = []
    for killing, ((name, _), _) in zip(kills, hung, strict=True):
        if killing is None:
            fate = (
                "it has no kill(), so it may still be running: stop it by hand, and "
                "give it a kill() (or a shorter shutdown) for next time"
            )
        elif killing[0].is_alive():
            fate = f"its kill() did not return within {_KILL_WAIT_S} s either"
        elif killing[1]:
            exc = killing[1][0]
            fate = f"its kill() failed too: {type(exc).__qualname__}: {exc}"
        else:
            fate = "killed it (kill(); a subprocess engine: SIGKILL to its process group)"
        what = f"engine {name!r} did not shut down within shutdown_timeout_s={shutdown_timeout_s} s"
        err = EngineShutdownTimeout(
            f"{what}; {fate}. Raise shutdown_timeout_s if its shutdown is just slow, or "
            "look at the engine's log for what it waits on."
        )
        err.add_note(f"while shutting down engine {name!r}")
        errors.append(err)
    return errors


def shutdown_one(
    name: str, engine: Engine, recorder: TimeRecorder, *, raise_errors: bool = False
) -> None:
    """Shut ``engine`` down in an ``"engine.shutdown"`` span; an exception is raised
    (``raise_errors``) or logged with the engine's name."""
    try:
        with recorder.span("engine.shutdown", engine=name):
            engine.shutdown()
    except Exception:
        if raise_errors:
            raise
        _log.exception("shutting down engine %r failed", name)


def _call_into(function: Callable[[], object], failed: list[BaseException]) -> None:
    try:
        function()
    except BaseException as exc:  # on its own thread: reported by the caller
        failed.append(exc)
