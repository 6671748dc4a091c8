"""Built-in observers, registered through the ``twinkle.observers`` entry-point group
like any third-party plugin: the run's timeline (which the observers computing records
read), timing, throughput, model FLOPs utilisation (:func:`mfu_config` makes its
configuration), memory, scalars, and the sinks (raw records, WebUI flat file,
event log, trace)."""

from twinkle.observers._config import BUILTIN_KINDS, ClockSkewTolerance, ObserverConfig
from twinkle.observers._mfu_config import mfu_config
from twinkle.observers.memory import PEAK_FIELDS, MemoryObserver
from twinkle.observers.mfu import MfuObserver
from twinkle.observers.scalars import ScalarsObserver
from twinkle.observers.sinks import (
    EVENTS_FILE,
    RAW_FILE,
    TRACE_FILE,
    WEBUI_FILE,
    EventLogSink,
    RawRecordsSink,
    TraceSink,
    WebUISink,
)
from twinkle.observers.throughput import ThroughputObserver
from twinkle.observers.timeline import TIMELINE, Timeline, TimelineObserver
from twinkle.observers.timing import TimingObserver

__all__ = [
    "BUILTIN_KINDS",
    "ClockSkewTolerance",
    "EVENTS_FILE",
    "PEAK_FIELDS",
    "RAW_FILE",
    "TIMELINE",
    "TRACE_FILE",
    "WEBUI_FILE",
    "EventLogSink",
    "MemoryObserver",
    "ObserverConfig",
    "RawRecordsSink",
    "ScalarsObserver",
    "MfuObserver",
    "ThroughputObserver",
    "Timeline",
    "TimelineObserver",
    "TimingObserver",
    "TraceSink",
    "WebUISink",
    "mfu_config",
]
