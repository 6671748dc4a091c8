"""Backends: where records go. The :class:`Backend` protocol and the JSONL backends.

Every backend writing a JSONL file holds one :class:`~twinkle.reporting.JsonlWriter`
(:class:`JsonlFileBackend`); :class:`JsonlBackend` writes each record as one line of
``metrics_raw.jsonl``, and :class:`~twinkle.reporting.WebUIFlatBackend` the flat WebUI
lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from twinkle.errors import RecordError, WriteError
from twinkle.reporting._jsonl_files import StrPath
from twinkle.reporting._jsonl_torn import TornLineRecovery
from twinkle.reporting.jsonl import JsonlWriter
from twinkle.reporting.record import MetricRecord, record_fields
from twinkle.reporting.whole_file import sync_dir

__all__ = ["Backend", "JsonlBackend", "JsonlFileBackend", "SeqSource"]

logger = logging.getLogger("twinkle.reporting")


class Backend(Protocol):
    """Where records go. Called from one thread at a time, records in ``seq`` order.

    ``write`` gets a batch (do not keep or mutate it); ``flush`` makes what was written
    durable (and emits anything the backend holds back); ``close`` flushes and releases.
    A backend may expose ``name`` (used in logs and stats), ``unwritten`` (records kept
    in memory after a write error) and ``recovery`` (a :class:`TornLineRecovery`).

    A plugin's backend may also have ``open()``: its slow set-up (importing a library,
    reaching a tracking server), called once, first, on the backend's own thread
    (:class:`~twinkle.reporting.IsolatedBackend`), never on the run's start. One whose
    ``open()`` raises gets no other call; one cut off gets ``close()`` once its late
    call returns.
    """

    def write(self, records: Sequence[MetricRecord]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SeqSource(Protocol):
    """A backend that can say the last ``seq`` of a run it holds (to continue after it)."""

    def last_seq(self, run_id: str) -> int | None: ...


class JsonlFileBackend(Backend):
    """What every backend writing one JSONL file through :class:`JsonlWriter` shares:
    the writer, its path, what it recovered on open and what it still holds after a
    failed write. Subclasses write their lines in ``_write_lines``.

    **Rebuilding a file.** A resumed run writes its record files again, whole, into new
    files beside them; :meth:`replace_when_complete` puts such a file in the old one's
    place once it holds at least as many lines as the old one, flushed and fsynced
    (checked after every write and flush), or at :meth:`close` — so a process killed
    at any moment leaves the old file or a new one that holds at least as much, never
    less.
    """

    def __init__(self, path: StrPath, *, append: bool = True, fsync: bool = False) -> None:
        self._writer = JsonlWriter(path, append=append, fsync=fsync)
        self.name = f"{type(self).__name__}({str(self._writer.path)!r})"
        # (the file to replace, the lines it holds); set by another thread, read here
        self._replacing: tuple[Path, int] | None = None
        #: lines the file held before this backend wrote any (a resume's copied head)
        self.held_before = 0
        self._replace_error: str | None = None

    @property
    def path(self) -> str:
        return str(self._writer.path)

    @property
    def writer(self) -> JsonlWriter:
        return self._writer

    @property
    def held_lines(self) -> int:
        """The lines its file holds: those it held before this backend wrote (a copied
        head) and those it wrote."""
        return self.held_before + self._writer.lines_written

    @property
    def recovery(self) -> TornLineRecovery | None:
        return self._writer.recovery

    @property
    def unwritten(self) -> int:
        """Lines kept in memory after a failed write (retried by ``write``/``flush``)."""
        return self._writer.unwritten_records

    def write(self, records: Sequence[MetricRecord]) -> None:
        self._write_lines(records)
        self._replace_if_complete(at_close=False)

    def _write_lines(self, records: Sequence[MetricRecord]) -> None:
        raise NotImplementedError  # pragma: no cover - subclasses write their lines

    def flush(self) -> None:
        self._writer.flush()
        self._replace_if_complete(at_close=False)

    def close(self) -> None:
        self._writer.close()
        self._replace_if_complete(at_close=True)

    def replace_when_complete(self, target: StrPath, lines: int) -> None:
        """Put this backend's file in ``target``'s place (which holds ``lines`` lines)
        once it holds at least as many (:attr:`held_lines`), every one of them fsynced;
        at the latest when it is closed (it is then complete: the run wrote it whole).
        Safe to call from another thread than the writing one."""
        self._replacing = (Path(target), lines)

    @property
    def destination(self) -> str:
        """The file this backend's records end up in: its own, or, while a replacement
        is pending, the one it is to replace."""
        pending = self._replacing
        return str(pending[0] if pending is not None else self._writer.path)

    def _replace_if_complete(self, *, at_close: bool) -> None:
        pending = self._replacing
        if pending is None:
            return
        target, lines = pending
        held = self.held_lines
        if held < lines and not at_close:
            return
        if held < lines:
            logger.warning(
                "%s: the rebuilt file holds %d line(s), the one it replaces %d (lines "
                "whose events never reached the event log): the rebuild, complete, takes "
                "its place",
                target,
                held,
                lines,
            )
        try:
            self._writer.sync()
            os.replace(self._writer.path, target)
        except OSError as exc:
            self._replace_failed(target, exc, at_close)
            return
        self._writer.path = target
        self.name = f"{type(self).__name__}({str(target)!r})"
        self._replacing = None
        sync_dir(target.parent)  # (a WriteError: the rename may not survive a crash)

    def _replace_failed(self, target: Path, exc: OSError, at_close: bool) -> None:
        """Log the first failure to put the rebuilt file in place; at close, raise it:
        the run's file then lacks the new segment (the log has it: a replay rebuilds)."""
        if self._replace_error is None or at_close:
            self._replace_error = str(exc)
            logger.error(
                "cannot put the rebuilt %s in place of %s (%s): the previous file is kept%s",
                self._writer.path,
                target,
                exc,
                "" if at_close else "; tried again at the next write, and at close",
            )
        if at_close:
            raise WriteError(
                exc.errno,
                f"cannot put the rebuilt {str(self._writer.path)!r} in place of {str(target)!r} "
                f"({exc.strerror or exc}): {target.name} lacks this segment's records; "
                f"replay the run's events.jsonl to rebuild it",
            ) from exc

    def __repr__(self) -> str:
        return self.name


class JsonlBackend(JsonlFileBackend):
    """Writes each record as one JSON line (``metrics_raw.jsonl``) via :class:`JsonlWriter`.

    Only stamped records (an int ``seq``, as :class:`MetricsReporter` hands them over)
    are written: the file never holds a null ``seq``.
    """

    def _write_lines(self, records: Sequence[MetricRecord]) -> None:
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
