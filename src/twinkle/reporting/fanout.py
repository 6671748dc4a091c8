"""``BackendFanout``: hands every batch of records to every backend, one at a time.

Failure policy: a backend that raises is logged (logger ``twinkle.reporting``) with its
name, counted (:attr:`BackendFanout.failures`) and skipped for that call; the other
backends still get every record. A :class:`~twinkle.errors.WriteError` (disk full,
permissions) also sets :attr:`BackendFanout.fault` until the lines that backend keeps in
memory are written: the reporter raises it to its caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from twinkle.errors import InvalidArgumentError, WriteError
from twinkle.reporting.backends import Backend, SeqSource
from twinkle.reporting.jsonl import TornLineRecovery
from twinkle.reporting.record import MetricRecord

__all__ = ["BackendFanout"]

logger = logging.getLogger("twinkle.reporting")


class BackendFanout:
    """The backends of one run, called one at a time under one lock, in batch order.

    ``run_id`` names the run in logs. Backends are validated here: each needs
    ``write(records)``, ``flush()`` and ``close()``. Torn last lines the backends repaired
    on open are logged and kept in :attr:`recoveries`.
    """

    def __init__(self, backends: Sequence[Backend], *, run_id: str) -> None:
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
        self.run_id = run_id
        self.backends: tuple[Backend, ...] = tuple(backends)
        self.names = _unique_names(self.backends)
        self._failures = [0] * len(self.backends)
        self._lock = threading.Lock()
        #: why records stay in a backend's memory (a disk fault), None while none do
        self.fault: str | None = None
        self.recoveries: tuple[TornLineRecovery, ...] = tuple(
            r
            for b in self.backends
            if isinstance(r := getattr(b, "recovery", None), TornLineRecovery)
        )
        for r in self.recoveries:
            logger.warning(
                "run %r: %s: %s (%d byte(s) from offset %d moved to %s)",
                run_id,
                r.path,
                r.reason,
                r.torn_bytes,
                r.offset,
                r.sidecar,
            )

    def last_seq(self, run_id: str) -> int | None:
        """The highest last ``seq`` of ``run_id`` any backend can tell, or None."""
        last = [
            s
            for b in self.backends
            if isinstance(b, SeqSource) and (s := b.last_seq(run_id)) is not None
        ]
        return max(last) if last else None

    def write(self, batch: Sequence[MetricRecord]) -> None:
        """Hand ``batch`` to every backend; note a disk fault (never raises an Exception)."""
        with self._lock:
            fault: list[str] | None = None
            for i, backend in enumerate(self.backends):
                try:
                    backend.write(batch)
                except Exception as exc:
                    self._failed(i, "write", len(batch), exc)
                    if isinstance(exc, WriteError):
                        fault = fault or []
                        fault.append(f"{self.names[i]} cannot write ({exc.strerror or exc})")
            if fault is None and self.fault is not None and self.unwritten():
                return  # no new failure, but a backend still keeps lines back
            self.fault = None if fault is None else "; ".join(fault)

    def flush(self) -> None:
        """Flush every backend; clears :attr:`fault` once no backend keeps lines back."""
        with self._lock:
            self._flush_each()
            if self.fault is not None and not self.unwritten():
                self.fault = None

    def _flush_each(self) -> None:
        """Flush every backend, counting the ones that raise (lock held)."""
        for i, backend in enumerate(self.backends):
            try:
                backend.flush()
            except Exception as exc:
                self._failed(i, "flush", 0, exc)

    def close(self) -> list[str]:
        """Flush and close every backend; what was lost, one line per backend."""
        lost: list[str] = []
        with self._lock:
            self._flush_each()
            for i, backend in enumerate(self.backends):
                unwritten = _unwritten(backend)
                try:
                    backend.close()
                except Exception as exc:
                    self._failed(i, "close", 0, exc)
                    if isinstance(exc, WriteError) or unwritten:
                        lost.append(f"{self.names[i]}: {unwritten} record(s) ({exc})")
        return lost

    def unwritten(self) -> int:
        """Records the backends keep in memory after write errors."""
        return sum(_unwritten(b) for b in self.backends)

    def raise_if_unwritten(self, doing: str) -> None:
        pending = [(self.names[i], n) for i, b in enumerate(self.backends) if (n := _unwritten(b))]
        if pending:
            detail = ", ".join(f"{name}: {n}" for name, n in pending)
            raise WriteError(
                f"{doing}: records of run {self.run_id!r} are not written yet ({detail}); "
                "they are kept in memory: fix the fault (disk space, permissions) and "
                "call flush() again",
            )

    @property
    def failures(self) -> dict[str, int]:
        """Failed backend calls (write/flush/close) by backend name."""
        return dict(zip(self.names, self._failures, strict=True))

    def _failed(self, i: int, call: str, n: int, exc: Exception) -> None:
        self._failures[i] += 1
        count = self._failures[i]
        if count & (count - 1):  # log the 1st, 2nd, 4th, 8th... failure
            return
        what = f"{call}({n} record(s))" if call == "write" else f"{call}()"
        logger.error(
            "run %r: backend %s failed in %s, skipped (%d failure(s) so far): %s",
            self.run_id,
            self.names[i],
            what,
            count,
            exc,
            exc_info=exc if count == 1 else None,
        )


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
