"""``WebUIFlatBackend``: ``metrics.jsonl``, one flat numeric JSON object per step.

Line format (keys in this order)::

    {"ts": <unix seconds, float>, "step": <int>, "total_steps": <int>,
     "<kind>/<key>": <number>, ...}          # metric keys sorted

* Records are merged per step: every record of one step (several kinds, or several
  records of one kind) goes into one line; for a key reported twice in a step the later
  record wins. ``ts`` is the latest ``wall_ns`` among them.
* A step's line is written when a record of another step arrives, or at
  ``flush()``/``close()`` (records of that step arriving after a flush start a new line).
* The file is numeric-only, so ``None`` values (non-finite numbers) are left out here;
  ``metrics_raw.jsonl`` keeps them, named in ``attrs["nonfinite"]``. ``attrs`` are not
  part of the flat format.
* The file is written through :class:`JsonlWriter` (append mode, torn-line repair).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.metric.reporting.jsonl import StrPath
from twinkle.metric.reporting.record import MetricRecord
from twinkle.metric.reporting.reporter import JsonlFileBackend

__all__ = ["WebUIFlatBackend"]


class WebUIFlatBackend(JsonlFileBackend):
    """Backend writing the WebUI flat format (see the module docstring). Not thread-safe:
    :class:`MetricsReporter` calls it from one thread at a time."""

    def __init__(
        self,
        path: StrPath,
        *,
        total_steps: int,
        append: bool = True,
        fsync: bool = False,
    ) -> None:
        if type(total_steps) is not int or total_steps < 0:
            raise InvalidArgumentError(
                f"total_steps must be an int >= 0 (the planned optimizer steps), "
                f"got {total_steps!r}"
            )
        self.total_steps = total_steps
        super().__init__(path, append=append, fsync=fsync)
        self._step: int | None = None
        self._wall_ns = 0
        self._metrics: dict[str, int | float] = {}

    def write(self, records: Sequence[MetricRecord]) -> None:
        lines: list[dict[str, Any]] = []
        for record in records:
            if record.step != self._step:
                if self._step is not None:
                    lines.append(self._take_line())
                self._step = record.step
            self._wall_ns = max(self._wall_ns, record.wall_ns)
            prefix = record.kind + "/"
            metrics = self._metrics
            for key, value in record.values.items():
                if value is not None:
                    metrics[prefix + key] = value
        if lines:
            self._writer.write(lines)

    def flush(self) -> None:
        if self._step is not None:
            self._writer.write([self._take_line()])
        self._writer.flush()

    def close(self) -> None:
        try:
            if self._step is not None:
                self._writer.write([self._take_line()])
        finally:
            self._writer.close()

    def _take_line(self) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": self._wall_ns / 1e9,
            "step": self._step,
            "total_steps": self.total_steps,
        }
        metrics = self._metrics
        for key in sorted(metrics):
            line[key] = metrics[key]
        self._step = None
        self._wall_ns = 0
        self._metrics = {}
        return line
