"""The caller's business definitions, as the built-in observers read them.

The configuration travels in :class:`~twinkle.events.RunStarted` as plain JSON data so
that a replay rebuilds identical observers. Its shape::

    {
      "phases": {"rollout": ["generate", "reward"], "train": ["train.*"]},
      "throughput": {"rollout": {"samples": "rollout", "devices": 1},
                     "train":   {"samples": "train",   "devices": 1}},
      "window": {"samples": "rollout", "devices": 2},
      "streaming": {"generation": "rollout", "training": "train"},
      "lifecycle": {"setup": ["startup"], "teardown": ["shutdown"]},
      "finalise_lag": 1,
      "clock_skew": {"ahead_s": 0.01, "behind_s": 1.0},
      "trace": {"budget_mb": 200},
      "total_steps": 10
    }

* ``phases``: phase name -> span names forming it (``"prefix*"`` matches a prefix).
* ``throughput``: per phase, which sample tag counts its tokens and the device
  denominator of that phase (the physical devices it ran on; without one, counted from
  ``placement``).
* ``placement``: the devices each worker used and the phases it ran
  (:mod:`twinkle.observers._devices`): a phase's denominator is the distinct devices of
  the workers that ran it, the window's those of every worker (optional).
* ``window``: the run-level window: the sample tag whose tokens count as effective
  tokens, divided by the iterations' logical seconds and ``devices``.
* ``streaming``: which phase is generation and which is training (and, optionally,
  which moves weights to the engines: ``publish``), for the share of generation
  running while training runs and for what limits the run (optional).
* ``lifecycle``: the phases that start the run's workers (``setup``) and stop them
  (``teardown``), not the loop's work: they never open the run's active time, and a
  tear-down phase span starting after the last boundary ends the loop there, so
  stopping the workers lands in the tear-down window, not the last iteration (optional).
* ``finalise_lag``: iteration ``i``'s records are written when iteration ``i + 1 + lag``
  starts (or the run finishes), so spans that close up to ``lag`` windows after their
  window still reach its figures (default 1; see docs/metrics.md).
* ``clock_skew``: how far a worker report's send time may fall after (``ahead_s``) or
  before (``behind_s``) its arrival, as the clock anchors place it, before the worker's
  clock is taken to be skewed and its spans are placed by the arrival instead (default
  0.01 s and 1 s; see docs/metrics.md).
* ``trace``: ``budget_mb``, the most ``trace.json`` may hold of the run's windows, in
  10⁶ bytes (default 200: under chrome://tracing's 256 MB at any run length; null: no
  budget, every span; see :mod:`twinkle.observers._trace_budget`).
* ``total_steps``: the planned optimizer steps (the WebUI flat file shows it).
* ``mfu``: the model, dtype and device (or peak) that model FLOPs utilisation needs
  (:mod:`twinkle.observers._mfu_config`; optional).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import ConfigError
from twinkle.observers._compare_config import CompareConfig
from twinkle.observers._devices import (
    WorkerDevices,
    count_devices,
    parse_placement,
    phase_list,
)
from twinkle.observers._mfu_config import MfuConfig

__all__ = [
    "BUILTIN_KINDS",
    "ClockSkewTolerance",
    "ObserverConfig",
    "PhaseThroughput",
    "SpanMatcher",
    "TRACE_BUDGET_MB",
]

#: the kinds of the built-in observers' records, besides one per throughput phase
#: ``config.trace.budget_mb`` when not given
TRACE_BUDGET_MB = 200

BUILTIN_KINDS = frozenset({"timing", "memory", "iteration", "run", "driver", "waits"})


@dataclass(frozen=True, slots=True)
class SpanMatcher:
    """Exact span names plus name prefixes (from ``"prefix*"`` patterns)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, phase: str, patterns: Any) -> SpanMatcher:
        if isinstance(patterns, str) or not isinstance(patterns, list | tuple):
            raise ConfigError(
                f"config.phases[{phase!r}] must be a list of span names, got {patterns!r}; "
                'e.g. ["generate", "train.*"]'
            )
        names: set[str] = set()
        prefixes: list[str] = []
        for p in patterns:
            if not isinstance(p, str) or not p or p == "*":
                raise ConfigError(
                    f"config.phases[{phase!r}] holds {p!r}; each entry must be a span name "
                    'or a "prefix*" pattern'
                )
            if p.endswith("*"):
                prefixes.append(p[:-1])
            else:
                names.add(p)
        return cls(frozenset(names), tuple(sorted(prefixes)))

    def __call__(self, name: str) -> bool:
        return name in self.names or any(name.startswith(p) for p in self.prefixes)


