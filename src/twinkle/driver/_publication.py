"""A weight publication as the driver runs it: one daemon thread per version, at most
one in flight, waited for with a deadline.

The thread hands the weights to the :class:`~twinkle.driver._publish.PublishTarget`
(the engines or the caller's publisher); once every engine acknowledged it publishes
``weights_published`` and only then makes the version the one producers get. A
publication that ends after ``close()`` publishes nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, TypeVar

from twinkle.driver._core import DriverCore
from twinkle.driver._publish import PublishFailure, PublishTarget
from twinkle.driver._state import Publication
from twinkle.driver._types import DriverTimeoutError
from twinkle.driver._wait import poll_s
from twinkle.errors import InvalidArgumentError

__all__ = ["begin_publication", "wait_publication"]

_log = logging.getLogger("twinkle.driver")

T = TypeVar("T")


def begin_publication(
    core: DriverCore[T], target: PublishTarget, weights: Any, version: int | None
) -> int:
    """Start publishing ``weights`` as ``version`` (default: current + 1) on a thread of
    its own; returns the version. No publication may be in flight."""
    with core.cond:
        new = core.version + 1 if version is None else version
        if new <= core.version:
            raise InvalidArgumentError(
                f"version={new} is not newer than the current weight version "
                f"{core.version}; pass a larger version or leave it None"
            )
        publication = Publication(new)
        thread = threading.Thread(
            target=_run_publication,
            args=(core, target, publication, weights, core.bus.now_ns()),
            name=f"twinkle-publish-v{new}",
            daemon=True,
        )
        publication.thread = thread
        core.publication = publication
    thread.start()
    return new


def _run_publication(
    core: DriverCore[T],
    target: PublishTarget,
    publication: Publication,
    weights: Any,
    start_ns: int,
) -> None:
    version = publication.version
    try:
        acks = target.run(version, weights, core.bus.now_ns, core.stop, publication.acked)
    except PublishFailure as failure:
        with core.cond:
            if not core.stop.is_set():  # a close() cancelling the wait is no failure
                core.set_failure_locked(
                    f"{failure.where} (publishing weights version {version})", failure.exc
                )
            core.publication = None
            core.cond.notify_all()
        return
    if core.stop.is_set():
        # Finished after close() gave up on it (an interrupted run, typically): the
        # run may be over, publish nothing; worth a note, not a warning.
        _log.info(
            "StreamingDriver: weights version %d finished loading after close(); "
            "no weights_published event",
            version,
        )
        with core.cond:
            core.publication = None
        return
    _announce(core, version, start_ns, acks)


def _announce(
    core: DriverCore[T], version: int, start_ns: int, acks: list[tuple[str, int]]
) -> None:
    """Publish ``weights_published``, then make ``version`` current whatever happened."""
    try:
        end_ns = max(acked_ns for _, acked_ns in acks)
        core.bus.weights_published(version, start_ns=start_ns, end_ns=end_ns, acks=acks)
    except BaseException as exc:
        with core.cond:
            core.set_failure_locked(
                f"publishing the weights_published event of version {version}", exc
            )
    finally:
        # Every engine serves the new weights now, whatever an observer did with the
        # event: producers must get the version the engines really hold.
        with core.cond:
            core.set_version_locked(version)
            core.publication = None
            core.cond.notify_all()


def wait_publication(
    core: DriverCore[T],
    target: PublishTarget | None,
    deadline: float | None,
    seconds: float | None,
) -> None:
    """Wait for the publication in flight, if any; :class:`DriverTimeoutError` at
    ``deadline`` (``seconds`` after the call began) naming who has not acknowledged."""
    with core.cond:
        while core.publication is not None:
            core.check_usable_locked()
            wait_s = poll_s(deadline)
            if wait_s is None:
                pending = None if target is None else target.pending(core.publication.acked)
                who = (
                    "the publisher has not finished"
                    if pending is None
                    else f"engines not acknowledged yet: {pending}"
                )
                raise DriverTimeoutError(
                    f"publishing weights version {core.publication.version} did not "
                    f"complete within {seconds}s ({who}); it keeps going: call "
                    "wait_published() or close()"
                )
            core.cond.wait(wait_s)
        core.check_usable_locked()
