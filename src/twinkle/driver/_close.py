"""Closing the driver: stop every thread it started, wait a bounded time for each, and
report (not wait on forever) what still runs then.

Threads are joined in the order they would hand work on: producers, the publication in
flight, then the engines' loads. Whatever still runs at the deadline is named in the
:class:`CloseReport`, logged, and shown in the driver's state under ``"hung"``; its
threads are daemons, so they cannot block interpreter exit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TypeVar

from twinkle.driver._core import DriverCore
from twinkle.driver._publish import PublishTarget
from twinkle.driver._state import CloseReport, ProducerState
from twinkle.driver._wait import deadline_after, time_left

__all__ = ["close_driver"]

_log = logging.getLogger("twinkle.driver")

T = TypeVar("T")


def close_driver(
    core: DriverCore[T],
    threads: Mapping[str, threading.Thread],
    target: PublishTarget | None,
    seconds: float | None,
    *,
    log_failure: bool,
) -> CloseReport:
    """Stop ``core``'s producers (their ``threads``) and publications, wait at most
    ``seconds`` in all (``None``: as long as it takes), and return what still runs.

    Idempotent: a second call returns the first report. With ``log_failure``, a failure
    no driver call has reported yet is logged."""
    with core.cond:
        if core.report is not None:
            return core.report
        core.closed = True
        core.stop.set()
        core.cond.notify_all()
    report = _join(core, threads, target, deadline_after(seconds))
    _settle(core, report)
    if not report.clean:
        _log.warning(
            "StreamingDriver.close: still running after %.3gs (daemon threads, left "
            "behind): producers %s; publishing %s",
            seconds,
            list(report.hung_producers),
            list(report.hung_publishing),
        )
    with core.cond:
        if log_failure and core.failure is not None and core.unreported:
            where, exc = core.failure
            _log.error("StreamingDriver closed with an unreported failure in %s: %r", where, exc)
    return report


def _join(
    core: DriverCore[T],
    threads: Mapping[str, threading.Thread],
    target: PublishTarget | None,
    deadline: float | None,
) -> CloseReport:
    """Join every thread until ``deadline``; the report names those still alive."""
    hung_producers = [name for name, thread in threads.items() if _hung(thread, deadline)]
    hung_publishing: list[str] = []
    with core.cond:
        publication = core.publication
    thread = None if publication is None else publication.thread
    if publication is not None and thread is not None and _hung(thread, deadline):
        hung_publishing.append(f"publishing weights version {publication.version}")
    engine_threads = [] if target is None else list(target.threads)
    for label, thread in engine_threads:
        if _hung(thread, deadline):
            hung_publishing.append(f"engine {label!r} loading weights")
    return CloseReport(tuple(hung_producers), tuple(hung_publishing))


def _hung(thread: threading.Thread, deadline: float | None) -> bool:
    """Join ``thread`` until ``deadline``; whether it still runs. One whose start() a
    Ctrl-C interrupted never ran: there is nothing to join (``join`` would raise)."""
    if thread.is_alive():
        thread.join(time_left(deadline))
    return thread.is_alive()


def _settle(core: DriverCore[T], report: CloseReport) -> None:
    """Give every producer its final state and keep ``report`` as the close's."""
    with core.cond:
        now = core.bus.now_ns()
        for name, st in core.tallies.items():
            core.unblock_locked(st, now)
            if name in report.hung_producers:
                st.state = ProducerState.HUNG
            elif st.state not in (ProducerState.EXHAUSTED, ProducerState.FAILED):
                st.state = ProducerState.STOPPED
        core.report = report
        core.cond.notify_all()
