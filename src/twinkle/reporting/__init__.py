"""Persistence: metric records, the JSONL writer, the background writer, backends and
the reporter.

* :class:`MetricRecord` / :func:`make_record`: validated, frozen, strict-JSON records;
  :func:`with_seq` stamps one.
* :class:`JsonlWriter`: the one writer of every JSONL file (records, events, WebUI flat):
  append mode, torn-last-line repair, write errors that keep the unwritten lines; one
  line limit, :data:`MAX_LINE_BYTES`; torn lines go to :func:`sidecar_path`.
* :func:`read_jsonl` / :class:`JsonlReader`: the one reader, bounded, recognising what
  the writer recorded in the sidecar.
* :class:`ReplacingFile`: a file written whole or not at all (``trace.json``);
  :func:`remove_shared_write`: a plugin's files made writable only by their owner;
  :func:`make_dirs`: directories made 0755 (less the umask) at every level.
* :class:`BatchWriter`: the one background writer (records and the event log): a bounded
  number of items in flight, batching, one error rule, one state machine
  (:class:`WriterState`); inline when asked.
* :class:`JsonlBackend`, :class:`WebUIFlatBackend`: the two built-in backends, on
  :class:`JsonlFileBackend`; :class:`BackendFanout` calls every backend of a run and
  counts the failures of each.
* :class:`IsolatedBackend`: a plugin's backend behind a thread of its own, a bound per
  call and per queue, so that the run never waits for it; :class:`BackendHealth`: what
  each backend did with its records (``summary.json`` → ``backends``).
* :class:`MetricsReporter`: stamps ``seq`` and hands records through a
  :class:`BatchWriter` to a :class:`BackendFanout`.
* :class:`RunTotals`: per-batch totals calibrated against terminal totals.

This layer reads no clock: wall and monotonic times come in the records (the one
exception: :class:`IsolatedBackend` times a plugin's calls, to cut off one that hangs).
"""

from __future__ import annotations

from twinkle.reporting._frozen import FrozenDict
from twinkle.reporting._health import BackendHealth
from twinkle.reporting._jsonl_files import make_dirs, open_regular, real_path, sidecar_path
from twinkle.reporting._jsonl_tail import json_object, line_ending_at
from twinkle.reporting._jsonl_torn import TornLineRecovery
from twinkle.reporting._record_values import NONFINITE_ATTR
from twinkle.reporting.backends import Backend, JsonlBackend, JsonlFileBackend, SeqSource
from twinkle.reporting.fanout import BackendFanout
from twinkle.reporting.isolated import (
    DEFAULT_BACKEND_TIMEOUT_S,
    IsolatedBackend,
    check_backend_timeout,
)
from twinkle.reporting.jsonl import MAX_LINE_BYTES, JsonlWriter
from twinkle.reporting.jsonl_reader import JsonlReader, read_jsonl
from twinkle.reporting.record import (
    SCOPES,
    MetricRecord,
    check_record_line,
    cut_short,
    flat_key,
    is_record_kind,
    make_record,
    record_fields,
    record_from_dict,
    record_to_dict,
    with_seq,
)
from twinkle.reporting.reporter import MetricsReporter, ReporterStats
from twinkle.reporting.totals import RunTotals
from twinkle.reporting.webui import WebUIFlatBackend
from twinkle.reporting.whole_file import ReplacingFile, remove_shared_write, sync_dir
from twinkle.reporting.writer import BatchWriter, WriterState, WriterStats

__all__ = [
    "DEFAULT_BACKEND_TIMEOUT_S",
    "MAX_LINE_BYTES",
    "NONFINITE_ATTR",
    "SCOPES",
    "Backend",
    "BackendFanout",
    "BackendHealth",
    "BatchWriter",
    "FrozenDict",
    "IsolatedBackend",
    "JsonlBackend",
    "JsonlFileBackend",
    "JsonlReader",
    "JsonlWriter",
    "MetricRecord",
    "MetricsReporter",
    "ReplacingFile",
    "sync_dir",
    "ReporterStats",
    "RunTotals",
    "SeqSource",
    "TornLineRecovery",
    "WebUIFlatBackend",
    "WriterState",
    "WriterStats",
    "check_record_line",
    "cut_short",
    "flat_key",
    "is_record_kind",
    "json_object",
    "line_ending_at",
    "make_dirs",
    "make_record",
    "open_regular",
    "real_path",
    "read_jsonl",
    "record_fields",
    "record_from_dict",
    "record_to_dict",
    "remove_shared_write",
    "sidecar_path",
    "with_seq",
    "check_backend_timeout",
]
