"""Computation: pure metrics over explicit observations (no I/O, no clocks, no torch at import).

* :class:`Metric` — the ``accumulate`` / ``calculate`` / ``reset`` protocol.
* :class:`ThroughputMetric` — window tokens/s and tokens/s/device as ratios of totals.
* :class:`LengthHistogram` — exact, deterministic, mergeable length distribution.
* :func:`memory_metrics` and friends — cross-worker memory reduction in binary units.
* :func:`model_shape`, :func:`forward_flops`, :func:`training_flops`,
  :func:`generation_flops` — model FLOPs from a configuration (:mod:`.flops`).
* :func:`device_peak` — a device's dense peak FLOP rate by its name (:mod:`.peaks`).

Persistence lives in :mod:`twinkle.reporting`, which is not imported here.
"""

from __future__ import annotations

from twinkle.metric.base import Metric
from twinkle.metric.flops import (
    ModelShape,
    forward_flops,
    generation_flops,
    model_shape,
    training_flops,
)
from twinkle.metric.histogram import LengthHistogram
from twinkle.metric.memory import (
    BINARY_UNITS,
    MEMORY_FIELDS,
    MemoryMetrics,
    Reduction,
    convert_bytes,
    gather_readings,
    memory_metrics,
    memory_report,
    reduce_readings,
)
from twinkle.metric.peaks import Peak, device_peak
from twinkle.metric.throughput import THROUGHPUT_KEYS, ThroughputMetric

__all__ = [
    "BINARY_UNITS",
    "MEMORY_FIELDS",
    "THROUGHPUT_KEYS",
    "LengthHistogram",
    "MemoryMetrics",
    "Metric",
    "ModelShape",
    "Peak",
    "Reduction",
    "ThroughputMetric",
    "convert_bytes",
    "device_peak",
    "forward_flops",
    "gather_readings",
    "generation_flops",
    "memory_metrics",
    "memory_report",
    "model_shape",
    "reduce_readings",
    "training_flops",
]
