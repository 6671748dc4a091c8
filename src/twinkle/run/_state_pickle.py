"""How a checkpoint's state is read back: an unpickler that makes twinkle's values and
plain Python values only (no function, no class of another package, none of twinkle's
that could do I/O when made): a checkpoint is data, never code, and a file planted in a
run directory must not run anything, nor wait on anything.
"""

from __future__ import annotations

import enum
import pickle
from typing import IO, Any, Final

import msgspec

__all__ = ["read_state"]

#: the modules whose classes a checkpoint's state holds: twinkle's values (events,
#: metrics, the observers' ledgers, clocks, segments), never its I/O
_TWINKLE: Final = (
    "twinkle.events.",
    "twinkle.metric.",
    "twinkle.observers.",
    "twinkle.perf.",
    "twinkle.run._summary",
    "twinkle.reporting._frozen",
    "twinkle.reporting._health",
)
#: twinkle's classes of the state other than its msgspec values and enums (whose making
#: only sets fields): the observers' ledgers, each made without I/O. Any other class of
#: those modules is refused, as it could do I/O when made (a planted checkpoint making
#: the event log's ``HeldLog`` of a FIFO would wait on it). A class of the state missing
#: here makes a resume say the checkpoint cannot be read back and feed the whole log
#: (every checkpoint a test's run writes is read back: tests/conftest.py).
_LEDGERS: Final = frozenset(
    {
        ("twinkle.events._frozen", "FrozenList"),
        ("twinkle.reporting._frozen", "FrozenDict"),
        ("twinkle.run._summary", "Segment"),
        ("twinkle.metric.flops", "ModelShape"),
        ("twinkle.metric.histogram", "LengthHistogram"),
        ("twinkle.metric.peaks", "Peak"),
        ("twinkle.metric.throughput", "ThroughputMetric"),
        *(
            (f"twinkle.observers.{module}", name)
            for module, names in {
                "_compare_config": ("CompareConfig", "CompareThroughput"),
                "_config": (
                    "ClockSkewTolerance",
                    "ObserverConfig",
                    "PhaseThroughput",
                    "SpanMatcher",
                ),
                "_devices": ("WorkerDevices",),
                "_driver_health": ("DriverLedger", "_Window"),
                "_limits": ("LimitsLedger",),
                "_measure": ("IterationData",),
                "_mfu_config": ("MfuConfig",),
                "_no_phase": ("NoPhase",),
                "_publish_sides": ("PublishSides",),
                "_span_ledger": ("SpanLedger",),
                "_stragglers": ("StragglerLedger", "_Iteration", "_Side", "_Verdicts", "_Work"),
                "_timeline": ("Timeline", "_Window"),
                "_trace_budget": ("TraceBudget", "_LowerMedian", "_Window"),
                "_trace_lines": ("TraceLines",),
                "_trace_tracks": ("Track",),
                "_waits": ("PolicyAges", "_Ages"),
                "_workers": ("WorkerLedger", "_Totals"),
                "memory": ("_Window",),
                "mfu": ("SampleFlops", "_Totals"),
                "placement": ("SkewLedger", "_Skewed"),
                "timing": ("WindowKeys",),
            }.items()
            for name in names
        ),
    }
)
#: the classes outside twinkle it may hold
_PLAIN: Final = {
    ("builtins", name) for name in ("set", "frozenset", "bytearray", "complex", "slice", "range")
} | {
    ("collections", "deque"),
    ("collections", "Counter"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("array", "array"),
    ("array", "_array_reconstructor"),
    ("copyreg", "_reconstructor"),
    ("fractions", "Fraction"),
}


class _Unpickler(pickle.Unpickler):
    """Makes the classes of twinkle's values and plain Python values only (no function,
    no class of another package, none of twinkle's that does I/O): a checkpoint is
    data, never code, and a file planted in a run directory must not run anything."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        if module.startswith(_TWINKLE) and name.isidentifier():  # (no dotted path)
            found = super().find_class(module, name)
            # a class of that module itself, not one it imported (logging's, io's...)
            if isinstance(found, type) and found.__module__ == module and _value(found):
                return found
        raise pickle.UnpicklingError(
            f"a checkpoint holds only twinkle's values, not {module}.{name}"
        )


def _value(cls: type) -> bool:
    """Whether a checkpoint may make ``cls``: one of :data:`_LEDGERS`, a msgspec value
    (events, clocks, timings) or an enum."""
    return (cls.__module__, cls.__name__) in _LEDGERS or issubclass(cls, msgspec.Struct | enum.Enum)


def read_state(file: IO[bytes]) -> Any:
    """The state pickled in ``file``, made by :class:`_Unpickler`."""
    return _Unpickler(file).load()
