"""twinkle: observe LLM RL training runs.

What users and plugin authors need, exported once, here (docs/plugins.md lists every
name): the run (:class:`RunSession`, :func:`replay`), the observer contract
(:data:`hookimpl`, :class:`RunContext`, the event types), records and backends, and the
errors. Helpers for tests stay in :mod:`twinkle.testing`.

Each name is imported from its module on first use (PEP 562), so ``import twinkle``
imports nothing more: ``twinkle.perf`` and ``twinkle.events`` stay as light as they are,
and :mod:`twinkle.run`, its observers and pluggy load only when a name of theirs is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from twinkle.errors import (
        ConfigError,
        DriverError,
        EngineStartError,
        FinishedRunError,
        InvalidArgumentError,
        LockTimeoutError,
        PluginError,
        RecordError,
        ReplayError,
        ReporterError,
        ResumeConfigError,
        RunDirInUseError,
        TwinkleError,
        WorkerError,
        WriteError,
    )
    from twinkle.events import (
        BackendsClosed,
        EngineAck,
        Event,
        EventBus,
        IterationStarted,
        MemoryReadings,
        OptimizerStep,
        RunFinished,
        RunResumed,
        RunStarted,
        SamplesObserved,
        ScalarsObserved,
        Snapshot,
        SpanBatch,
        WeightsPublished,
    )
    from twinkle.hookspecs import RunContext, Stash, StashKey, hookimpl
    from twinkle.perf import ClockAnchor, MemoryReading, Span
    from twinkle.reporting import Backend, BackendHealth, MetricRecord, make_record
    from twinkle.run import ReplayResult, RunSession, finish_on_signals, replay

__all__ = [
    "Backend",
    "BackendHealth",
    "BackendsClosed",
    "ClockAnchor",
    "ConfigError",
    "DriverError",
    "EngineAck",
    "EngineStartError",
    "Event",
    "EventBus",
    "FinishedRunError",
    "InvalidArgumentError",
    "IterationStarted",
    "LockTimeoutError",
    "MemoryReading",
    "MemoryReadings",
    "MetricRecord",
    "OptimizerStep",
    "PluginError",
    "RecordError",
    "ReplayError",
    "ReplayResult",
    "ReporterError",
    "ResumeConfigError",
    "RunContext",
    "RunDirInUseError",
    "RunFinished",
    "RunResumed",
    "RunSession",
    "RunStarted",
    "SamplesObserved",
    "ScalarsObserved",
    "Snapshot",
    "Span",
    "SpanBatch",
    "Stash",
    "StashKey",
    "TwinkleError",
    "WeightsPublished",
    "WorkerError",
    "WriteError",
    "finish_on_signals",
    "hookimpl",
    "make_record",
    "replay",
]

#: the module each public name is imported from, on the name's first use
_HOMES: dict[str, str] = {
    "Backend": "twinkle.reporting",
    "BackendHealth": "twinkle.reporting",
    "BackendsClosed": "twinkle.events",
    "ClockAnchor": "twinkle.perf",
    "ConfigError": "twinkle.errors",
    "DriverError": "twinkle.errors",
    "EngineAck": "twinkle.events",
    "EngineStartError": "twinkle.errors",
    "Event": "twinkle.events",
    "EventBus": "twinkle.events",
    "FinishedRunError": "twinkle.errors",
    "InvalidArgumentError": "twinkle.errors",
    "IterationStarted": "twinkle.events",
    "LockTimeoutError": "twinkle.errors",
    "MemoryReading": "twinkle.perf",
    "MemoryReadings": "twinkle.events",
    "MetricRecord": "twinkle.reporting",
    "OptimizerStep": "twinkle.events",
    "PluginError": "twinkle.errors",
    "RecordError": "twinkle.errors",
    "ReplayError": "twinkle.errors",
    "ReplayResult": "twinkle.run",
    "ReporterError": "twinkle.errors",
    "ResumeConfigError": "twinkle.errors",
    "RunContext": "twinkle.hookspecs",
    "RunDirInUseError": "twinkle.errors",
    "RunFinished": "twinkle.events",
    "RunResumed": "twinkle.events",
    "RunSession": "twinkle.run",
    "RunStarted": "twinkle.events",
    "SamplesObserved": "twinkle.events",
    "ScalarsObserved": "twinkle.events",
    "Snapshot": "twinkle.events",
    "Span": "twinkle.perf",
    "SpanBatch": "twinkle.events",
    "Stash": "twinkle.hookspecs",
    "StashKey": "twinkle.hookspecs",
    "TwinkleError": "twinkle.errors",
    "WeightsPublished": "twinkle.events",
    "WorkerError": "twinkle.errors",
    "WriteError": "twinkle.errors",
    "finish_on_signals": "twinkle.run",
    "hookimpl": "twinkle.hookspecs",
    "make_record": "twinkle.reporting",
    "replay": "twinkle.run",
}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use and kept here after."""
    try:
        home = _HOMES[name]
    except KeyError:
        raise AttributeError(f"module 'twinkle' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # (the next use finds it without this function)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
