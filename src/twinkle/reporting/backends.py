"""Backends: where records go. The :class:`Backend` protocol and the JSONL backends.

Every backend writing a JSONL file holds one :class:`~twinkle.reporting.JsonlWriter`
(:class:`JsonlFileBackend`); :class:`JsonlBackend` writes each record as one line of
``metrics_raw.jsonl``, and :class:`~twinkle.reporting.WebUIFlatBackend` the flat WebUI
lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from twinkle.errors import RecordError
from twinkle.reporting._jsonl_files import StrPath
from twinkle.reporting.jsonl import JsonlWriter, TornLineRecovery
from twinkle.reporting.record import MetricRecord, record_fields

__all__ = ["Backend", "JsonlBackend", "JsonlFileBackend", "SeqSource"]


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
class SeqSource(Protocol):
    """A backend that can say the last ``seq`` of a run it holds (to continue after it)."""

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
    """Writes each record as one JSON line (``metrics_raw.jsonl``) via :class:`JsonlWriter`.

    Only stamped records (an int ``seq``, as :class:`MetricsReporter` hands them over)
    are written: the file never holds a null ``seq``.
    """

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
