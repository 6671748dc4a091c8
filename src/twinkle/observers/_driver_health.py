"""The streaming driver's health per window, from its ``snapshot`` events (the state of
:class:`~twinkle.driver.StreamingDriver`: its cumulative waits and counts, its buffer):
how long the trainer waited for rollouts and the engines were blocked on a full buffer,
what was produced, consumed and dropped as stale, and how full the buffer was
(docs/metrics.md, "The driver's health"). A snapshot belongs to the window its time
falls in; the window's figures are the change from the last snapshot before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DRIVER_KEYS", "DriverLedger", "never_trained"]

#: the cumulative counts a window's figure is the change of
_COUNTS = ("produced", "consumed", "dropped")
#: the keys of a ``driver`` record, in order
DRIVER_KEYS = (
    "trainer_wait_seconds",
    "engines_blocked_seconds",
    "produced",
    "consumed",
    "dropped",
    "buffered",
    "buffered_max",
    "version",
    "policy_age_mean",
    "policy_age_max",
)


def _is_driver_state(state: Mapping[str, Any]) -> bool:
    """Whether a snapshot holds the streaming driver's state (callers may snapshot
    their own dicts: those are not read here)."""
    producers = state.get("producers")
    return (
        isinstance(producers, Mapping)
        and all(isinstance(state.get(k), int) for k in (*_COUNTS, "buffered", "version"))
        and isinstance(state.get("trainer_wait_seconds"), int | float)
        and all(
            isinstance(p, Mapping) and isinstance(p.get("idle_seconds"), int | float)
            for p in producers.values()
        )
    )


def _blocked(state: Mapping[str, Any]) -> float:
    """The producers' cumulative seconds blocked on a full buffer, added."""
    return float(sum(p["idle_seconds"] for p in state["producers"].values()))


@dataclass(slots=True)
class _Window:
    last: Mapping[str, Any]
    buffered_max: int = 0


@dataclass(slots=True)
class DriverLedger:
    """The driver's snapshots by window; each window's figures once it is finalised."""

    #: iteration -> its window's snapshots (the last one and the fullest buffer)
    windows: dict[int, _Window] = field(default_factory=dict)
    #: the last snapshot of a window already reported (or of the set-up): the baseline
    before: Mapping[str, Any] | None = None
    last: Mapping[str, Any] | None = None
    #: the totals of the segments before this one (each one's driver counted from zero)
    earlier: dict[str, Any] = field(default_factory=dict)

    def snapshot(self, state: Mapping[str, Any], iteration: int | None) -> None:
        """A snapshot taken in ``iteration``'s window (None: the set-up's)."""
        if not _is_driver_state(state):
            return
        self.last = state
        if iteration is None:
            self.before = state
            return
        window = self.windows.get(iteration)
        if window is None:
            window = self.windows[iteration] = _Window(state)
        window.last = state
        window.buffered_max = max(window.buffered_max, state["buffered"])

    def resumed(self) -> None:
        """A new segment: its driver counts from zero again (the one before's totals
        are kept)."""
        self.before = None
        if self.last is not None:
            self.earlier = _added(self.earlier, _totals(self.last))
            self.last = None

    def values(self, iteration: int) -> dict[str, int | float] | None:
        """The finalised ``iteration``'s figures (None: no snapshot in its window)."""
        window = self.windows.pop(iteration, None)
        if window is None:
            return None
        now, was = window.last, self.before
        self.before = now

        def change(key: str) -> int:
            return int(now[key]) - (0 if was is None else int(was[key]))

        waited = now["trainer_wait_seconds"] - (0 if was is None else was["trainer_wait_seconds"])
        return {
            "trainer_wait_seconds": float(waited),
            "engines_blocked_seconds": _blocked(now) - (0.0 if was is None else _blocked(was)),
            **{key: change(key) for key in _COUNTS},
            "buffered": now["buffered"],
            "buffered_max": window.buffered_max,
            "version": now["version"],
        }

    def summary(self) -> dict[str, Any]:
        """The run's totals (empty without any snapshot): each segment's last snapshot,
        added over the segments: the trainer's wait, each engine's time blocked on a
        full buffer, the items produced, consumed, dropped as stale and left in the
        buffer at the segment's end (a process's buffer is gone with it)."""
        if self.last is None:  # (a copy: the summary is handed out)
            return _added({}, self.earlier) if self.earlier else {}
        return _added(self.earlier, _totals(self.last))


def _totals(state: Mapping[str, Any]) -> dict[str, Any]:
    """One segment's totals: its driver's last snapshot."""
    return {
        "trainer_wait_seconds": float(state["trainer_wait_seconds"]),
        "engines_blocked_seconds": {
            name: float(p["idle_seconds"]) for name, p in state["producers"].items()
        },
        "produced": state["produced"],
        "consumed": state["consumed"],
        "dropped": state["dropped"],
        "left_in_buffer": state["buffered"],
    }


def _added(earlier: Mapping[str, Any], totals: dict[str, Any]) -> dict[str, Any]:
    """``totals`` with the earlier segments' added (an engine's seconds by its name)."""
    added = dict(totals)
    blocked = added["engines_blocked_seconds"] = dict(earlier.get("engines_blocked_seconds", {}))
    for name, seconds in totals["engines_blocked_seconds"].items():
        blocked[name] = blocked.get(name, 0.0) + seconds
    for key in ("trainer_wait_seconds", *_COUNTS, "left_in_buffer"):
        added[key] = earlier.get(key, 0) + totals[key]
    return added


def never_trained(
    driver: Mapping[str, Any], unstarted: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Work done that no training used: the driver's items dropped as stale and left in
    its buffer (None without its snapshots: its items are opaque, their tokens not
    known), and the iterations observed but never started: how many, their spans'
    seconds, their samples and tokens per tag added."""
    samples: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for data in unstarted.values():
        for tag, n in data["samples"].items():
            samples[tag] = samples.get(tag, 0) + n
            tokens[tag] = tokens.get(tag, 0) + data["tokens"][tag]
    return {
        "dropped": driver.get("dropped"),
        "left_in_buffer": driver.get("left_in_buffer"),
        "unstarted_iterations": len(unstarted),
        "unstarted_span_seconds": sum(d["span_seconds"] for d in unstarted.values()),
        "unstarted_samples": dict(sorted(samples.items())),
        "unstarted_tokens": dict(sorted(tokens.items())),
    }
