"""``MetricsReporter``: stamps records with ``seq`` and writes them to every backend.

Three parts, each in its own module: seq stamping (here), the fan-out to the backends
with its failure policy (:class:`~twinkle.reporting.BackendFanout`) and the writer that
carries records from the caller to the fan-out
(:class:`~twinkle.reporting.BatchWriter`: on a background thread, or inline).

Ordering: ``seq`` is stamped and the record handed to the writer under one lock, so
every backend sees records in ``seq`` order and a JSONL file's line order is its ``seq``
order, whatever the number of reporting threads.

Failure policy: a backend that raises is logged (logger ``twinkle.reporting``) with its
name, counted in :attr:`MetricsReporter.stats`, and skipped for that batch; the other
backends still get every record. Nothing is dropped silently: with ``on_full="drop"``
a full queue drops the record but counts it (and its ``seq`` stays unused, so the gap
shows in the file); lines a backend could not write (disk full, permissions) stay in
that backend's memory and are counted in ``stats.unwritten``, and while any remain
:meth:`MetricsReporter.report`, :meth:`MetricsReporter.flush` and
:meth:`MetricsReporter.close` raise :class:`~twinkle.errors.WriteError` — ``report``
after accepting the record (``WriteError.record``), so the caller learns of the fault
at its next call and loses nothing; the kept lines go out first once the fault is gone.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from twinkle.checks import run_id as check_run_id
from twinkle.errors import InvalidArgumentError, RecordError, WriteError
from twinkle.reporting._health import BackendHealth
from twinkle.reporting._jsonl_torn import TornLineRecovery
from twinkle.reporting.backends import Backend
from twinkle.reporting.fanout import BackendFanout
from twinkle.reporting.record import MetricRecord, with_seq
from twinkle.reporting.writer import BatchWriter, WriterState

__all__ = ["MetricsReporter", "ReporterStats"]

logger = logging.getLogger("twinkle.reporting")

# The background writer hands queued records to the backends at least this often
# (sooner when 1024 records are queued, or on flush/close/a full queue).
_WRITE_INTERVAL_S = 0.2


@dataclass(frozen=True, slots=True)
class ReporterStats:
    """A snapshot of a reporter's counters."""

    reported: int  # records accepted by report() (each got a seq)
    written: int  # records handed to every backend
    dropped: int  # records dropped on a full queue (on_full="drop")
    backend_failures: int  # backend calls (write/flush/close) that raised, all backends
    queued: int = 0  # records waiting for the writer thread
    unwritten: int = 0  # records backends keep in memory after write errors
    failures_by_backend: Mapping[str, int] = field(default_factory=dict)
    recoveries: tuple[TornLineRecovery, ...] = ()  # torn last lines repaired on open
    waits: int = 0  # report() calls that waited for room in a full queue (on_full="block")


