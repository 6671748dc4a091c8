"""Persistence: metric records, the JSONL writer, backends and the reporter.

* :class:`MetricRecord` / :func:`make_record`: validated, frozen, strict-JSON records;
  :func:`with_seq` stamps one.
* :class:`JsonlWriter`: the one writer of every JSONL file (records, events, WebUI flat):
  append mode, torn-last-line repair, write errors that keep the unwritten lines.
* :class:`JsonlBackend`, :class:`WebUIFlatBackend`: the two built-in backends.
* :class:`MetricsReporter`: assigns ``seq``, fans out to backends, optional writer thread.
* :class:`RunTotals`: per-batch totals calibrated against terminal totals.

This layer reads no clock: wall and monotonic times come in the records.
"""

from __future__ import annotations

from twinkle.reporting.jsonl import (
    JsonlReader,
    JsonlWriter,
    TornLineRecovery,
    read_jsonl,
)
from twinkle.reporting.record import (
    NONFINITE_ATTR,
    SCOPES,
    MetricRecord,
    make_record,
    record_fields,
    record_from_dict,
    record_to_dict,
    with_seq,
)
from twinkle.reporting.reporter import (
    Backend,
    JsonlBackend,
    MetricsReporter,
    ReporterStats,
)
from twinkle.reporting.totals import RunTotals
from twinkle.reporting.webui import WebUIFlatBackend

__all__ = [
    "NONFINITE_ATTR",
    "SCOPES",
    "Backend",
    "JsonlBackend",
    "JsonlReader",
    "JsonlWriter",
    "MetricRecord",
    "MetricsReporter",
    "ReporterStats",
    "RunTotals",
    "TornLineRecovery",
    "WebUIFlatBackend",
    "make_record",
    "read_jsonl",
    "record_fields",
    "record_from_dict",
    "record_to_dict",
    "with_seq",
]
