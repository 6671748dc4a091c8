"""Spans in no phase: work the configuration names in none of its phases.

busy is the union of the phases' spans, so a span no phase pattern matches (a loop's
``train_step`` where the phases say ``train.*``) counts as idle, and a run doing nothing
but such work reads as idle throughout. The timeline counts them by name so that the
summary (``spans.no_phase``) and the report say which names to add to
``config.phases``. twinkle's own spans and ``wait.*`` spans (what a worker waited for,
docs/metrics.md "Waits and unaccounted time") are in no phase by design and not counted.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["NAMES_KEPT", "NoPhase"]

#: the names counted one by one (the first seen); later names are counted together
NAMES_KEPT: Final = 32


class NoPhase:
    """Per span name, the spans in no phase and their summed durations (ns)."""

    __slots__ = ("names", "other")

    def __init__(self) -> None:
        self.names: dict[str, list[int]] = {}  # name -> [spans, ns]
        self.other = [0, 0]  # the spans of the names beyond NAMES_KEPT

    def add(self, name: str, ns: int) -> None:
        entry = self.names.get(name)
        if entry is None:
            if len(self.names) < NAMES_KEPT:
                entry = self.names[name] = [0, 0]
            else:
                entry = self.other
        entry[0] += 1
        entry[1] += ns

    def as_dict(self) -> dict[str, Any]:
        """The summary's ``spans.no_phase``: totals, each kept name's, the rest's."""
        counts = [*self.names.values(), self.other]
        return {
            "spans": sum(n for n, _ in counts),
            "seconds": sum(ns for _, ns in counts) / 1e9,
            "names": {
                name: {"spans": n, "seconds": ns / 1e9}
                for name, (n, ns) in sorted(self.names.items())
            },
            "other": {"spans": self.other[0], "seconds": self.other[1] / 1e9},
        }
