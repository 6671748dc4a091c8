"""The run's placement: which devices each worker used, and the device denominators
that follow from it (``config.placement``; docs/metrics.md, "Devices").

Its shape, one entry per worker (an engine, a rank, an actor)::

    "placement": {
      "engine0": {"phases": ["rollout"], "device_type": "cuda", "devices": ["GPU-8f2c..."]},
      "trainer": {"phases": ["train", "publish"], "device_type": "cuda", "count": 2}
    }

``devices`` names the physical devices the worker used (a device's name identifies it:
workers that share one count it once); ``count`` says how many without naming them
(each worker's then count on their own). A phase's device count is the number of
distinct devices over the workers that ran it, the run's over every worker; a count the
caller gives in ``throughput.<phase>.devices`` or ``window.devices`` wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from twinkle.errors import ConfigError

__all__ = ["WorkerDevices", "count_devices", "parse_placement", "phase_list", "placement_summary"]

_EXAMPLE = '{"engine0": {"phases": ["rollout"], "device_type": "cuda", "devices": ["cuda:0"]}}'


@dataclass(frozen=True, slots=True)
class WorkerDevices:
    """One worker's devices: their type, their names (empty: not named) and count, and
    the phases the worker ran."""

    phases: tuple[str, ...]
    device_type: str
    names: tuple[str, ...]
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "phases": list(self.phases),
            "device_type": self.device_type,
            "devices": list(self.names),
            "count": self.count,
        }


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {value!r:.100}")
    return value


def phase_list(
    where: str, value: Any, phases: Mapping[str, Any], *, empty: bool = True
) -> tuple[str, ...]:
    """``value`` checked to be a list of phases of ``config.phases`` (non-empty unless
    ``empty``); :class:`ConfigError` names ``where`` and the phase that is not one."""
    if isinstance(value, str) or not isinstance(value, list | tuple) or not (empty or value):
        what = "a list" if empty else "a non-empty list"
        raise ConfigError(f"{where} must be {what} of phases, got {value!r:.100}")
    for name in value:
        if name not in phases:
            raise ConfigError(
                f"{where} names {name!r:.100}, not a phase of config.phases ({sorted(phases)})"
            )
    return tuple(value)


def _worker(where: str, spec: Any, phases: Mapping[str, Any]) -> WorkerDevices:
    if not isinstance(spec, Mapping) or not set(spec) <= {
        "phases",
        "device_type",
        "devices",
        "count",
    }:
        raise ConfigError(
            f"{where} must be an object with keys 'phases', 'device_type' and 'devices' "
            f"(names) or 'count', got {spec!r:.200}; e.g. {_EXAMPLE}"
        )
    ran = phase_list(f"{where}.phases", spec.get("phases"), phases, empty=False)
    names = spec.get("devices", [])
    if isinstance(names, str) or not isinstance(names, list | tuple):
        raise ConfigError(f"{where}.devices must be a list of device names, got {names!r:.100}")
    names = tuple(_text(f"{where}.devices[{i}]", n) for i, n in enumerate(names))
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.devices names a device twice: {list(names)!r:.200}")
    count = spec.get("count", len(names))
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"{where} must name its devices ('devices') or count them ('count', an int >= 1), "
            f"got count {count!r:.100}"
        )
    if names and count != len(names):
        raise ConfigError(f"{where}.count is {count} but it names {len(names)} devices")
    return WorkerDevices(
        tuple(dict.fromkeys(ran)),
        _text(f"{where}.device_type", spec.get("device_type")),
        names,
        count,
    )


def parse_placement(raw: Mapping[str, Any], phases: Mapping[str, Any]) -> dict[str, WorkerDevices]:
    """The workers of ``config.placement`` ({} without one); :class:`ConfigError` names
    the key that is wrong."""
    spec = raw.get("placement")
    if spec is None:
        return {}
    if not isinstance(spec, Mapping) or not spec:
        raise ConfigError(
            f"config.placement must be an object of workers, got {spec!r:.200}; e.g. {_EXAMPLE}"
        )
    return {
        _text("config.placement keys", name): _worker(f"config.placement[{name!r}]", w, phases)
        for name, w in spec.items()
    }


def count_devices(workers: Iterable[WorkerDevices]) -> int:
    """The physical devices of ``workers``: each named device once, however many
    workers used it, plus every unnamed one."""
    named: set[tuple[str, str]] = set()
    unnamed = 0
    for w in workers:
        if w.names:
            named.update((w.device_type, n) for n in w.names)
        else:
            unnamed += w.count
    return len(named) + unnamed


def placement_summary(
    workers: Mapping[str, WorkerDevices],
    window: tuple[float, str] | None,
    phases: Mapping[str, tuple[float, str]],
) -> dict[str, Any]:
    """``summary.json``'s ``placement``: each worker's devices, and each device
    denominator (the run window's and each throughput phase's) with where it came from
    (``placement``, or ``config``: the caller's count)."""

    def denominator(d: tuple[float, str]) -> dict[str, Any]:
        return {"devices": d[0], "from": d[1]}

    return {
        "workers": {name: w.to_dict() for name, w in sorted(workers.items())},
        "window": None if window is None else denominator(window),
        "phases": {phase: denominator(d) for phase, d in phases.items()},
    }
