"""MetricsReporter: seq order under concurrency, fan-out failure policy, restart, drops."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, WriteError
from twinkle.reporting import (
    BatchWriter,
    JsonlBackend,
    MetricRecord,
    MetricsReporter,
    ReporterStats,
    make_record,
    read_jsonl,
)

RUN = "run-7"


def rec(n: int = 0, run_id: str = RUN, **values: Any) -> MetricRecord:
    return make_record(
        kind="train",
        scope="iteration",
        run_id=run_id,
        step=n,
        iteration=n,
        wall_ns=1_700_000_000_000_000_000 + n,
        monotonic_ns=n,
        values=values or {"n": n},
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-strict JSON token {name}")


def strict_lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(line, parse_constant=_reject_constant) for line in data.splitlines()]


def seqs(path: Path) -> list[int]:
    return [o["seq"] for o in strict_lines(path)]


class ListBackend:
    """A fake backend keeping every batch."""

    def __init__(self, name: str = "list") -> None:
        self.name = name
        self.records: list[MetricRecord] = []
        self.flushes = 0
        self.closed = False

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.records.extend(records)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


class RaisingBackend(ListBackend):
    def write(self, records: Sequence[MetricRecord]) -> None:
        raise RuntimeError("backend exploded")

    def flush(self) -> None:
        raise RuntimeError("flush exploded")


class GatedBackend(ListBackend):
    """Blocks in write() until the gate opens (simulates a slow disk)."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.entered.set()
        self.gate.wait(10)
        super().write(records)


# -- seq and order ---------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_report_stamps_increasing_seq_and_returns_the_stamped_record(
    tmp_path: Path, background: bool
) -> None:
    path = tmp_path / "raw.jsonl"
    with MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background) as reporter:
        original = rec(0)
        stamped = [reporter.report(original) for _ in range(3)]
        assert [r.seq for r in stamped] == [0, 1, 2]
        assert original.seq is None
        assert stamped[1] == msgspec.structs.replace(original, seq=1)
        assert reporter.next_seq == 3
    assert seqs(path) == [0, 1, 2]
    assert reporter.stats == ReporterStats(
        reported=3,
        written=3,
        dropped=0,
        backend_failures=0,
        queued=0,
        unwritten=0,
        failures_by_backend={f"JsonlBackend({str(path)!r})": 0},
        recoveries=(),
    )


@pytest.mark.parametrize("background", [False, True])
def test_eight_threads_160k_records_every_line_strict_json_file_order_is_seq_order(
    tmp_path: Path, background: bool
) -> None:
    path = tmp_path / "raw.jsonl"
    threads_n, per_thread = 8, 20_000
    # Every thread reports the same record objects; report() returns each its own seq.
    records = [rec(i, i=i, x=float("nan") if i % 1000 == 0 else i * 0.5) for i in range(per_thread)]
    start = threading.Barrier(threads_n)
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    got: dict[int, list[int]] = {}

    def produce(t: int) -> None:
        start.wait()
        report = reporter.report
        got[t] = [cast(int, report(r).seq) for r in records]  # (stamped: an int)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    reporter.close()
    objs = strict_lines(path)
    total = threads_n * per_thread
    assert len(objs) == total
    assert [o["seq"] for o in objs] == list(range(total))  # no gap, no dup, file order
    for t_seqs in got.values():
        assert t_seqs == sorted(t_seqs)  # each thread's records in its own order
        for i, seq in enumerate(t_seqs):
            values = objs[seq]["values"]
            assert values["i"] == i
            if i % 1000 == 0:
                assert values["x"] is None and objs[seq]["attrs"]["nonfinite"] == ["x"]
    assert reporter.stats.reported == reporter.stats.written == total


def test_record_of_another_run_is_refused(tmp_path: Path) -> None:
    with MetricsReporter([ListBackend()], run_id=RUN) as reporter:
        with pytest.raises(
            RecordError, match=r"run 'other' reported to the reporter of run 'run-7'"
        ):
            reporter.report(rec(0, run_id="other"))


# -- failure policy ----------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_raising_backend_is_logged_counted_and_skipped_others_get_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, background: bool
) -> None:
    good = ListBackend("good")
    path = tmp_path / "raw.jsonl"
    bad = RaisingBackend("exploding-sink")
    caplog.set_level(logging.ERROR, logger="twinkle.reporting")
    reporter = MetricsReporter([bad, good, JsonlBackend(path)], run_id=RUN, background=background)
    for i in range(50):
        reporter.report(rec(i))
    reporter.flush()
    reporter.close()
    assert [r.seq for r in good.records] == list(range(50))
    assert seqs(path) == list(range(50))
    stats = reporter.stats
    assert stats.backend_failures >= 2  # at least one write and the flushes
    assert stats.failures_by_backend["exploding-sink"] == stats.backend_failures
    assert stats.failures_by_backend["good"] == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "twinkle.reporting"]
    assert any("exploding-sink" in m and "backend exploded" in m for m in messages)
    assert bad.closed and good.closed