class MetricsReporter:
    """Assigns ``seq`` to records and writes them to every backend, optionally on a
    background thread. See the module docstring for ordering and failure policy.

    ``start_seq=None`` continues after the last record of ``run_id`` found in any
    backend that can tell (a :class:`JsonlBackend` file), else starts at 0.
    ``background=True`` moves all writing to one writer thread fed by a queue bounded
    at ``queue_size`` records (reported but not yet handed to the backends, the batch
    being written included); when full, ``on_full="block"`` makes ``report`` wait and
    ``"drop"`` drops and counts. The reporter owns its backends: ``close`` closes them.
    ``names`` names the backends in stats and health (default: their own names).
    A reporter left open is closed at interpreter exit, so no queued record is lost.
    One reporter per file: two live reporters appending to one file would interleave.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        *,
        run_id: str,
        start_seq: int | None = None,
        background: bool = False,
        queue_size: int = 65536,
        on_full: Literal["block", "drop"] = "block",
        names: Sequence[str] | None = None,
    ) -> None:
        self.run_id = check_run_id(run_id, error=InvalidArgumentError)
        self._fanout = BackendFanout(backends, run_id=self.run_id, names=names)
        if start_seq is not None and (type(start_seq) is not int or start_seq < 0):
            raise InvalidArgumentError(
                f"start_seq must be None (continue the file) or an int >= 0, got {start_seq!r}"
            )
        if type(queue_size) is not int or queue_size < 1:
            raise InvalidArgumentError(
                f"queue_size must be an int >= 1 (records held for the writer thread), "
                f"got {queue_size!r}"
            )
        if on_full not in ("block", "drop"):
            raise InvalidArgumentError(
                f"on_full must be 'block' (wait for room) or 'drop' (drop and count), "
                f"got {on_full!r}"
            )
        if start_seq is None:
            last = self._fanout.last_seq(self.run_id)
            start_seq = 0 if last is None else last + 1
        self._start_seq = start_seq
        self._next_seq = start_seq
        self._lock = threading.Lock()  # seq order is queue order
        self._writer: BatchWriter[MetricRecord] = BatchWriter(
            self._fanout.write,
            name=f"reporter of run {self.run_id!r}",
            thread_name=f"reporter-{self.run_id}",
            background=bool(background),
            capacity=queue_size,
            on_full=on_full,
            wake_at=max(1, min(1024, queue_size // 2)),
            interval_s=_WRITE_INTERVAL_S,
        )
        self._atexit = _AtExit(self)

    # -- public API ------------------------------------------------------------

    def report(self, record: MetricRecord) -> MetricRecord:
        """Stamp ``record`` with the next ``seq``, hand it to the backends (or the writer
        thread) and return the stamped record.

        Raises :class:`~twinkle.errors.RecordError` for a record of another run and
        :class:`~twinkle.errors.ReporterError` once the reporter is closed. Backend
        failures do not raise here (they are logged and counted), except a disk fault
        that keeps records in a backend's memory: then :class:`~twinkle.errors.WriteError`
        is raised *after* the record was accepted (stamped and kept: ``exc.record``), at
        every call until a write succeeds again (in background mode: from the call after
        the writer thread met the fault).
        """
        if type(record) is not MetricRecord and not isinstance(record, MetricRecord):
            raise InvalidArgumentError(
                f"report() takes a MetricRecord (see make_record), got {record!r:.200}"
            )
        if record.run_id != self.run_id:
            raise RecordError(
                f"record of run {record.run_id!r} reported to the reporter of run "
                f"{self.run_id!r}; use one reporter per run"
            )
        with self._lock:
            seq = self._next_seq
            stamped = with_seq(record, seq)
            writer = self._writer
            taken = writer.accepted + writer.dropped
            try:
                kept = writer.put(stamped)
            finally:
                # The seq is used once put() took the record (kept or dropped), even when
                # an exception follows: a held error, or a Ctrl-C landing right after
                # (that gave the next record the same seq). Refused before it took the
                # record (closed), the seq stays unused.
                if writer.accepted + writer.dropped != taken:
                    self._next_seq = seq + 1
        if not kept:
            dropped = self._writer.dropped
            if dropped & (dropped - 1) == 0:
                logger.warning(
                    "run %r: queue full, dropped record seq=%d; %d dropped so far "
                    "(counted in stats.dropped)",
                    self.run_id,
                    seq,
                    dropped,
                )
            return stamped
        fault = self._fanout.fault
        if fault is not None:
            error = WriteError(
                f"record seq={seq} of run {self.run_id!r} was accepted, but {fault}; "
                "records are kept in memory: fix the fault (disk space, permissions), "
                "then call flush()"
            )
            error.record = stamped
            raise error
        return stamped

    def wait_delivered(self) -> bool:
        """Wait until every record reported so far was handed to the backends (what a
        backend holds back, it still holds: a checkpoint takes it as state); False when
        a delivery failed (its error stays for the next call to raise)."""
        return not self.closed and self._writer.settle()

    def flush(self) -> None:
        """Wait until every record reported so far was handed to the backends, then flush
        them. Raises :class:`~twinkle.errors.WriteError` if records stay unwritten (they
        are kept; call again once the fault is gone). No-op after :meth:`close`."""
        if self.closed:
            return
        self._writer.flush()
        self._fanout.flush()
        self._fanout.raise_if_unwritten("flush")

    def close(self) -> None:
        """Flush, stop the writer thread, close every backend. Idempotent.

        Raises :class:`~twinkle.errors.WriteError` if records could not be written
        (they are lost with the closed backends; the error says how many).
        """
        if not self._writer.close():
            return
        self._atexit.cancel()
        lost: list[str] = []
        never = self._writer.stats.lost
        if never:
            lost.append(
                f"the writer thread died ({self._writer.failure}): {never} record(s) never "
                "reached the backends"
            )
        lost += self._fanout.close()
        if lost:
            raise WriteError(
                f"closing the reporter of run {self.run_id!r} lost unwritten records: "
                + "; ".join(lost),
            )

    @property
    def stats(self) -> ReporterStats:
        """Counters now (see :class:`ReporterStats`)."""
        writer = self._writer.stats
        failures = self._fanout.failures
        return ReporterStats(
            reported=self._next_seq - self._start_seq,
            written=writer.delivered,
            dropped=writer.dropped,
            backend_failures=sum(failures.values()),
            queued=writer.in_flight,
            unwritten=self._fanout.unwritten(),
            failures_by_backend=failures,
            recoveries=self._fanout.recoveries,
            waits=writer.waits,
        )

    def close_isolated(self) -> None:
        """Hand every record reported so far to the backends, then close the isolated
        ones (:class:`~twinkle.reporting.IsolatedBackend`: a plugin's), each within its
        bound: after this, :meth:`health` is what they did with the run's records."""
        if not self.closed:
            self._writer.flush()
        self._fanout.close_isolated()

    def cut_off_isolated(self, why: str) -> None:
        """Give up on the isolated backends not closed yet (their health says ``why``)."""
        self._fanout.cut_off_isolated(why)

    def health(self) -> dict[str, BackendHealth]:
        """What each backend did with its records so far, by name (see
        :class:`~twinkle.reporting.BackendHealth`)."""
        return self._fanout.health()

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next reported record gets."""
        return self._next_seq

    @property
    def backends(self) -> tuple[Backend, ...]:
        return self._fanout.backends

    @property
    def recoveries(self) -> tuple[TornLineRecovery, ...]:
        """Torn last lines the backends repaired when they opened their files."""
        return self._fanout.recoveries

    @property
    def closed(self) -> bool:
        return self._writer.state in (WriterState.CLOSING, WriterState.CLOSED)

    def __enter__(self) -> MetricsReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MetricsReporter(run_id={self.run_id!r}, {self._writer!r}, next_seq={self._next_seq})"
        )


def _close_at_exit(ref: weakref.ReferenceType[MetricsReporter]) -> None:
    reporter = ref()
    if reporter is not None:
        try:
            reporter.close()
        except Exception:
            logger.exception("closing reporter for run %r at exit failed", reporter.run_id)


class _AtExit:
    """Closes a reporter at interpreter exit unless it was closed (holds it weakly)."""

    __slots__ = ("_fn",)

    def __init__(self, reporter: MetricsReporter) -> None:
        ref = weakref.ref(reporter)

        def fn() -> None:
            _close_at_exit(ref)

        self._fn: Callable[[], None] = fn
        atexit.register(fn)

    def cancel(self) -> None:
        atexit.unregister(self._fn)
