"""Where a span batch goes on the run's timeline, and the clock skew that would move it.

A batch from another process is placed through the clock anchors
(:meth:`~twinkle.perf.ClockAnchor.shift_onto`): across hosts, their wall clocks decide,
so a worker whose wall clock is off moves its spans by as much, silently (a worker 3 s
ahead puts its work 3 s into the future: into later windows, the tear-down, a longer
run). A worker's report therefore carries its clocks read as it was made
(:attr:`~twinkle.events.SpanBatch.sent_anchor`), and the batch's ``monotonic_ns`` is
when the run's process published it (its arrival). Placed like the spans, the send
cannot fall after the arrival:

* more than ``ahead_ns`` after it: the worker's clock is ahead, for certain;
* more than ``behind_ns`` before it: the worker's clock is behind, or the report took
  that long to arrive (the two look alike; ``behind_ns`` is the delivery time believed).

Such a batch is placed by its arrival instead (its send at its arrival: off by the
delivery time only) and counted per worker (:class:`SkewLedger`, the summary's
``clock_skew``). Each batch is decided on its own, so nothing carries over from one
batch, segment or worker process to the next. The run's own recorders share its clock
and carry no send time: they are never checked. docs/metrics.md defines it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from twinkle.events import SpanBatch
from twinkle.observers._config import ClockSkewTolerance
from twinkle.perf import ClockAnchor

__all__ = ["LatestTime", "Placement", "SkewLedger", "place_batch"]

log = logging.getLogger("twinkle.observers")
_NS = 1e9


class Placement(NamedTuple):
    """How one batch is placed: ``shift_ns`` is added to its spans' times.

    ``offset_ns``: the send as the anchors place it minus the arrival (None: not
    checked); ``skewed``: beyond the tolerance, so ``shift_ns`` puts the send at the
    arrival instead of where the anchors would."""

    shift_ns: int
    offset_ns: int | None
    skewed: bool


def place_batch(
    event: SpanBatch, timeline: ClockAnchor | None, tolerance: ClockSkewTolerance
) -> Placement:
    """Where ``event``'s spans go on the timeline whose anchor is ``timeline``."""
    shift = event.anchor.shift_onto(timeline)
    sent = event.sent_anchor
    if sent is None or timeline is None:
        return Placement(shift, None, False)
    # The send's monotonic reading is on the clock of the batch's spans: the same shift
    # puts it where the anchors put them.
    offset = sent.monotonic_ns + shift - event.monotonic_ns
    if -tolerance.behind_ns <= offset <= tolerance.ahead_ns:
        return Placement(shift, offset, False)
    return Placement(event.monotonic_ns - sent.monotonic_ns, offset, True)


@dataclass(slots=True)
class _Skewed:
    """One worker's reports placed by their arrival."""

    hostname: str
    reports: int = 0
    spans: int = 0
    offset_ns: int = 0  # the largest in magnitude, signed


class SkewLedger:
    """Per worker (span source): the reports whose clock was found skewed, their spans
    and the largest offset; plus how many reports were checked at all.

    A report is counted once however many batches carry it: the event log writes a
    batch too long for one line as consecutive batches with the same arrival and send
    (a replay sees those), the live run one."""

    __slots__ = ("_last", "checked", "tolerance", "workers")

    def __init__(self, tolerance: ClockSkewTolerance | None = None) -> None:
        self.tolerance = tolerance or ClockSkewTolerance()
        self.checked = 0
        self.workers: dict[str, _Skewed] = {}
        # per source: (arrival, send) of its last checked batch
        self._last: dict[str, tuple[int, ClockAnchor | None]] = {}

    def note(self, event: SpanBatch, placement: Placement) -> None:
        """Count one placed batch (a warning the first time a worker is found skewed)."""
        if placement.offset_ns is None:
            return
        key = (event.monotonic_ns, event.sent_anchor)
        new_report = self._last.get(event.source) != key
        self._last[event.source] = key
        self.checked += int(new_report)
        if not placement.skewed:
            return
        offset = placement.offset_ns
        entry = self.workers.get(event.source)
        if entry is None:
            entry = self.workers[event.source] = _Skewed(event.anchor.hostname)
            self._warn(event, offset)
        entry.reports += int(new_report)
        entry.spans += len(event.spans)
        if abs(offset) > abs(entry.offset_ns):
            entry.offset_ns = offset
            entry.hostname = event.anchor.hostname

    def _warn(self, event: SpanBatch, offset_ns: int) -> None:
        # Logging only (the figures come from the log): the run's own process, live, and
        # a replay of its log say the same.
        if offset_ns > 0:
            what = (
                f"was sent {offset_ns / _NS:.3f} s after the run received it, as the clock "
                "anchors place it: its clock is ahead of the run's by at least that much"
            )
        else:
            what = (
                f"was sent {-offset_ns / _NS:.3f} s before the run received it, as the clock "
                "anchors place it: its clock is behind the run's, or the report took that "
                f"long to arrive (beyond config.clock_skew.behind_s = "
                f"{self.tolerance.behind_ns / _NS:g} s)"
            )
        log.warning(
            "worker %r (host %r): its report %s; its spans are placed by the report's "
            "arrival instead (to within the delivery time), and summary.json's clock_skew "
            "counts them. Synchronise the hosts' clocks (chrony or NTP).",
            event.source,
            event.anchor.hostname,
            what,
        )

    def summary(self) -> dict[str, Any]:
        """The summary's ``clock_skew`` (docs/metrics.md)."""
        return {
            "ahead_tolerance_seconds": self.tolerance.ahead_ns / _NS,
            "behind_tolerance_seconds": self.tolerance.behind_ns / _NS,
            "checked_reports": self.checked,
            "workers": {
                source: {
                    "hostname": entry.hostname,
                    "corrected_reports": entry.reports,
                    "corrected_spans": entry.spans,
                    "offset_seconds": entry.offset_ns / _NS,
                }
                for source, entry in sorted(self.workers.items())
            },
        }


class LatestTime:
    """The latest time a run's events reach on its clock (a span batch's: its spans'
    ends, placed), and the wall clock of the event that reached it (the later of two
    that tie): where a resumed segment's clock continues from."""

    __slots__ = ("anchor", "ns", "tolerance", "wall_ns")

    def __init__(self, anchor: ClockAnchor | None, tolerance: ClockSkewTolerance) -> None:
        self.anchor, self.tolerance = anchor, tolerance
        self.ns = self.wall_ns = 0

    def note(self, event: Any) -> None:
        end = event.monotonic_ns
        if type(event) is SpanBatch and event.spans:
            shift = place_batch(event, self.anchor, self.tolerance).shift_ns
            end = max(end, max(s.end_ns for s in event.spans) + shift)
        if end >= self.ns:
            self.ns, self.wall_ns = end, event.wall_ns