def test_failure_logging_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="twinkle.reporting")
    reporter = MetricsReporter([RaisingBackend("bad")], run_id=RUN)
    for i in range(100):
        reporter.report(rec(i))
    assert reporter.stats.backend_failures == 100
    logged = [r for r in caplog.records if "bad" in r.getMessage()]
    assert len(logged) == 7  # failures 1, 2, 4, ..., 64
    assert logged[0].exc_info is not None


def _dev_full_writable() -> bool:
    try:
        fd = os.open("/dev/full", os.O_WRONLY)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.skipif(not _dev_full_writable(), reason="/dev/full is not writable here")
@pytest.mark.parametrize("background", [False, True])
def test_disk_full_backend_keeps_records_unwritten_visible_others_complete(
    tmp_path: Path, background: bool
) -> None:
    path = tmp_path / "raw.jsonl"
    full = JsonlBackend("/dev/full")
    reporter = MetricsReporter([full, JsonlBackend(path)], run_id=RUN, background=background)
    for i in range(10):
        try:
            reporter.report(rec(i))
        except WriteError as exc:  # the fault shows at the next call; the record is kept
            assert exc.record.seq == i
    with pytest.raises(
        WriteError, match=r"not written yet .*/dev/full.*: 10\b.*call flush\(\) again"
    ):
        reporter.flush()
    stats = reporter.stats
    assert stats.unwritten == 10
    assert stats.written == 10
    assert stats.backend_failures >= 1
    assert seqs(path) == list(range(10))
    with pytest.raises(
        WriteError, match=r"lost unwritten records: JsonlBackend\('/dev/full'\): 10"
    ):
        reporter.close()
    assert seqs(path) == list(range(10))


# -- restart, torn line, append ---------------------------------------------------------


