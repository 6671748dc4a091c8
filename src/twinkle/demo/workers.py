"""What the demo's workers in other processes (Ray actors, ``torch.distributed`` ranks)
report, handed to the run."""

from __future__ import annotations

import msgspec

from twinkle.perf import MemoryReading, WorkerReport
from twinkle.run import RunSession

__all__ = ["ReportStash"]


class ReportStash:
    """Hands each worker report's spans to the run at once, and keeps its memory
    readings for the iteration's memory event: so that every worker's reading of an
    iteration (the run process's too, ``RunSession.read_memory(others=)``) goes out in
    one event, one reduction."""

    def __init__(self, run: RunSession) -> None:
        self.run = run
        self.readings: dict[int, list[MemoryReading]] = {}

    def receive(self, report: WorkerReport, iteration: int) -> None:
        self.readings.setdefault(iteration, []).extend(report.readings)
        self.run.receive(msgspec.structs.replace(report, readings=()), iteration=iteration)

    def pop(self, iteration: int) -> list[MemoryReading]:
        """The readings the reports of ``iteration`` carried (then forgotten)."""
        return self.readings.pop(iteration, [])
