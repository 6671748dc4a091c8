"""``BackendFanout``: hands every batch of records to every backend, one at a time.

Failure policy: a backend that raises is logged (logger ``twinkle.reporting``) with its
name, counted (:attr:`BackendFanout.failures`) and skipped for that call; the other
backends still get every record. A :class:`~twinkle.errors.WriteError` (disk full,
permissions) also sets :attr:`BackendFanout.fault` until the lines that backend keeps in
memory are written: the reporter raises it to its caller.

An :class:`~twinkle.reporting.IsolatedBackend` (a plugin's) never raises and never
waits here: it queues for a thread of its own, and counts its own failures (in
:attr:`BackendFanout.failures` and :meth:`BackendFanout.health` too). Closing begins
every isolated backend's close first, so that they finish side by side, each within
its bound, while the others close.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from twinkle.errors import InvalidArgumentError, WriteError
from twinkle.reporting._health import BackendHealth
from twinkle.reporting._jsonl_torn import TornLineRecovery
from twinkle.reporting.backends import Backend, SeqSource
from twinkle.reporting.isolated import IsolatedBackend
from twinkle.reporting.record import MetricRecord

__all__ = ["BackendFanout"]

logger = logging.getLogger("twinkle.reporting")


class BackendFanout:
    """The backends of one run, called one at a time under one lock, in batch order.

    ``run_id`` names the run in logs. Backends are validated here: each needs
    ``write(records)``, ``flush()`` and ``close()``. ``names`` names them in logs, stats
    and health (default: each backend's ``name``, else its class; repeats get ``#i``).
    Torn last lines the backends repaired on open are logged and kept in
    :attr:`recoveries`.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        *,
        run_id: str,
        names: Sequence[str] | None = None,
    ) -> None:
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
        if names is not None and (
            isinstance(names, str)
            or len(names) != len(self.backends)
            or len(set(names)) != len(names)
        ):
            raise InvalidArgumentError(
                f"names must name each of the {len(self.backends)} backend(s) once, got {names!r}"
            )
        self.names = _unique_names(self.backends) if names is None else tuple(names)
        self._failures = [0] * len(self.backends)
        self._records = [0] * len(self.backends)  # handed to each (not isolated) backend
        self._records_failed = [0] * len(self.backends)
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
                self._records[i] += len(batch)
                try:
                    backend.write(batch)
                except Exception as exc:
                    if not isinstance(exc, WriteError):  # (a disk fault keeps the lines)
                        self._records_failed[i] += len(batch)
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
            for backend in self.backends:
                if isinstance(backend, IsolatedBackend):
                    backend.begin_close()
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

    def close_isolated(self) -> None:
        """Close the isolated backends (each within its bound, side by side): what a run
        does before it says what its backends did (:meth:`health`)."""
        isolated = [b for b in self.backends if isinstance(b, IsolatedBackend)]
        for backend in isolated:
            backend.begin_close()
        for backend in isolated:
            backend.close()

    def cut_off_isolated(self, why: str) -> None:
        """Give up on the isolated backends not closed yet (see :meth:`close_isolated`)."""
        for backend in self.backends:
            if isinstance(backend, IsolatedBackend):
                backend.cut_off(why)

    def health(self) -> dict[str, BackendHealth]:
        """What each backend did with its records so far, by name."""
        return {name: self._health(i, name) for i, name in enumerate(self.names)}

    def _health(self, i: int, name: str) -> BackendHealth:
        backend = self.backends[i]
        if isinstance(backend, IsolatedBackend):
            return backend.health()
        failed = self._records_failed[i]
        kept = _unwritten(backend)  # lines a disk fault keeps in memory
        written = max(0, self._records[i] - failed - kept)
        return BackendHealth(
            backend=_own_name(backend),
            isolated=False,
            records=self._records[i],
            records_written=written,
            records_failed=failed,
            records_lost=self._records[i] - written - failed,
            calls_failed=self._failures[i],
        )

    @property
    def failures(self) -> dict[str, int]:
        """Failed backend calls (write/flush/close) by backend name (an isolated
        backend's counted by itself)."""
        return {
            name: b.health().calls_failed if isinstance(b, IsolatedBackend) else n
            for name, b, n in zip(self.names, self.backends, self._failures, strict=True)
        }

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
            # (a disk fault's message says it all: no traceback)
            exc_info=exc if count == 1 and not isinstance(exc, WriteError) else None,
        )


def _own_name(backend: object) -> str:
    """A backend of the run's own files by its class and file name (where the run
    directory is, is not the backend's business)."""
    path = getattr(backend, "destination", getattr(backend, "path", None))
    name = type(backend).__name__
    return f"{name}({os.path.basename(path)})" if isinstance(path, str) else name


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
