"""Spans that close on a run's recorder after the run finished: its bus refuses them, so
they are in no run. Nothing on the spans' path looks (it costs every span), so the
interpreter's exit says how many each finished run's recorder holds (a worker thread
still timing its work, a span open across ``finish()``)."""

from __future__ import annotations

import atexit
import logging
import threading
import weakref

from twinkle.perf import TimeRecorder

__all__ = ["watch_after_finish"]

_log = logging.getLogger("twinkle.run")
#: each finished run's recorder (weakly: a run let go is not kept for this), its run id
_FINISHED: weakref.WeakKeyDictionary[TimeRecorder, str] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_REGISTERED: list[bool] = []


def watch_after_finish(recorder: TimeRecorder, run_id: str) -> None:
    """Have the interpreter's exit say the spans ``recorder`` holds then (its run
    finished now: a finish drains it)."""
    with _LOCK:
        if not _REGISTERED:
            atexit.register(say_after_finish)
            _REGISTERED.append(True)
        _FINISHED[recorder] = run_id


def say_after_finish() -> None:
    """Warn of each finished run's recorder that holds spans, naming the first."""
    with _LOCK:
        found = list(_FINISHED.items())
    for recorder, run_id in found:
        count, first = recorder.pending(), recorder.first_pending()
        if count:
            _log.warning(
                "twinkle: %d span(s) closed on the recorder of run %r after it finished%s "
                "and are in no run: finish the run after the spans close (stop the threads "
                "that time work first)",
                count,
                run_id,
                "" if first is None else f" (the first: {first!r})",
            )