@dataclass(frozen=True, slots=True)
class PhaseThroughput:
    """Which samples count for a phase's throughput and its device denominator."""

    samples: str
    devices: float


def _devices(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(
            f"{where}.devices must be a positive, finite number of physical devices, got "
            f"{value!r} (or leave it out and list the workers' devices in config.placement)"
        )
    return float(value)


def _denominator(
    where: str, value: Any, workers: Mapping[str, WorkerDevices], phase: str | None
) -> tuple[float, str]:
    """A device denominator and where it came from: the caller's count (``config``),
    else the distinct devices of the placement's workers that ran ``phase`` (every
    worker for the run window, ``phase`` None)."""
    if value is not None or not workers:
        return _devices(where, value), "config"
    ran = [w for w in workers.values() if phase is None or phase in w.phases]
    if not ran:
        raise ConfigError(
            f"{where} gives no devices and no worker of config.placement ran phase "
            f"{phase!r}: add {phase!r} to the phases of the workers that ran it, or give "
            f"{where}.devices"
        )
    return float(count_devices(ran)), "placement"


def _tag(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.samples must name a sample tag (a string), got {value!r}")
    return value


def _lifecycle(
    raw: Mapping[str, Any], phases: Mapping[str, SpanMatcher], streaming: tuple[str, str] | None
) -> tuple[frozenset[str], frozenset[str]]:
    """The set-up and tear-down phases of ``config.lifecycle`` (none without one)."""
    spec = raw.get("lifecycle")
    if spec is None:
        return frozenset(), frozenset()
    example = '{"setup": ["startup"], "teardown": ["shutdown"]}'
    if not isinstance(spec, Mapping) or not set(spec) <= {"setup", "teardown"}:
        raise ConfigError(
            f"config.lifecycle must be an object with keys 'setup' and/or 'teardown', "
            f"each a list of phases, got {spec!r:.200}; e.g. {example}"
        )
    found: dict[str, frozenset[str]] = {}
    for key in ("setup", "teardown"):
        names = phase_list(f"config.lifecycle.{key}", spec.get(key, []), phases)
        for name in names:
            if streaming is not None and name in streaming:
                raise ConfigError(
                    f"config.lifecycle.{key} names {name!r}, the streaming "
                    "generation or training phase: the loop's work, not starting or "
                    "stopping the workers"
                )
        found[key] = frozenset(names)
    both = found["setup"] & found["teardown"]
    if both:
        raise ConfigError(
            f"config.lifecycle names {sorted(both)} both a set-up and a tear-down phase"
        )
    return found["setup"], found["teardown"]


def _streaming(raw: Mapping[str, Any], phases: Mapping[str, SpanMatcher]) -> tuple[str, str] | None:
    spec = raw.get("streaming")
    if spec is None:
        return None
    keys = set(spec) if isinstance(spec, Mapping) else set()
    if not isinstance(spec, Mapping) or not {"generation", "training"} <= keys <= _STREAMING:
        raise ConfigError(
            f"config.streaming must be an object with keys 'generation' and 'training' "
            f"(and optionally 'publish') naming phases, got {spec!r}; e.g. "
            '{"generation": "rollout", "training": "train", "publish": "publish"}'
        )
    for key in sorted(keys):
        if spec[key] not in phases:
            raise ConfigError(
                f"config.streaming.{key} is {spec[key]!r}, not a phase of config.phases "
                f"({sorted(phases)})"
            )
    if len({spec[k] for k in keys}) != len(keys):
        raise ConfigError(f"config.streaming must name different phases, got {spec!r}")
    return str(spec["generation"]), str(spec["training"])


#: the keys of config.streaming
_STREAMING = frozenset({"generation", "training", "publish"})


def _trace_budget(raw: Mapping[str, Any]) -> int | None:
    """``config.trace.budget_mb`` in bytes (None: no budget)."""
    trace = raw.get("trace", {})
    if not isinstance(trace, Mapping) or any(k != "budget_mb" for k in trace):
        raise ConfigError(
            f"config.trace must be an object with the one key budget_mb, got {trace!r}; "
            'e.g. {"budget_mb": 200}'
        )
    mb = trace.get("budget_mb", TRACE_BUDGET_MB)
    if mb is None:
        return None
    if isinstance(mb, bool) or not isinstance(mb, int | float) or not 1 <= mb <= 10**6:
        raise ConfigError(
            f"config.trace.budget_mb must be a number in [1, 1000000] (10⁶ bytes) or null "
            f"(no budget), got {mb!r}"
        )
    return int(mb * 10**6)


def _publish(raw: Mapping[str, Any]) -> str | None:
    """The phase that moves weights to the engines (``streaming.publish``), or None."""
    spec = raw.get("streaming")
    return None if spec is None or spec.get("publish") is None else str(spec["publish"])


@dataclass(frozen=True, slots=True)
class ClockSkewTolerance:
    """How far a worker report's send time may fall from its arrival on the run's
    timeline (as the clock anchors place it) before the worker's clock counts as skewed.

    A send cannot come after its arrival, so one placed more than ``ahead_ns`` after it
    is a clock ahead, for certain; ``ahead_ns`` only absorbs the hosts' synchronisation
    error. One placed more than ``behind_ns`` before it is a clock behind, or a report
    that took that long to arrive: ``behind_ns`` is the delivery time still believed.
    """

    ahead_ns: int = 10_000_000
    behind_ns: int = 1_000_000_000

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ClockSkewTolerance:
        """The ``clock_skew`` key of an observer config (the defaults without one)."""
        spec = raw.get("clock_skew")
        if spec is None:
            return cls()
        if not isinstance(spec, Mapping) or not set(spec) <= {"ahead_s", "behind_s"}:
            raise ConfigError(
                f"config.clock_skew must be an object with keys 'ahead_s' and/or 'behind_s' "
                f'(seconds), got {spec!r:.200}; e.g. {{"ahead_s": 0.01, "behind_s": 1.0}}'
            )
        default = cls()
        return cls(
            _tolerance_ns(spec, "ahead_s", default.ahead_ns),
            _tolerance_ns(spec, "behind_s", default.behind_ns),
        )


def _tolerance_ns(spec: Mapping[str, Any], key: str, default_ns: int) -> int:
    value = spec.get(key)
    if value is None:
        return default_ns
    # Up to a year: a tolerance is a bound on seconds of delivery or clock error, and the
    # nanoseconds stay well within 64 bits.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3.2e7:
        raise ConfigError(
            f"config.clock_skew.{key} must be a number of seconds in [0, 3.2e7], got "
            f"{value!r}; e.g. {key}=0.5"
        )
    return round(value * 1e9)


@dataclass(frozen=True, slots=True)
class ObserverConfig:
    """Parsed observer configuration (see the module doc for the JSON shape)."""

    phases: dict[str, SpanMatcher]
    throughput: dict[str, PhaseThroughput]
    window: PhaseThroughput | None
    total_steps: int
    #: (generation phase, training phase) of a streaming run, or None
    streaming: tuple[str, str] | None = None
    finalise_lag: int = 1
    clock_skew: ClockSkewTolerance = field(default_factory=ClockSkewTolerance)
    #: the phases that start the workers (``lifecycle.setup``) and that stop them
    setup_phases: frozenset[str] = frozenset()
    teardown_phases: frozenset[str] = frozenset()
    #: the phase that moves weights to the engines (``streaming.publish``), or None
    publish: str | None = None
    #: the devices each worker used (``config.placement``; {} without one)
    placement: dict[str, WorkerDevices] = field(default_factory=dict)
    #: the most bytes ``trace.json`` may hold of the run's windows (None: no budget)
    trace_budget_bytes: int | None = TRACE_BUDGET_MB * 10**6
    #: where each denominator came from, ``"config"`` or ``"placement"`` (the window's
    #: under None, each throughput phase's under its name)
    device_sources: dict[str | None, str] = field(default_factory=dict)
    #: what model FLOPs utilisation needs (``config.mfu``), or None
    mfu: MfuConfig | None = None
    #: every pair of phases, in config order (the pairwise overlaps reported)
    pairs: tuple[tuple[str, str], ...] = field(init=False, compare=False, repr=False)
    #: the workers ``config.placement`` places on each side of a streaming run: True
    #: the engines' (they ran the generation phase, not the training phase), False the
    #: trainer's (they ran the training phase): where their publish spans ran
    worker_sides: dict[str, bool] = field(init=False, compare=False, repr=False)
    # span name -> phase, filled as names are seen (a run uses a handful of names)
    _phase_cache: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        names = list(self.phases)
        pairs = tuple((p, q) for i, p in enumerate(names) for q in names[i + 1 :])
        object.__setattr__(self, "pairs", pairs)  # derived once (the instance is frozen)
        sides: dict[str, bool] = {}
        if self.streaming is not None:
            generation, training = self.streaming
            for name, worker in self.placement.items():
                if training in worker.phases or generation in worker.phases:
                    sides[name] = training not in worker.phases
        object.__setattr__(self, "worker_sides", sides)

    def record_kinds(self) -> frozenset[str]:
        """The kinds of every record the built-in observers make under this
        configuration: :data:`BUILTIN_KINDS`, the throughput phases and, with
        ``config.mfu``, ``mfu``."""
        mfu = frozenset() if self.mfu is None else frozenset({"mfu"})
        return BUILTIN_KINDS | frozenset(self.throughput) | mfu

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ObserverConfig:
        """Validate ``raw`` (``RunStarted.config``); :class:`ConfigError` names the key."""
        known = {
            "phases",
            "throughput",
            "window",
            "total_steps",
            "streaming",
            "finalise_lag",
            "clock_skew",
            "lifecycle",
            "placement",
            "trace",
            "mfu",
            "compare",
        }
        bad = [k for k in raw if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"observer config keys must be str, got {bad[0]!r}")
        unknown = sorted(k for k in raw if k not in known and not k.startswith("x_"))
        if unknown:
            raise ConfigError(
                f"unknown observer config key(s) {unknown}; known: {sorted(known)} "
                "(prefix your own keys with 'x_')"
            )
        phases_raw = raw.get("phases", {})
        if not isinstance(phases_raw, Mapping):
            raise ConfigError(f"config.phases must be an object, got {phases_raw!r}")
        phases = {str(k): SpanMatcher.parse(k, v) for k, v in phases_raw.items()}
        workers = parse_placement(raw, phases)
        sources: dict[str | None, str] = {}
        tp_raw = raw.get("throughput", {})
        if not isinstance(tp_raw, Mapping):
            raise ConfigError(f"config.throughput must be an object, got {tp_raw!r}")
        throughput: dict[str, PhaseThroughput] = {}
        for phase, spec in tp_raw.items():
            where = f"config.throughput[{phase!r}]"
            if phase not in phases:
                raise ConfigError(
                    f"{where} names a phase that config.phases does not define; "
                    f"defined phases: {sorted(phases)}"
                )
            if not isinstance(spec, Mapping):
                raise ConfigError(f"{where} must be an object, got {spec!r}")
            devices, sources[phase] = _denominator(where, spec.get("devices"), workers, phase)
            throughput[phase] = PhaseThroughput(_tag(where, spec.get("samples")), devices)
        window_raw = raw.get("window")
        window = None
        if window_raw is not None:
            if not isinstance(window_raw, Mapping):
                raise ConfigError(f"config.window must be an object, got {window_raw!r}")
            devices, sources[None] = _denominator(
                "config.window", window_raw.get("devices"), workers, None
            )
            window = PhaseThroughput(_tag("config.window", window_raw.get("samples")), devices)
        total_steps = raw.get("total_steps", 0)
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 0:
            raise ConfigError(f"config.total_steps must be a non-negative int, got {total_steps!r}")
        lag = raw.get("finalise_lag", 1)
        if isinstance(lag, bool) or not isinstance(lag, int) or not 0 <= lag <= 64:
            raise ConfigError(
                f"config.finalise_lag must be an int in [0, 64] (iterations a window's "
                f"records wait for late spans), got {lag!r}"
            )
        streaming = _streaming(raw, phases)
        CompareConfig.parse(raw.get("compare"))  # (its observer's: an error is said now)
        return cls(
            phases,
            throughput,
            window,
            total_steps,
            streaming,
            lag,
            ClockSkewTolerance.parse(raw),
            *_lifecycle(raw, phases, streaming),
            _publish(raw),
            workers,
            _trace_budget(raw),
            sources,
            MfuConfig.parse(raw.get("mfu"), throughput, streaming),
        )

    def phase_of(self, span_name: str) -> str | None:
        """The first configured phase (in config order) whose patterns match."""
        cache = self._phase_cache
        try:
            return cache[span_name]
        except KeyError:
            pass
        found = None
        for phase, matcher in self.phases.items():
            if matcher(span_name):
                found = phase
                break
        cache[span_name] = found
        return found

    def is_loop_work(self, phase: str | None) -> bool:
        """Whether ``phase`` is the loop's work: a phase, and not one that starts or
        stops the workers (``lifecycle``)."""
        return (
            phase is not None
            and phase not in self.setup_phases
            and phase not in self.teardown_phases
        )
