"""Spans in no phase: work the configuration names in none of its phases.

busy is the union of the phases' spans, so a span no phase pattern matches (a loop's
``train_step`` where the phases say ``train.*``) counts as idle, and a run doing nothing
but such work reads as idle throughout. The timeline counts them by name so that the
summary (``spans.no_phase``) and the report say which names to add to
``config.phases``: first the names that ran while no phase did (their idle seconds,
measured by the timeline's windows), as a library's timers nested in a phase's span run
in no idle. twinkle's own spans and ``wait.*`` spans (what a worker waited for,
docs/metrics.md "Waits and unaccounted time") are in no phase by design and not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["NAMES_KEPT", "OTHER", "NoPhase"]

#: the names counted one by one (the first seen); later names are counted together
NAMES_KEPT: Final = 32
#: the key of the names beyond :data:`NAMES_KEPT` (a span's name is never empty)
OTHER: Final = ""


class NoPhase:
    """Per span name, the spans in no phase and their summed durations (ns)."""

    __slots__ = ("names", "other")

    def __init__(self) -> None:
        self.names: dict[str, list[int]] = {}  # name -> [spans, ns]
        self.other = [0, 0]  # the spans of the names beyond NAMES_KEPT

    def add(self, name: str, ns: int) -> str:
        """Count a span of ``ns``; returns the key its idle time is measured under: its
        name, or :data:`OTHER` for a name beyond the kept ones."""
        entry = self.names.get(name)
        key = name
        if entry is None:
            if len(self.names) < NAMES_KEPT:
                entry = self.names[name] = [0, 0]
            else:
                entry, key = self.other, OTHER
        entry[0] += 1
        entry[1] += ns
        return key

    def as_dict(self, idle_ns: Mapping[str, int]) -> dict[str, Any]:
        """The summary's ``spans.no_phase``: totals, each kept name's, the rest's;
        ``idle_ns``: per key, the idle time in which spans of it ran."""
        counts = [*self.names.values(), self.other]
        return {
            "spans": sum(n for n, _ in counts),
            "seconds": sum(ns for _, ns in counts) / 1e9,
            "names": {
                name: _entry(n, ns, idle_ns.get(name, 0))
                for name, (n, ns) in sorted(self.names.items())
            },
            "other": _entry(self.other[0], self.other[1], idle_ns.get(OTHER, 0)),
        }


def _entry(spans: int, ns: int, idle_ns: int) -> dict[str, Any]:
    return {"spans": spans, "seconds": ns / 1e9, "idle_seconds": idle_ns / 1e9}
