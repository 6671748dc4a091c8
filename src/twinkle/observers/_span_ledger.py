"""Where every span of a run went (``summary.json`` ``spans``): counted by the place
the timeline gave it and by the source that sent it (docs/metrics.md, "Finalising with
a bounded lag; where every span goes")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.events import SpanBatch
from twinkle.observers._measure import WindowTiming
from twinkle.observers._no_phase import NoPhase

__all__ = ["PLACES", "SpanLedger"]

#: where the timeline places a span
PLACES = ("iterations", "setup", "teardown", "unstarted", "late")


def _places() -> dict[str, list[int]]:
    return {place: [0, 0] for place in PLACES}


@dataclass(slots=True)
class SpanLedger:
    """Per place, the spans and their summed nanoseconds; per span source, the spans
    received and those it could not ship."""

    where: dict[str, list[int]] = field(default_factory=_places)
    sources: dict[str, list[int]] = field(default_factory=dict)

    def place(self, where: str, duration_ns: int, spans: int = 1) -> None:
        """``spans`` spans of ``duration_ns`` in all placed ``where`` (one of :data:`PLACES`)."""
        entry = self.where[where]
        entry[0] += spans
        entry[1] += duration_ns

    def count(self, event: SpanBatch) -> None:
        """The spans ``event``'s source sent, and those it could not ship."""
        counts = self.sources.get(event.source)
        if counts is None:
            counts = self.sources[event.source] = [0, 0]
        counts[0] += len(event.spans)
        counts[1] += event.dropped

    def as_dict(
        self, late_spans: int, late_ns: int, totals: WindowTiming, no_phase: NoPhase
    ) -> dict[str, Any]:
        """The summary's ``spans`` (``late_spans`` and ``late_ns``: the spans' time in
        windows already written; ``totals``: every window's, added)."""
        where = {k: {"spans": n, "seconds": ns / 1e9} for k, (n, ns) in self.where.items()}
        late = {"spans": late_spans, "seconds": late_ns / 1e9}
        return {
            "attributed": where,
            "window": {"in_windows_seconds": totals.span_ns / 1e9, "late": late},
            "total": sum(n for n, _ in self.where.values()),
            "total_seconds": sum(ns for _, ns in self.where.values()) / 1e9,
            "sources": {
                source: {"spans": n, "dropped": dropped}
                for source, (n, dropped) in sorted(self.sources.items())
            },
            "dropped": sum(dropped for _, dropped in self.sources.values()),
            "no_phase": no_phase.as_dict(totals.unnamed_by_name),
        }
