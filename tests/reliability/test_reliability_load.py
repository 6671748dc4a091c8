"""Load: many threads through one reporter, many processes appending to one file.

Every line must be valid strict JSON and every record present exactly once, in each
producer's own order; a writer opening the file while others append (its torn-line
check runs then) must never cut another writer's line in progress.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import twinkle.reporting.jsonl as jsonl_mod
from twinkle.reporting import JsonlBackend, JsonlWriter, MetricsReporter, make_record

RUN = "load"


def _reject(name: str) -> Any:
    raise ValueError(f"non-strict JSON token {name}")


def strict_lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line, parse_constant=_reject) for line in data.splitlines()]


def threads_through_one_reporter(
    tmp_path: Path, threads: int, per_thread: int, background: bool, figures: Any
) -> None:
    path = tmp_path / "raw.jsonl"
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            barrier.wait()
            report = reporter.report
            for i in range(per_thread):
                report(
                    make_record(
                        kind="train",
                        scope="iteration",
                        run_id=RUN,
                        step=i,
                        iteration=i,
                        wall_ns=i,
                        monotonic_ns=i,
                        values={"t": t, "i": i, "x": float("nan") if i % 997 == 0 else 0.5},
                    )
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    start = time.perf_counter()
    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    reporter.close()
    seconds = time.perf_counter() - start
    assert not errors
    total = threads * per_thread
    seen = [[False] * per_thread for _ in range(threads)]
    last = [-1] * threads
    lines = 0
    with path.open("rb") as f:
        for seq, line in enumerate(f):
            o = json.loads(line, parse_constant=_reject)
            assert o["seq"] == seq  # file order is seq order: no gap, no duplicate
            t, i = o["values"]["t"], o["values"]["i"]
            assert not seen[t][i], f"record {(t, i)} written twice"
            assert i > last[t], f"thread {t}: record {i} after {last[t]}"
            seen[t][i] = True
            last[t] = i
            lines += 1
    assert lines == total
    assert all(all(row) for row in seen)
    stats = reporter.stats
    assert stats.reported == stats.written == total and stats.dropped == 0
    path.unlink()  # tens of MB: not for pytest's retained tmp dirs
    figures(
        mode="background" if background else "sync",
        threads=threads,
        records_written=total,
        lost=0,
        duplicated=0,
        records_per_s=int(total / seconds),
    )


@pytest.mark.parametrize("background", [True, False], ids=["background", "sync"])
def test_eight_threads_through_one_reporter_lose_and_duplicate_nothing(
    tmp_path: Path, sizes: Any, figures: Any, background: bool
) -> None:
    threads_through_one_reporter(
        tmp_path, sizes.threads, sizes.records_per_thread, background, figures
    )


@pytest.mark.soak
@pytest.mark.parametrize("background", [True, False], ids=["background", "sync"])
def test_soak_threads_through_one_reporter(
    tmp_path: Path, sizes: Any, figures: Any, background: bool
) -> None:
    threads_through_one_reporter(
        tmp_path, sizes.threads, sizes.records_per_thread, background, figures
    )


APPENDER = textwrap.dedent(
    """
    import random, sys
    from twinkle.reporting import (
        JsonlBackend, JsonlWriter, MetricsReporter, make_record)

    path, proc, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(proc)
    if proc % 2 == 0:  # a background reporter of its own run
        run = f"proc-{proc}"
        with MetricsReporter([JsonlBackend(path)], run_id=run, background=True) as rep:
            for i in range(count):
                rep.report(make_record(kind="k", scope="iteration", run_id=run, step=i,
                    iteration=i, wall_ns=i, monotonic_ns=i, values={"i": i},
                    attrs={"proc": proc}))
    else:  # JsonlWriter batches of varied size: single O_APPEND writes of 0.1-200 KiB
        with JsonlWriter(path) as w:
            i = 0
            while i < count:
                n = min(count - i, rng.randint(1, 500))
                pad = "y" * rng.randint(0, 400)
                w.write({"proc": proc, "i": i + k, "pad": pad} for k in range(n))
                i += n
    """
)


def processes_appending(tmp_path: Path, processes: int, per_process: int, figures: Any) -> None:
    path = tmp_path / "shared.jsonl"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    procs = []
    for p in range(processes):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", APPENDER, str(path), str(p), str(per_process)], env=env
            )
        )
        time.sleep(0.05)  # staggered: later writers open (and check the tail) mid-write
    for proc in procs:
        assert proc.wait(timeout=600) == 0
    seconds = time.perf_counter() - start
    objs = strict_lines(path)
    assert len(objs) == processes * per_process
    nxt = [0] * processes
    for o in objs:
        if "seq" in o:
            p, i = o["attrs"]["proc"], o["values"]["i"]
            assert o["seq"] == i and o["run_id"] == f"proc-{p}"
        else:
            p, i = o["proc"], o["i"]
        assert i == nxt[p], f"process {p}: record {i} where {nxt[p]} was due"
        nxt[p] = i + 1
    assert nxt == [per_process] * processes
    assert not path.with_name(path.name + ".torn").exists()  # no live line taken for torn
    path.unlink()
    figures(
        processes=processes,
        records_written=len(objs),
        lost=0,
        duplicated=0,
        seconds=round(seconds, 2),
    )


def test_processes_appending_to_one_file_keep_every_record_once(
    tmp_path: Path, sizes: Any, figures: Any
) -> None:
    processes_appending(tmp_path, sizes.processes, sizes.records_per_process, figures)


@pytest.mark.soak
def test_soak_processes_appending(tmp_path: Path, sizes: Any, figures: Any) -> None:
    processes_appending(tmp_path, sizes.processes, sizes.records_per_process, figures)


def test_opening_a_file_never_cuts_a_line_another_writer_is_still_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write the kernel splits (a big line, a signal) leaves a partial last line for a
    moment. A writer opening the file then must not take it for a torn line: it is
    repaired only when no other writer holds the file."""
    path = tmp_path / "shared.jsonl"
    slow = JsonlWriter(path)
    half_written = threading.Event()
    resume = threading.Event()
    real_write = os.write

    def split_write(fd: int, data: Any) -> int:
        if fd != slow._fd or half_written.is_set():  # split the slow writer's first write
            return real_write(fd, data)
        n = real_write(fd, bytes(data[: len(data) // 2]))
        half_written.set()
        resume.wait(10)
        return n

    monkeypatch.setattr(jsonl_mod, "_os_write", split_write)
    t = threading.Thread(target=slow.write, args=([{"writer": "slow", "pad": "z" * 1000}],))
    t.start()
    assert half_written.wait(10)
    with JsonlWriter(path) as late:  # opens while half a line is in the file
        assert late.recovery is None
        resume.set()
        t.join()
        late.write([{"writer": "late"}])
    slow.close()
    assert [o["writer"] for o in strict_lines(path)] == ["slow", "late"]
    assert not path.with_name(path.name + ".torn").exists()


def test_a_writer_alone_still_repairs_a_torn_tail_after_others_closed(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    with JsonlWriter(path) as a:
        a.write([{"n": 0}])
    with path.open("ab") as f:
        f.write(b'{"n": 1, "pa')  # a writer killed mid-line (its lock died with it)
    with JsonlWriter(path) as b:
        assert b.recovery is not None and b.recovery.torn_bytes == 12
        b.write([{"n": 1}])
    assert [o["n"] for o in strict_lines(path)] == [0, 1]
