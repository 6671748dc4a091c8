"""BackendFanout: every backend gets every batch; a failing one is logged with its name,
counted and skipped; a disk fault is noted until the kept lines are written."""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence

import pytest

from twinkle.errors import InvalidArgumentError, WriteError
from twinkle.reporting import BackendFanout, MetricRecord, make_record, with_seq

RUN = "fan"


def rec(i: int) -> MetricRecord:
    return with_seq(
        make_record(
            kind="train",
            scope="iteration",
            run_id=RUN,
            step=i,
            iteration=i,
            wall_ns=i,
            monotonic_ns=i,
            values={"i": i},
        ),
        i,
    )


class Keep:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seqs: list[int | None] = []
        self.unwritten = 0

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.seqs.extend(r.seq for r in records)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Explodes(Keep):
    def write(self, records: Sequence[MetricRecord]) -> None:
        raise RuntimeError("boom")


class Full(Keep):
    """Keeps what it cannot write, like a JsonlBackend on a full disk."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.full = True

    def write(self, records: Sequence[MetricRecord]) -> None:
        if self.full:
            self.unwritten += len(records)
            raise WriteError(errno.ENOSPC, "No space left on device")
        super().write(records)

    def flush(self) -> None:
        if not self.full:
            self.unwritten = 0


def test_a_failing_backend_is_counted_by_name_and_the_others_get_every_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good, bad = Keep("good"), Explodes("bad")
    caplog.set_level(logging.ERROR, logger="twinkle.reporting")
    fan = BackendFanout([bad, good], run_id=RUN)
    for i in range(3):
        fan.write([rec(i)])
    assert good.seqs == [0, 1, 2]
    assert fan.failures == {"bad": 3, "good": 0}
    assert fan.fault is None  # not a disk fault
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2  # the 1st and 2nd failure (then the 4th, 8th, ...)
    assert "backend bad failed in write(1 record(s)), skipped" in logged[0]


def test_a_disk_fault_is_noted_until_the_kept_lines_are_written() -> None:
    full = Full("disk")
    fan = BackendFanout([full, Keep("other")], run_id=RUN)
    fan.write([rec(0)])
    assert fan.fault is not None and "disk cannot write (No space left on device)" in fan.fault
    with pytest.raises(WriteError, match=r"not written yet \(disk: 1\)"):
        fan.raise_if_unwritten("flush")
    full.full = False
    fan.flush()
    assert fan.fault is None
    fan.raise_if_unwritten("flush")


def test_backends_with_one_name_are_told_apart() -> None:
    fan = BackendFanout([Keep("x"), Keep("x")], run_id=RUN)
    assert fan.names == ("x", "x#1")


def test_a_backend_without_the_three_methods_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"backends\[1\] = .* lacks \['flush'"):
        BackendFanout([Keep("a"), type("Half", (), {"write": lambda s, r: None})()], run_id=RUN)