def test_two_reporters_in_sequence_append_and_seq_continues(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    with MetricsReporter([JsonlBackend(path)], run_id=RUN, background=True) as first:
        for i in range(5):
            first.report(rec(i))
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as second:
        assert second.next_seq == 5
        assert second.report(rec(5)).seq == 5
    assert seqs(path) == list(range(6))


def test_seq_continues_after_the_last_record_of_this_run_only(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as a:
        for i in range(4):
            a.report(rec(i))
    with MetricsReporter([JsonlBackend(path)], run_id="other-run") as b:
        assert b.next_seq == 0
        b.report(rec(0, run_id="other-run"))
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as c:
        assert c.next_seq == 4


def test_explicit_start_seq_wins(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as a:
        a.report(rec(0))
    with MetricsReporter([JsonlBackend(path)], run_id=RUN, start_seq=100) as b:
        assert b.report(rec(1)).seq == 100


def test_torn_last_line_after_crash_is_recovered_and_seq_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "raw.jsonl"
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as first:
        for i in range(3):
            first.report(rec(i))
    intact = path.read_bytes()
    # A crash mid-write: half of the next record, no newline.
    torn = json.dumps({"kind": "train", "run_id": RUN, "seq": 3})[:20].encode()
    with path.open("ab") as f:
        f.write(torn)
    caplog.set_level(logging.WARNING, logger="twinkle.reporting")
    with MetricsReporter([JsonlBackend(path)], run_id=RUN) as second:
        (recovery,) = second.stats.recoveries
        assert recovery.offset == len(intact) and recovery.torn_bytes == len(torn)
        assert recovery.sidecar is not None
        assert second.next_seq == 3
        second.report(rec(3))
    assert path.read_bytes().startswith(intact)
    assert seqs(path) == [0, 1, 2, 3]
    assert Path(recovery.sidecar).read_text().count("\n") == 1
    assert any(
        "'run-7'" in r.getMessage() and "no trailing newline" in r.getMessage()
        for r in caplog.records
    )


def test_unclosed_background_reporter_is_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    script = f"""
from twinkle.reporting import JsonlBackend, MetricsReporter, make_record
rep = MetricsReporter([JsonlBackend({str(path)!r})], run_id="exit-run", background=True)
for i in range(2000):
    rep.report(make_record(kind="k", scope="run", run_id="exit-run", step=i, iteration=i,
                           wall_ns=i, monotonic_ns=i, values={{"i": i}}))
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*sys.path])
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    assert seqs(path) == list(range(2000))


# -- background queue ---------------------------------------------------------------------


def test_drop_mode_counts_drops_and_leaves_seq_gaps(caplog: pytest.LogCaptureFixture) -> None:
    gated = GatedBackend()
    caplog.set_level(logging.WARNING, logger="twinkle.reporting")
    reporter = MetricsReporter([gated], run_id=RUN, background=True, queue_size=4, on_full="drop")
    reporter.report(rec(0))
    assert gated.entered.wait(5)  # the writer holds record 0 in write()
    stamped = [reporter.report(rec(i)) for i in range(1, 11)]
    assert [r.seq for r in stamped] == list(range(1, 11))
    gated.gate.set()
    reporter.close()
    stats = reporter.stats
    # queue_size bounds records not yet written, the batch being written included:
    # 0 is in flight, 1-3 wait, 4-10 are dropped.
    assert stats.dropped == 7
    assert stats.reported == 11 and stats.written == 4
    assert [r.seq for r in gated.records] == [0, 1, 2, 3]
    assert any("dropped" in r.getMessage() for r in caplog.records)


def test_block_mode_waits_for_room_and_drops_nothing() -> None:
    gated = GatedBackend()
    reporter = MetricsReporter([gated], run_id=RUN, background=True, queue_size=3)
    reporter.report(rec(0))
    assert gated.entered.wait(5)
    reporter.report(rec(1))
    reporter.report(rec(2))  # 0 in flight + 1, 2 waiting: full
    done = threading.Event()

    def late() -> None:
        reporter.report(rec(3))
        done.set()

    t = threading.Thread(target=late)
    t.start()
    assert not done.wait(0.3)  # blocked while the backend is stuck
    gated.gate.set()
    assert done.wait(5)
    t.join()
    reporter.close()
    assert [r.seq for r in gated.records] == [0, 1, 2, 3]
    assert reporter.stats.dropped == 0
    assert reporter.stats.waits == 1  # the one report() that found the queue full


def test_flush_waits_until_everything_reported_is_written(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=True)
    for i in range(5000):
        reporter.report(rec(i))
    reporter.flush()
    assert seqs(path) == list(range(5000))
    assert reporter.stats.queued == 0
    reporter.close()


def test_close_joins_the_writer_thread_and_closes_backends() -> None:
    backend = ListBackend()
    with MetricsReporter([backend], run_id="thread-check", background=True) as reporter:
        reporter.report(rec(0, run_id="thread-check"))
        assert any(t.name == "twinkle-reporter-thread-check" for t in threading.enumerate())
    assert not any(t.name == "twinkle-reporter-thread-check" for t in threading.enumerate())
    assert backend.closed and backend.flushes >= 1
    assert reporter.closed
    reporter.close()  # idempotent
    reporter.flush()  # no-op once closed


def test_blocked_producer_is_released_with_an_error_when_closed() -> None:
    gated = GatedBackend()
    reporter = MetricsReporter([gated], run_id=RUN, background=True, queue_size=2)
    reporter.report(rec(0))
    assert gated.entered.wait(5)
    reporter.report(rec(1))  # 0 in flight + 1 waiting: full
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            reporter.report(rec(2))
        except ReporterError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    closer = threading.Thread(target=reporter.close)
    closer.start()
    time.sleep(0.1)
    gated.gate.set()
    t.join(5)
    closer.join(5)
    assert errors and "closed" in str(errors[0])
    assert [r.seq for r in gated.records] == [0, 1]


# -- bad input: clear errors, file untouched -------------------------------------------------


def _bad_cases() -> list[tuple[str, Callable[[MetricsReporter, Path], Any], type[Exception], str]]:
    def make(**kw: Any) -> Callable[[MetricsReporter, Path], Any]:
        def go(reporter: MetricsReporter, tmp: Path) -> Any:
            fields: dict[str, Any] = dict(
                kind="train",
                scope="iteration",
                run_id=RUN,
                step=1,
                iteration=1,
                wall_ns=1,
                monotonic_ns=1,
                values={"a": 1},
            )
            fields.update(kw)
            return reporter.report(make_record(**fields))

        return go

    def reporter_with(**kw: Any) -> Callable[[MetricsReporter, Path], Any]:
        def go(reporter: MetricsReporter, tmp: Path) -> Any:
            args: dict[str, Any] = {"backends": [ListBackend()], "run_id": RUN}
            args.update(kw)
            return MetricsReporter(args.pop("backends"), **args)

        return go

    def report_after_close(reporter: MetricsReporter, tmp: Path) -> Any:
        reporter.close()
        return reporter.report(rec(99))

    return [
        ("non-string key", make(values={3: 1.0}), RecordError, r"values key 3 .*must be str"),
        (
            "string value",
            make(values={"loss": "high"}),
            RecordError,
            r"values\['loss'\] = 'high' is a str",
        ),
        (
            "bool value",
            make(values={"flag": False}),
            RecordError,
            r"values\['flag'\] = False is a bool",
        ),
        (
            "nested value",
            make(values={"m": {"x": 1}}),
            RecordError,
            r"values\['m'\] is a nested dict",
        ),
        ("negative step", make(step=-1), RecordError, r"step must be an int >= 0, got -1"),
        ("empty kind", make(kind=""), RecordError, r"kind must be .*got ''"),
        ("unknown scope", make(scope="epoch"), RecordError, r"scope must be one of .*'epoch'"),
        ("run_id with /", make(run_id="a/b"), RecordError, r"run_id 'a/b'"),
        ("other run", lambda r, t: r.report(rec(0, run_id="other")), RecordError, r"run 'other'"),
        (
            "not a record",
            # not a MetricRecord: the wrong type is the point
            lambda r, t: r.report({"kind": "train"}),  # type: ignore[arg-type]
            InvalidArgumentError,
            r"takes a MetricRecord",
        ),
        ("path is a directory", lambda r, t: JsonlBackend(t), ReporterError, r"is a directory"),
        (
            "unknown on_full",
            reporter_with(on_full="wait"),
            InvalidArgumentError,
            r"on_full must be .*'wait'",
        ),
        (
            "queue_size 0",
            reporter_with(queue_size=0),
            InvalidArgumentError,
            r"queue_size must be an int >= 1.*got 0",
        ),
        (
            "negative start_seq",
            reporter_with(start_seq=-4),
            InvalidArgumentError,
            r"start_seq .*got -4",
        ),
        (
            "reporter run_id with ..",
            reporter_with(run_id="../x"),
            InvalidArgumentError,
            r"run_id '../x'",
        ),
        (
            "backends not a list",
            reporter_with(backends=ListBackend()),
            InvalidArgumentError,
            r"backends must be a sequence",
        ),
        (
            "backend lacking flush",
            reporter_with(backends=[object()]),
            InvalidArgumentError,
            r"backends\[0\] = <object.*lacks \['write', 'flush', 'close'\]",
        ),
        (
            "report after close",
            report_after_close,
            ReporterError,
            r"reporter of run 'run-7' is closed",
        ),
        (
            "attrs not JSON",
            make(attrs={"t": {1, 2}}),
            RecordError,
            r"attrs\['t'\] = \{1, 2\}.*not a JSON value",
        ),
        (
            "NaN in attrs",
            make(attrs={"x": float("inf")}),
            RecordError,
            r"attrs\['x'\] = inf is not finite",
        ),
    ]


@pytest.mark.parametrize(
    ("case", "action", "error", "culprit"), _bad_cases(), ids=[c[0] for c in _bad_cases()]
)
@pytest.mark.parametrize("background", [False, True])
def test_bad_input_raises_a_clear_error_and_written_records_stay(
    tmp_path: Path,
    case: str,
    action: Callable[[MetricsReporter, Path], Any],
    error: type[Exception],
    culprit: str,
    background: bool,
) -> None:
    path = tmp_path / "raw.jsonl"
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    for i in range(5):
        reporter.report(rec(i))
    reporter.flush()
    before = path.read_bytes()
    with pytest.raises(error, match=culprit):
        action(reporter, tmp_path)
    reporter.close()
    assert path.read_bytes() == before
    assert seqs(path) == [0, 1, 2, 3, 4]
    assert list(read_jsonl(path)) == strict_lines(path)


def test_a_ctrl_c_right_after_a_record_was_taken_never_gives_its_seq_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handler raising just after the writer took a record, before the reporter
    counted its seq: the next record got the same seq (two records, one seq)."""
    backend = ListBackend()
    reporter = MetricsReporter([backend], run_id=RUN, background=False)
    put = BatchWriter.put

    def interrupted(writer: BatchWriter[Any], item: Any) -> bool:
        put(writer, item)
        raise KeyboardInterrupt  # (the signal, as put() returns)

    monkeypatch.setattr(BatchWriter, "put", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reporter.report(rec(0))
    monkeypatch.undo()
    reporter.report(rec(1))
    reporter.close()
    assert [r.seq for r in backend.records] == [0, 1]
