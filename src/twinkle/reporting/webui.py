"""``WebUIFlatBackend``: ``metrics.jsonl``, one flat numeric JSON object per iteration.

Line format (keys in this order)::

    {"ts": <unix seconds, float>, "step": <int>, "total_steps": <int>,
     "iteration": <int>, "<kind>/<key>": <number>, ...}          # metric keys sorted

* Only records of scope ``iteration`` go here, merged per iteration: every record of one
  iteration (several kinds) goes into one line; for a key reported twice for an
  iteration the later record wins. ``step`` is the highest optimizer step among them
  (the steps taken by the iteration's end), ``ts`` the latest ``wall_ns``. Window and
  run records (``scope`` ``window``/``run``) are in ``metrics_raw.jsonl`` and the summary,
  never in this file, so they cannot overwrite an iteration's values.
* An iteration's records arrive over a few boundaries (its memory and caller figures
  during it, its timing and throughput when it is finalised, ``hold - 1`` boundaries
  later), so the newest ``hold`` iterations stay open: a line is written once a record
  of an iteration ``hold`` or more later arrives, and at ``flush()``/``close()``, in
  iteration order. A record for an iteration whose line was already written starts a
  second line for it; a line is never rewritten.
* The line of an iteration cut short before its optimizer step (a crashed or failed
  segment's last: :func:`~twinkle.reporting.cut_short`) also has ``"cut_short": 1``
  (sorted among the metric keys): it sits at the step of the iteration before it,
  with figures of part of an iteration, which a chart by step leaves out.
* The file is numeric-only, so ``None`` values (non-finite numbers) are left out here;
  ``metrics_raw.jsonl`` keeps them, named in ``attrs["nonfinite"]``. ``attrs`` are not
  part of the flat format.
* The file is written through :class:`JsonlWriter` (append mode, torn-line repair).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.reporting._jsonl_files import StrPath
from twinkle.reporting.backends import JsonlFileBackend
from twinkle.reporting.record import MetricRecord, cut_short

__all__ = ["CUT_SHORT_KEY", "WebUIFlatBackend"]

#: the key that marks the line of an iteration cut short (no ``/``: no record's key)
CUT_SHORT_KEY = "cut_short"


class WebUIFlatBackend(JsonlFileBackend):
    """Backend writing the WebUI flat format (see the module docstring). Not thread-safe:
    :class:`MetricsReporter` calls it from one thread at a time.

    ``hold``: how many of the newest iterations stay open for more records (>= 1; the
    run session passes ``finalise_lag + 2``).
    """

    def __init__(
        self,
        path: StrPath,
        *,
        total_steps: int,
        hold: int = 1,
        append: bool = True,
        fsync: bool = False,
    ) -> None:
        if type(total_steps) is not int or total_steps < 0:
            raise InvalidArgumentError(
                f"total_steps must be an int >= 0 (the planned optimizer steps), "
                f"got {total_steps!r}"
            )
        if type(hold) is not int or hold < 1:
            raise InvalidArgumentError(
                f"hold must be an int >= 1 (iterations kept open for more records), got {hold!r}"
            )
        self.total_steps = total_steps
        self.hold = hold
        super().__init__(path, append=append, fsync=fsync)
        # iteration -> (step, wall_ns, metrics), the open lines
        self._open: dict[int, tuple[int, int, dict[str, int | float]]] = {}
        self._newest: int | None = None

    def open_lines(self) -> dict[str, Any]:
        """The lines held open (the newest iterations'), for a checkpoint."""
        return {"open": {it: (step, wall, dict(m)) for it, (step, wall, m) in self._open.items()},
                "newest": self._newest}  # fmt: skip

    def reopen_lines(self, state: dict[str, Any]) -> None:
        """Hold open the lines :meth:`open_lines` gave (a resume from a checkpoint)."""
        self._open = dict(state["open"])
        self._newest = state["newest"]

    def _write_lines(self, records: Sequence[MetricRecord]) -> None:
        for record in records:
            if record.scope != "iteration":
                continue
            it = record.iteration
            step, wall_ns, metrics = self._open.get(it) or (record.step, 0, {})
            prefix = record.kind + "/"
            for key, value in record.values.items():
                if value is not None:
                    metrics[prefix + key] = value
            if cut_short(record):
                metrics[CUT_SHORT_KEY] = 1
            self._open[it] = (max(step, record.step), max(wall_ns, record.wall_ns), metrics)
            if self._newest is None or it > self._newest:
                self._newest = it
        if self._newest is not None:
            self._write_through(self._newest - self.hold)

    def _write_through(self, last: int | None) -> None:
        """Write the open lines of iterations ``<= last`` (all when None), in order."""
        done = sorted(it for it in self._open if last is None or it <= last)
        if done:
            self._writer.write([self._line(it, *self._open.pop(it)) for it in done])

    def flush(self) -> None:
        self._write_through(None)
        super().flush()

    def close(self) -> None:
        try:
            self._write_through(None)
        finally:
            super().close()

    def _line(
        self, iteration: int, step: int, wall_ns: int, metrics: dict[str, int | float]
    ) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": wall_ns / 1e9,
            "step": step,
            "total_steps": self.total_steps,
            "iteration": iteration,
        }
        for key in sorted(metrics):
            line[key] = metrics[key]
        return line
