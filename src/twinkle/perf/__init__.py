"""Raw observation: clocks, spans and memory readings.

Everything here observes and records; nothing computes a rate, writes a file or knows
about RL. torch is never imported by importing this package.
"""

from twinkle.perf._current import bind_process_recorder, span, timed, use_recorder
from twinkle.perf.clock import Clock, ClockAnchor, ManualClock, default_clock
from twinkle.perf.remote import WorkerRecorder, WorkerReport, gather_reports
from twinkle.perf.stats import MemoryReading, memory_stats, process_memory_stats
from twinkle.perf.timer import Span, SpanContext, TimeRecorder, current_recorder

__all__ = [
    "Clock",
    "ClockAnchor",
    "ManualClock",
    "MemoryReading",
    "Span",
    "SpanContext",
    "TimeRecorder",
    "WorkerRecorder",
    "WorkerReport",
    "bind_process_recorder",
    "current_recorder",
    "default_clock",
    "gather_reports",
    "memory_stats",
    "process_memory_stats",
    "span",
    "timed",
    "use_recorder",
]
