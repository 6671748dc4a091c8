"""Disk faults: a full device or a path that stops being writable.

The caller hears of the fault within one call (a background reporter: at its next
``report()``/``flush()``), no record is lost while the process lives (the unwritten
lines stay in memory, in order) and everything goes out once the fault is gone. As root
``chmod`` does not stop writes, so the faults come from ``/dev/full``, a tiny tmpfs, or
the ``_os_write`` indirection of the JSONL writer.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import twinkle.reporting.jsonl as jsonl_mod
from twinkle.errors import WriteError
from twinkle.observers import EventLogSink
from twinkle.perf import ManualClock
from twinkle.plugins import REPORTER_FAILURES
from twinkle.reporting import (
    JsonlBackend,
    JsonlWriter,
    MetricRecord,
    MetricsReporter,
    make_record,
)
from twinkle.run import RunSession, replay

RUN = "faulty"


def rec(i: int) -> MetricRecord:
    return make_record(
        kind="train",
        scope="iteration",
        run_id=RUN,
        step=i,
        iteration=i,
        wall_ns=i,
        monotonic_ns=i,
        values={"i": i},
    )


def seqs(path: Path) -> list[int]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(line)["seq"] for line in data.splitlines()]


class Faults:
    """Makes writes to chosen files fail with ``errno`` while ``on`` (an injector on
    the JSONL writer's ``_os_write``); ``short`` first writes part of the data."""

    def __init__(self) -> None:
        self.on = False
        self.errno = errno.ENOSPC
        self.short = False
        self.under: Path | None = None
        self.failed = 0
        self._real = os.write

    def __call__(self, fd: int, data: Any) -> int:
        if self.on and self._hit(fd):
            self.failed += 1
            if self.short and len(data) > 1:
                self.short = False
                return self._real(fd, bytes(data[: len(data) // 3]))
            raise OSError(self.errno, os.strerror(self.errno))
        return self._real(fd, data)

    def _hit(self, fd: int) -> bool:
        if self.under is None:
            return True
        try:
            return Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(self.under)
        except OSError:
            return False


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    injector = Faults()
    monkeypatch.setattr(jsonl_mod, "_os_write", injector)
    return injector


def _dev_full_writable() -> bool:
    try:
        os.close(os.open("/dev/full", os.O_WRONLY))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _dev_full_writable(), reason="/dev/full is not writable here")
def test_full_device_raises_in_the_same_call_and_names_the_path() -> None:
    with pytest.raises(WriteError, match=r"'/dev/full'.*No space left.*kept in memory") as info:
        JsonlWriter("/dev/full").write([{"a": 1}])
    assert info.value.errno == errno.ENOSPC
    reporter = MetricsReporter([JsonlBackend("/dev/full")], run_id=RUN)
    with pytest.raises(WriteError, match=r"seq=0 .*accepted.*/dev/full.*cannot write") as info:
        reporter.report(rec(0))
    assert info.value.record is not None and info.value.record.seq == 0
    with pytest.raises(WriteError, match=r"seq=1 "):
        reporter.report(rec(1))
    assert reporter.stats.unwritten == 2
    with pytest.raises(WriteError, match=r"lost unwritten records.*/dev/full.*: 2 record"):
        reporter.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EIO, errno.EROFS, errno.EDQUOT])
@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_write_fault_raises_at_the_next_call_and_nothing_is_lost_once_it_passes(
    tmp_path: Path, faults: Faults, code: int, background: bool
) -> None:
    path = tmp_path / "raw.jsonl"
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    for i in range(5):
        reporter.report(rec(i))
    reporter.flush()
    faults.on, faults.errno, faults.short = True, code, True
    accepted = []
    raised = 0
    for i in range(5, 12):
        try:
            accepted.append(reporter.report(rec(i)).seq)
        except WriteError as exc:
            raised += 1
            assert exc.record is not None
            accepted.append(exc.record.seq)
            assert os.strerror(code) in str(exc) and "then call flush()" in str(exc)
    if not background:
        assert raised == 7  # the very call that met the fault
    with pytest.raises(WriteError, match=r"not written yet .*raw\.jsonl.*call flush\(\) again"):
        reporter.flush()
    with pytest.raises(WriteError, match="was accepted"):  # background: the next call
        accepted.append(reporter.report(rec(12)).seq)
    accepted.append(12)
    assert accepted == list(range(5, 13))
    assert reporter.stats.unwritten > 0
    faults.on = False
    reporter.flush()  # the fault is gone: everything kept goes out, once, in order
    assert reporter.stats.unwritten == 0
    assert reporter.report(rec(13)).seq == 13  # and report() stops raising
    reporter.close()
    assert seqs(path) == list(range(14))


def test_caller_of_a_background_reporter_is_never_blocked_by_a_dead_disk(
    tmp_path: Path, faults: Faults
) -> None:
    path = tmp_path / "raw.jsonl"
    faults.on = True
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=True)
    for i in range(2000):
        try:
            reporter.report(rec(i))  # never waits for the disk: raises once it is known
        except WriteError as exc:
            assert exc.record is not None and exc.record.seq == i
    with pytest.raises(WriteError):
        reporter.flush()
    with pytest.raises(WriteError, match=r"seq=2000 .*was accepted"):
        reporter.report(rec(2000))
    assert reporter.stats.unwritten in (2000, 2001)  # every record accepted and kept
    faults.on = False
    reporter.close()
    assert seqs(path) == list(range(2001))


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a real device that fills up (skipped where mount is not allowed)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=10)


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_device_that_fills_up_then_frees_space_loses_nothing(
    tiny_fs: Path, background: bool, figures: Any
) -> None:
    path = tiny_fs / "raw.jsonl"
    filler = tiny_fs / "filler"
    filler.write_bytes(b"f" * (160 << 10))
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    n = 0
    raised = 0
    while raised < 3 and n < 100_000:  # until the device is full and the caller was told
        try:
            reporter.report(rec(n))
        except WriteError as exc:
            raised += 1
            assert "No space left on device" in str(exc)
        n += 1
        if background and n % 200 == 0:
            try:
                reporter.flush()
            except WriteError:
                raised += 1
    assert raised >= 3
    unwritten = reporter.stats.unwritten
    assert unwritten > 0
    filler.unlink()  # space again
    reporter.flush()
    reporter.close()
    assert seqs(path) == list(range(n))  # the line cut by the full device was completed
    figures(records_written=n, kept_in_memory_while_full=unwritten, lost=0)


