"""The records a resumed run's checkpoint stands for, read back from its
``metrics_raw.jsonl`` for a plugin's backend (docs/metrics.md, "Resuming from a
checkpoint"): the observers do not make them again (they are fed only the log's tail),
and the backend must still get every record of the run, in order, as a resume that
fed the whole log would have handed it. Read on the backend's own thread, a batch at
a time, so that neither the run nor memory waits on the run's length."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Final, final

import orjson

from twinkle.errors import RecordError
from twinkle.reporting.record import MetricRecord, record_from_dict

__all__ = ["History", "say_unread"]

logger = logging.getLogger("twinkle.reporting")

#: records per ``write()`` call
BATCH: Final = 1024
#: bytes read at a time
_BLOCK: Final = 1 << 20


@final
class History:
    """The first ``size`` bytes (``lines`` records) of the record file at ``path``,
    opened now: the file may be renamed into place while the records are read."""

    __slots__ = ("_file", "lines", "path", "size")

    def __init__(self, path: Path, size: int, lines: int) -> None:
        self.path, self.size, self.lines = path, size, lines
        self._file = path.open("rb")

    def batches(self) -> Iterator[tuple[MetricRecord, ...]]:
        """The records, in file order, :data:`BATCH` at a time; raises
        :class:`~twinkle.errors.RecordError` before the first when the lines differ from
        :attr:`lines` (the file changed since the checkpoint: nothing of it is handed
        out), and at a line that is not a record (the ones before it were)."""
        counted, last = 0, b"\n"
        for block in self._blocks():
            counted += block.count(b"\n")
            last = block[-1:]
        if last != b"\n":
            raise RecordError(f"{self.path}: its first {self.size} bytes end inside a line")
        if counted != self.lines:
            raise RecordError(
                f"{self.path}: its first {self.size} bytes hold {counted} record(s), not the "
                f"{self.lines} the checkpoint counted: the file changed since"
            )
        self._file.seek(0)
        batch: list[MetricRecord] = []
        for count, line in enumerate(self._lines(), 1):
            try:
                batch.append(record_from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, RecordError) as exc:
                raise RecordError(
                    f"{self.path}: record {count} cannot be read back: {exc}"
                ) from exc
            if len(batch) == BATCH:
                yield tuple(batch)
                batch = []
        if batch:
            yield tuple(batch)

    def _blocks(self) -> Iterator[bytes]:
        left = self.size
        while left > 0:
            block = self._file.read(min(_BLOCK, left))
            if not block:
                raise RecordError(f"{self.path} holds fewer than {self.size} bytes")
            left -= len(block)
            yield block

    def _lines(self) -> Iterator[bytes]:
        rest = b""
        for block in self._blocks():
            *whole, rest = (rest + block).split(b"\n")
            yield from whole

    def close(self) -> None:
        self._file.close()


def say_unread(backend: str, records: int, exc: Exception) -> None:
    """Log that ``records`` of a resumed run's history could not be read back for the
    backend named ``backend``: they are lost to it (no call of its failed; its health
    counts them under ``records_lost``), and the run's own files have them."""
    logger.error(
        "backend %r lacks %d record(s) of the resumed run's history, which could not be "
        "read back (the run's own files have them): %s",
        backend,
        records,
        exc,
    )
