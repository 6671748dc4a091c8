"""``MetricsReporter``: stamps records with ``seq`` and fans them out to backends.

Ordering: ``seq`` is assigned and the record enqueued (or written) under one lock, so
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
from typing import Literal, Protocol, runtime_checkable

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, WriteError
from twinkle.reporting.jsonl import JsonlWriter, StrPath, TornLineRecovery
from twinkle.reporting.record import (
    MetricRecord,
    check_run_id,
    record_fields,
    with_seq,
)

__all__ = ["Backend", "JsonlBackend", "JsonlFileBackend", "MetricsReporter", "ReporterStats"]

logger = logging.getLogger("twinkle.reporting")

#: The background writer hands queued records to the backends at least this often
#: (sooner when 1024 records are queued, or on flush/close/a full queue).
WRITE_INTERVAL_S = 0.2


class Backend(Protocol):
    """Where records go. Called from one thread at a time, records in ``seq`` order.

    ``write`` gets a batch (do not keep or mutate it); ``flush`` makes what was written
    durable (and emits anything the backend holds back); ``close`` flushes and releases.
    A backend may expose ``name`` (used in logs and stats), ``unwritten`` (records kept
    in memory after a write error) and ``recovery`` (a :class:`TornLineRecovery`).
    """

    def write(self, records: Sequence[MetricRecord]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class _SeqSource(Protocol):
    def last_seq(self, run_id: str) -> int | None: ...


class JsonlFileBackend(Backend):
    """What every backend writing one JSONL file through :class:`JsonlWriter` shares:
    the writer, its path, what it recovered on open and what it still holds after a
    failed write. Subclasses write their lines in ``write``."""

    def __init__(self, path: StrPath, *, append: bool = True, fsync: bool = False) -> None:
        self._writer = JsonlWriter(path, append=append, fsync=fsync)
        self.name = f"{type(self).__name__}({str(self._writer.path)!r})"

    @property
    def path(self) -> str:
        return str(self._writer.path)

    @property
    def writer(self) -> JsonlWriter:
        return self._writer

    @property
    def recovery(self) -> TornLineRecovery | None:
        return self._writer.recovery

    @property
    def unwritten(self) -> int:
        """Lines kept in memory after a failed write (retried by ``write``/``flush``)."""
        return self._writer.unwritten_records

    def write(self, records: Sequence[MetricRecord]) -> None:
        raise NotImplementedError  # pragma: no cover - subclasses write their lines

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __repr__(self) -> str:
        return self.name


class JsonlBackend(JsonlFileBackend):
    """Writes each record as one JSON line (``metrics_raw.jsonl``) via :class:`JsonlWriter`."""

    def write(self, records: Sequence[MetricRecord]) -> None:
        for record in records:
            if record.seq is None:
                raise RecordError(
                    f"record {record.kind!r} of iteration {record.iteration} has no seq; "
                    f"report it through MetricsReporter (which stamps it) or give it one "
                    f"(with_seq); nothing of this batch was written to {self.path!r}"
                )
        # A plain dict per record serialises faster than orjson's slotted-dataclass path.
        self._writer.write(map(record_fields, records))

    def last_seq(self, run_id: str) -> int | None:
        """``seq`` of the last record of ``run_id`` in the file, or None."""
        obj = self._writer.last_object(
            lambda o: o.get("run_id") == run_id and type(o.get("seq")) is int
        )
        return None if obj is None else int(obj["seq"])


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


def _close_at_exit(ref: weakref.ReferenceType[MetricsReporter]) -> None:
    reporter = ref()
    if reporter is not None:
        try:
            reporter.close()
        except Exception:
            logger.exception("closing reporter for run %r at exit failed", reporter.run_id)


class MetricsReporter:
    """Assigns ``seq`` to records and writes them to every backend, optionally on a
    background thread. See the module docstring for ordering and failure policy.

    ``start_seq=None`` continues after the last record of ``run_id`` found in any
    backend that can tell (a :class:`JsonlBackend` file), else starts at 0.
    ``background=True`` moves all writing to one writer thread fed by a queue bounded
    at ``queue_size`` records (reported but not yet handed to the backends, the batch
    being written included); when full, ``on_full="block"`` makes ``report`` wait and
    ``"drop"`` drops and counts. The reporter owns its backends: ``close`` closes them.
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
    ) -> None:
        # TODO(checks): the run-id check moves to twinkle.checks.
        self.run_id = check_run_id(run_id, error=InvalidArgumentError)
        if not isinstance(backends, Sequence) or isinstance(backends, str | bytes):
            raise InvalidArgumentError(
                f"backends must be a sequence of backends, got {backends!r}; "
                "e.g. [JsonlBackend('runs/<id>/metrics_raw.jsonl')]"
            )
        for i, backend in enumerate(backends):
            missing = [
                m for m in ("write", "flush", "close") if not callable(getattr(backend, m, None))
            ]
            if missing:
                raise InvalidArgumentError(
                    f"backends[{i}] = {backend!r} lacks {missing!r}; a backend has "
                    "write(records), flush() and close()"
                )
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
        self._backends: tuple[Backend, ...] = tuple(backends)
        self._names = _unique_names(self._backends)
        self._failures = [0] * len(self._backends)
        self.recoveries: tuple[TornLineRecovery, ...] = tuple(
            r
            for b in self._backends
            if isinstance(r := getattr(b, "recovery", None), TornLineRecovery)
        )
        for r in self.recoveries:
            logger.warning(
                "run %r: %s: %s (%d byte(s) from offset %d moved to %s)",
                self.run_id,
                r.path,
                r.reason,
                r.torn_bytes,
                r.offset,
                r.sidecar,
            )
        self._start_seq = self._continue_seq() if start_seq is None else start_seq
        self._next_seq = self._start_seq
        self._background = bool(background)
        self._queue_size = queue_size
        self._drop = on_full == "drop"
        self._lock = threading.Lock()  # seq, queue, counters
        self._io_lock = threading.Lock()  # backends: one caller at a time, in seq order
        self._wakeup = threading.Condition(self._lock)  # writer: records or stop
        self._not_full = threading.Condition(self._lock)  # producers: room in the queue
        self._progress = threading.Condition(self._lock)  # flush: batches delivered
        self._queue: list[MetricRecord] = []
        self._enqueued = 0
        self._delivered = 0
        self._dropped = 0
        self._refuse: str | None = None  # set when closed or the writer died
        self._fault: str | None = None  # a disk fault keeps records in a backend's memory
        self._writer_failed = False
        self._closed = False
        self._stopping = False
        self._writer_idle = False
        self._wake_at = max(1, min(1024, queue_size // 2))
        self._urgent = False
        self._writer_ident: int | None = None
        self._thread: threading.Thread | None = None
        self._atexit = _AtExit(self)
        if self._background:
            self._thread = threading.Thread(
                target=self._run, name=f"twinkle-reporter-{self.run_id}", daemon=True
            )
            self._thread.start()

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
            if self._refuse is not None:
                raise ReporterError(self._refuse)
            if self._background:
                if self._enqueued - self._delivered >= self._queue_size and not self._room():
                    seq = self._next_seq
                    self._next_seq = seq + 1
                    self._dropped += 1
                    if self._dropped & (self._dropped - 1) == 0:
                        logger.warning(
                            "run %r: queue full (%d records), dropped record seq=%d; "
                            "%d dropped so far (counted in stats.dropped)",
                            self.run_id,
                            self._queue_size,
                            seq,
                            self._dropped,
                        )
                    return with_seq(record, seq)
                seq = self._next_seq
                self._next_seq = seq + 1
                stamped = with_seq(record, seq)
                self._queue.append(stamped)
                self._enqueued += 1
                # Waking the writer per record makes it fight the caller for the GIL at
                # every burst; it wakes by itself every WRITE_INTERVAL_S, and now only
                # when a batch is worth writing.
                if self._writer_idle and len(self._queue) >= self._wake_at:
                    self._wakeup.notify()
                fault = self._fault
            else:
                seq = self._next_seq
                self._next_seq = seq + 1
                stamped = with_seq(record, seq)
                with self._io_lock:
                    self._deliver((stamped,))
                self._enqueued += 1
                self._delivered += 1
                fault = self._fault
        if fault is not None:
            error = WriteError(
                f"record seq={stamped.seq} of run {self.run_id!r} was accepted, but {fault}; "
                "records are kept in memory: fix the fault (disk space, permissions), "
                "then call flush()"
            )
            error.record = stamped
            raise error
        return stamped

    def flush(self) -> None:
        """Wait until every record reported so far was handed to the backends, then flush
        them. Raises :class:`~twinkle.errors.WriteError` if records stay unwritten (they
        are kept; call again once the fault is gone). No-op after :meth:`close`."""
        with self._lock:
            if self._closed:
                return
            if self._thread is not None and threading.get_ident() == self._writer_ident:
                raise ReporterError("flush() called from the reporter's own writer thread")
            target = self._enqueued
            if self._delivered < target:
                self._urgent = True
                self._wakeup.notify()
            while self._delivered < target:
                if self._writer_failed:
                    raise ReporterError(str(self._refuse))
                self._progress.wait()
        with self._io_lock:
            for i, backend in enumerate(self._backends):
                try:
                    backend.flush()
                except Exception as exc:
                    self._failed(i, "flush", 0, exc)
            if self._fault is not None and not any(_unwritten(b) for b in self._backends):
                self._fault = None  # the kept lines are out: report() stops raising
        self._raise_if_unwritten("flush")

    def close(self) -> None:
        """Flush, stop the writer thread, close every backend. Idempotent.

        Raises :class:`~twinkle.errors.WriteError` if records could not be written
        (they are lost with the closed backends; the error says how many).
        """
        with self._lock:
            if self._closed:
                return
            if self._thread is not None and threading.get_ident() == self._writer_ident:
                raise ReporterError("close() called from the reporter's own writer thread")
            self._closed = True
            self._stopping = True
            self._refuse = f"reporter of run {self.run_id!r} is closed; create a new one"
            self._wakeup.notify_all()
            self._not_full.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._atexit.cancel()
        lost: list[str] = []
        if self._writer_failed:
            lost.append(
                f"writer thread died: {self._enqueued - self._delivered} record(s) never "
                "reached the backends"
            )
        with self._io_lock:
            for i, backend in enumerate(self._backends):
                try:
                    backend.flush()
                except Exception as exc:
                    self._failed(i, "flush", 0, exc)
            for i, backend in enumerate(self._backends):
                unwritten = _unwritten(backend)
                try:
                    backend.close()
                except Exception as exc:
                    self._failed(i, "close", 0, exc)
                    if isinstance(exc, WriteError) or unwritten:
                        lost.append(f"{self._names[i]}: {unwritten} record(s) ({exc})")
        if lost:
            raise WriteError(
                f"closing the reporter of run {self.run_id!r} lost unwritten records: "
                + "; ".join(lost),
            )

    @property
    def stats(self) -> ReporterStats:
        """Counters now (see :class:`ReporterStats`)."""
        with self._lock:
            reported = self._next_seq - self._start_seq
            written = self._delivered
            dropped = self._dropped
            queued = self._enqueued - self._delivered
        failures = dict(zip(self._names, self._failures, strict=True))
        return ReporterStats(
            reported=reported,
            written=written,
            dropped=dropped,
            backend_failures=sum(failures.values()),
            queued=queued,
            unwritten=sum(_unwritten(b) for b in self._backends),
            failures_by_backend=failures,
            recoveries=self.recoveries,
        )

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next reported record gets."""
        return self._next_seq

    @property
    def backends(self) -> tuple[Backend, ...]:
        return self._backends

    @property
    def closed(self) -> bool:
        return self._closed

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
        mode = "background" if self._background else "sync"
        return f"MetricsReporter(run_id={self.run_id!r}, {mode}, next_seq={self._next_seq})"

    # -- internals -------------------------------------------------------------

    def _continue_seq(self) -> int:
        last = [
            s
            for b in self._backends
            if isinstance(b, _SeqSource) and (s := b.last_seq(self.run_id)) is not None
        ]
        return max(last) + 1 if last else 0

    def _room(self) -> bool:
        """Lock held, queue full: wait for room (True) or, in drop mode, False."""
        if self._drop:
            return False
        if threading.get_ident() == self._writer_ident:
            raise ReporterError(
                f"a backend of run {self.run_id!r} reported into the full queue from the "
                "writer thread (it would wait for itself); do not report from a backend"
            )
        while self._enqueued - self._delivered >= self._queue_size:
            if self._refuse is not None:
                raise ReporterError(self._refuse)
            self._urgent = True
            self._wakeup.notify()
            self._not_full.wait()
        if self._refuse is not None:
            raise ReporterError(self._refuse)
        return True

    def _deliver(self, batch: Sequence[MetricRecord]) -> None:
        """Hand one batch to every backend (io lock held); note a disk fault."""
        fault: list[str] | None = None
        for i, backend in enumerate(self._backends):
            try:
                backend.write(batch)
            except Exception as exc:
                self._failed(i, "write", len(batch), exc)
                if isinstance(exc, WriteError):
                    fault = fault or []
                    fault.append(f"{self._names[i]} cannot write ({exc.strerror or exc})")
        if fault is None and self._fault is not None and any(_unwritten(b) for b in self._backends):
            return  # no new failure, but a backend still keeps lines back
        self._fault = None if fault is None else "; ".join(fault)

    def _failed(self, i: int, call: str, n: int, exc: Exception) -> None:
        self._failures[i] += 1
        count = self._failures[i]
        if count & (count - 1):  # log the 1st, 2nd, 4th, 8th... failure
            return
        what = f"{call}({n} record(s))" if call == "write" else f"{call}()"
        logger.error(
            "run %r: backend %s failed in %s, skipped (%d failure(s) so far): %s",
            self.run_id,
            self._names[i],
            what,
            count,
            exc,
            exc_info=exc if count == 1 else None,
        )

    def _raise_if_unwritten(self, doing: str) -> None:
        pending = [
            (self._names[i], n) for i, b in enumerate(self._backends) if (n := _unwritten(b))
        ]
        if pending:
            detail = ", ".join(f"{name}: {n}" for name, n in pending)
            raise WriteError(
                f"{doing}: records of run {self.run_id!r} are not written yet ({detail}); "
                "they are kept in memory: fix the fault (disk space, permissions) and "
                "call flush() again",
            )

    def _run(self) -> None:
        """The writer thread: take the whole queue, deliver it, repeat until stopped."""
        self._writer_ident = threading.get_ident()
        try:
            while True:
                with self._lock:
                    # Sleep until a full batch, flush(), close() or a full queue asks
                    # for the writer, or WRITE_INTERVAL_S passes; then take the queue.
                    if not (self._stopping or self._urgent or len(self._queue) >= self._wake_at):
                        self._writer_idle = True
                        self._wakeup.wait(WRITE_INTERVAL_S)
                    self._writer_idle = False
                    self._urgent = False
                    batch = self._queue
                    if not batch:
                        if self._stopping:
                            return
                        continue
                    self._queue = []
                with self._io_lock:
                    self._deliver(tuple(batch))
                with self._lock:
                    self._delivered += len(batch)
                    self._not_full.notify_all()
                    self._progress.notify_all()
        except BaseException as exc:
            logger.exception("run %r: reporter writer thread died", self.run_id)
            with self._lock:
                self._writer_failed = True
                self._refuse = (
                    f"the writer thread of the reporter of run {self.run_id!r} died "
                    f"({exc!r}); records reported since are not written"
                )
                self._not_full.notify_all()
                self._progress.notify_all()
            raise


def _unwritten(backend: object) -> int:
    n = getattr(backend, "unwritten", 0)
    return n if type(n) is int else 0


def _unique_names(backends: Sequence[object]) -> tuple[str, ...]:
    names: list[str] = []
    for i, b in enumerate(backends):
        name = getattr(b, "name", None)
        if not isinstance(name, str) or not name:
            name = type(b).__qualname__
        names.append(f"{name}#{i}" if name in names else name)
    return tuple(names)


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