# -- a whole run under a disk fault ----------------------------------------------------------


def _let_the_event_log_meet_the_fault(run: RunSession) -> None:
    """The publisher never waits for the event-log writer thread, which writes when it
    gets to it: wait (in real time, bounded) until it tried to write every batch handed
    over, so that the fault is met before it passes. Its error is raised at the next
    hand-over, the boundary after."""
    sink = run.pm.get_plugin("events")
    assert isinstance(sink, EventLogSink)
    stats = sink.stats
    assert stats is not None
    deadline = time.monotonic() + 30
    while stats.delivered < stats.accepted and time.monotonic() < deadline:
        time.sleep(0.001)
        stats = sink.stats
        assert stats is not None
    assert stats.delivered == stats.accepted, stats


def faulty_run(
    out: Path, faults: Faults, *, heal_at: int | None, background: bool = True
) -> RunSession:
    clock = ManualClock(10**9)
    run = RunSession(
        out_dir=out,
        run_id="disk",
        config={"phases": {"train": ["train.*"]}, "total_steps": 8},
        autoload=False,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
        background_writer=background,
    )
    faults.under = out / "disk"
    with run:
        for i in range(8):
            if i == 2:
                faults.on = True  # the disk fills up during iteration 2
            if i == heal_at:
                # The event log has its writer thread whatever ``background`` says (that
                # is the records' writer): without this wait it may not have written
                # while the fault lasted, and the sync case flaked (seen once under CI).
                _let_the_event_log_meet_the_fault(run)
                faults.on = False
            run.bus.iteration_started(i)  # never raises into the training loop
            with run.recorder.span("train.step", iteration=i):
                clock.advance(1_000_000)
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=4)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 1.0 / (i + 1)})
    return run


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_run_survives_a_passing_disk_fault_and_its_files_are_complete(
    tmp_path: Path, faults: Faults, background: bool
) -> None:
    run = faulty_run(tmp_path / "live", faults, heal_at=5, background=background)
    assert faults.failed > 0
    summary = json.loads((tmp_path / "live" / "disk" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["observer_failures"]["events"] > 0  # counted, not fatal
    if not background:  # a background writer may meet and outlive the fault unseen
        assert summary["observer_failures"][REPORTER_FAILURES] > 0
    # Nothing lost and nothing doubled: the log replays to the very same records.
    again = replay(tmp_path / "live" / "disk" / "events.jsonl", tmp_path / "again", autoload=False)
    assert again.events == run.dispatcher.events  # type: ignore[union-attr]
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        live = (tmp_path / "live" / "disk" / name).read_bytes()
        assert live == (tmp_path / "again" / name).read_bytes(), name
    records = (tmp_path / "live" / "disk" / "metrics_raw.jsonl").read_bytes().splitlines()
    assert [json.loads(r)["seq"] for r in records] == list(range(len(records)))


def test_fault_that_outlasts_the_run_is_reported_at_finish_naming_what_was_lost(
    tmp_path: Path, faults: Faults
) -> None:
    with pytest.raises(WriteError, match=r"lost .*unwritten"):
        faulty_run(tmp_path / "live", faults, heal_at=None, background=False)
    summary = json.loads((tmp_path / "live" / "disk" / "summary.json").read_text())
    assert summary["observer_failures"][REPORTER_FAILURES] > 0
    # The log is the run: its lost lines are named first, with the seq they begin at,
    # which is where the log on disk ends.
    log = tmp_path / "live" / "disk" / "events.jsonl"
    written = seqs(log)
    assert written == list(range(len(written))) and written
    lost = re.match(
        rf"the event log {re.escape(repr(str(log)))} lost its last (\d+) line\(s\), the "
        rf"events from seq {len(written)} on \(No space left on device\): ",
        summary["error"],
    )
    assert lost is not None, summary["error"]
    assert summary["status"] == "error" and "closing the reporter" in summary["error"]
    finished = json.loads(log.read_bytes().splitlines()[-1])
    assert finished["type"] != "run_finished"  # (the lost lines are the run's last)


def test_a_close_that_writes_part_of_what_was_kept_names_only_the_lines_it_lost(
    tmp_path: Path, faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event log's close writes what it kept: a third goes out (whole lines and a
    torn one), then the fault is met again. The lines lost are those after the last
    whole line on disk, named by the seq they begin at."""
    real_close = JsonlWriter.close

    def close(self: JsonlWriter) -> None:
        if self.path.name == "events.jsonl":
            faults.short = True
        real_close(self)

    monkeypatch.setattr(JsonlWriter, "close", close)
    with pytest.raises(WriteError):
        faulty_run(tmp_path / "live", faults, heal_at=None, background=False)
    log = tmp_path / "live" / "disk" / "events.jsonl"
    data = log.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    assert whole != data  # (a torn line after them)
    written = [json.loads(line)["seq"] for line in whole.splitlines()]
    assert written == list(range(len(written)))
    summary = json.loads((tmp_path / "live" / "disk" / "summary.json").read_text())
    said = rf"lost its last \d+ line\(s\), the events from seq {len(written)} on \(No space"
    assert re.search(said, summary["error"]), summary["error"]
