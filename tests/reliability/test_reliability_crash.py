"""Crashes: writers killed with SIGKILL at random moments lose no complete record.

Each kill point forks a writer (JsonlWriter batches, a sync or background
MetricsReporter, or a whole RunSession), lets it write for a random time drawn from a
seeded RNG, kills it with SIGKILL and checks what a restart finds: every complete line
kept byte for byte, a torn last line moved to the sidecar, ``seq`` continuing, and the
event log of a killed run still replaying (a torn last line passed over and reported).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reliability._scripted import scripted_run
from twinkle.errors import ReplayError
from twinkle.observers import EventLogSink
from twinkle.reporting import JsonlBackend, JsonlWriter, MetricsReporter
from twinkle.run import replay

CHILD = Path(__file__).with_name("_crash_child.py")
RUN = "crash"
SEED = 20240808


class ForkServer:
    """Talks to ``_crash_child.py``: spawn writers, kill them, reap them."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def _ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the fork server died"
        result: dict[str, Any] = json.loads(answer)
        return result

    def spawn(self, mode: str, path: Path, life: int) -> int:
        return int(self._ask(op="spawn", mode=mode, path=str(path), life=life)["pid"])

    def kill(self, pid: int, watch: Path, size_before: int, delay_s: float) -> None:
        """SIGKILL ``pid`` ``delay_s`` after ``watch`` grew past ``size_before``."""
        deadline = time.monotonic() + 30
        while not (watch.exists() and watch.stat().st_size > size_before):
            assert time.monotonic() < deadline, f"writer {pid} never wrote to {watch}"
            time.sleep(0.0005)
        time.sleep(delay_s)
        os.kill(pid, signal.SIGKILL)
        status = self._ask(op="reap", pid=pid)["status"]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    def close(self) -> None:
        self.proc.communicate(timeout=30)  # (closes stdin, waits, closes stdout)


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


def check_reopen(path: Path, before: bytes) -> tuple[int, int]:
    """Reopen ``path`` in append mode as a restarted writer does and check the repair
    against ``before`` (the file as the killed writer left it). Returns (complete lines
    kept, torn bytes moved)."""
    end = before.rfind(b"\n") + 1
    tail = before[end:]
    with JsonlWriter(path) as w:
        recovery = w.recovery
    after = path.read_bytes()
    if not tail:
        assert recovery is None
        assert after == before
        return before.count(b"\n"), 0
    assert recovery is not None and recovery.offset == end
    assert recovery.torn_bytes == len(tail)
    assert after == before[:end], "a complete line was lost or changed by the repair"
    assert recovery.sidecar is not None
    entry = orjson.loads(Path(recovery.sidecar).read_bytes().splitlines()[-1])
    assert base64.b64decode(entry["base64"]) == tail and entry["offset"] == end
    return before[:end].count(b"\n"), len(tail)


def strict_objects(data: bytes) -> list[dict[str, Any]]:
    """Every line parsed by the standard library's strict parser (no NaN tokens)."""
    assert data == b"" or data.endswith(b"\n")

    def reject(name: str) -> Any:
        raise ValueError(f"non-strict JSON token {name}")

    return [json.loads(line, parse_constant=reject) for line in data.splitlines()]


def check_lives(objs: list[dict[str, Any]], key: str) -> dict[int, int]:
    """Each writer life's counter runs 0, 1, 2, ... without a hole (a prefix of what it
    wrote), lives in file order; returns records per life."""
    counts: dict[int, int] = {}
    order: list[int] = []
    for o in objs:
        life, i = (o["life"], o["i"]) if key == "line" else (o["attrs"]["life"], o["values"]["i"])
        if not order or order[-1] != life:
            assert life not in counts, f"life {life} interleaved with another"
            order.append(life)
        assert i == counts.get(life, 0), f"life {life}: record {i} after {counts.get(life, 0)}"
        counts[life] = i + 1
    return counts


def kill_writers(tmp_path: Path, server: ForkServer, kills: int, figures: Any) -> None:
    rng = random.Random(SEED)
    torn = torn_bytes = 0
    files: dict[Path, str] = {}
    modes = ["writer", "reporter", "reporter-bg"]
    for life in range(kills):
        mode = modes[life % 3]
        group = "lines" if mode == "writer" else "records"
        path = tmp_path / f"{group}-{life // 12}.jsonl"  # a fresh file now and then
        files[path] = group
        size = path.stat().st_size if path.exists() else 0
        pid = server.spawn(mode, path, life)
        # The line writer writes about 1 GB/s: a short life keeps the files small.
        server.kill(pid, path, size, rng.uniform(0, 0.004 if mode == "writer" else 0.015))
        _, moved = check_reopen(path, path.read_bytes())
        torn += moved > 0
        torn_bytes += moved
    total = 0
    for path, group in files.items():
        objs = strict_objects(path.read_bytes())
        total += len(objs)
        if group == "lines":
            check_lives(objs, "line")
            continue
        check_lives(objs, "record")
        assert [o["seq"] for o in objs] == list(range(len(objs)))  # no gap, no duplicate
        # A restarted reporter continues after the last complete record.
        with MetricsReporter([JsonlBackend(path)], run_id=RUN) as again:
            assert again.next_seq == len(objs)
    for path in files:
        path.unlink()  # hundreds of MB: do not keep them in pytest's retained tmp dirs
    figures(kill_points=kills, records_kept=total, torn_lines=torn, torn_bytes=torn_bytes, lost=0)


def test_sigkilled_writers_keep_every_complete_record_and_seq_continues(
    tmp_path: Path, fork_server: ForkServer, sizes: Any, figures: Any
) -> None:
    kill_writers(tmp_path, fork_server, sizes.kill_points, figures)


@pytest.mark.soak
def test_soak_sigkilled_writers(
    tmp_path: Path, fork_server: ForkServer, sizes: Any, figures: Any
) -> None:
    kill_writers(tmp_path, fork_server, sizes.kill_points, figures)


def kill_sessions(tmp_path: Path, server: ForkServer, kills: int, figures: Any) -> None:
    rng = random.Random(SEED + 1)
    events_kept = torn = records = 0
    for life in range(kills):
        run_dir = tmp_path / "runs" / f"crash-{life}"
        log = run_dir / "events.jsonl"
        pid = server.spawn("session", tmp_path / "runs", life)
        server.kill(pid, log, 0, rng.uniform(0, 0.08))
        data = log.read_bytes()
        complete = data.count(b"\n")
        tail = data[data.rfind(b"\n") + 1 :]
        result = replay(log, tmp_path / "replay" / str(life), autoload=False)
        assert result.summary["status"] == "error"
        assert "without run_finished" in result.summary["error"]
        assert result.events == complete
        if tail:
            torn += 1
            assert result.torn_line == complete + 1 and result.torn_bytes == len(tail)
            assert "torn last line" in result.summary["error"]
        else:
            assert result.torn_line is None
        events_kept += complete
        # A restart repairs both files: the log then replays to the same records.
        check_reopen(log, data)
        again = replay(log, tmp_path / "again" / str(life), autoload=False)
        assert again.torn_line is None and again.events == complete
        assert (tmp_path / "again" / str(life) / "metrics_raw.jsonl").read_bytes() == (
            tmp_path / "replay" / str(life) / "metrics_raw.jsonl"
        ).read_bytes()
        raw = run_dir / "metrics_raw.jsonl"
        if raw.exists():
            check_reopen(raw, raw.read_bytes())
            objs = strict_objects(raw.read_bytes())
            assert [o["seq"] for o in objs] == list(range(len(objs)))
            records += len(objs)
    figures(
        session_kills=kills, events_kept=events_kept, records_kept=records, torn_logs=torn, lost=0
    )


def test_sigkilled_run_session_log_still_replays(
    tmp_path: Path, fork_server: ForkServer, sizes: Any, figures: Any
) -> None:
    kill_sessions(tmp_path, fork_server, sizes.session_kills, figures)


@pytest.mark.soak
def test_soak_sigkilled_run_sessions(
    tmp_path: Path, fork_server: ForkServer, sizes: Any, figures: Any
) -> None:
    kill_sessions(tmp_path, fork_server, sizes.session_kills, figures)


# -- deterministic torn lines: a log cut at any byte ---------------------------------------


def cut_log(tmp_path: Path, cuts: int, figures: Any) -> None:
    log = scripted_run(tmp_path / "live").read_bytes()
    ends = [i + 1 for i, b in enumerate(log) if b == 0x0A]
    lines = set(log.splitlines())
    rng = random.Random(SEED + 2)
    offsets = {0, len(log) - 1, ends[0] - 1, ends[0], ends[0] + 1}
    offsets |= {e + d for e in rng.sample(ends, min(5, len(ends))) for d in (-1, 0, 1)}
    while len(offsets) < cuts:
        offsets.add(rng.randrange(len(log)))
    torn = 0
    for n, offset in enumerate(sorted(offsets)):
        cut = log[:offset]
        complete = cut[: cut.rfind(b"\n") + 1]
        if cut[len(complete) :] in lines:  # only the newline is missing: complete
            complete = cut + b"\n"
        d = tmp_path / "cut" / str(n)
        d.mkdir(parents=True)
        (d / "events.jsonl").write_bytes(cut)
        if not complete:
            with pytest.raises(ReplayError, match="must start with a run_started"):
                replay(d / "events.jsonl", d / "out", autoload=False)
            continue
        result = replay(d / "events.jsonl", d / "out", autoload=False)
        assert result.events == complete.count(b"\n")
        torn_expected = not complete.startswith(cut)
        assert (result.torn_line is not None) == torn_expected
        torn += torn_expected
        # The torn line was passed over, not misread: same outputs as the clean prefix.
        (d / "clean").mkdir()
        (d / "clean" / "events.jsonl").write_bytes(complete)
        clean = replay(d / "clean" / "events.jsonl", d / "clean-out", autoload=False)
        for name in ("metrics_raw.jsonl", "metrics.jsonl"):
            assert (d / "out" / name).read_bytes() == (d / "clean-out" / name).read_bytes()
        # Only the error (the torn line named) differs, also in the last segment's entry.
        assert _without_error(result.summary) == _without_error(clean.summary)
    figures(cut_points=len(offsets), torn_replays=torn, lost=0)


def _without_error(summary: dict[str, Any]) -> dict[str, Any]:
    segments = [{k: v for k, v in s.items() if k != "error"} for s in summary["segments"]]
    return {**{k: v for k, v in summary.items() if k != "error"}, "segments": segments}


def test_event_log_cut_at_any_byte_replays_and_reports_the_torn_line(
    tmp_path: Path, sizes: Any, figures: Any
) -> None:
    cut_log(tmp_path, sizes.cut_points, figures)


@pytest.mark.soak
def test_soak_event_log_cuts(tmp_path: Path, sizes: Any, figures: Any) -> None:
    cut_log(tmp_path, sizes.cut_points, figures)


def test_torn_line_in_the_middle_of_a_log_is_an_error_naming_it(tmp_path: Path) -> None:
    lines = scripted_run(tmp_path / "live").read_bytes().splitlines(keepends=True)
    # A crash tore line 4, then something appended without repairing it first.
    bad = b"".join([*lines[:3], lines[3][:25], *lines[4:]])
    path = tmp_path / "bad" / "events.jsonl"
    path.parent.mkdir()
    path.write_bytes(bad)
    with pytest.raises(ReplayError, match=r"events\.jsonl:4: invalid JSON.*never skipped"):
        replay(path, tmp_path / "out", autoload=False)


# -- how much a killed run can lose ---------------------------------------------------------

BOUND_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import twinkle.reporting.jsonl as jsonl
    from twinkle.run import RunSession

    real_write = jsonl._os_write

    def slow_write(fd, data):  # a disk far slower than the training loop
        time.sleep(0.02)
        return real_write(fd, data)

    jsonl._os_write = slow_write
    out, kill_at, background = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "background"
    run = RunSession(
        out_dir=out, run_id="bound", autoload=False, background_dispatch=background
    ).start()
    for i in range(kill_at + 1):
        run.bus.iteration_started(i)
        for k in range(5):
            run.bus.snapshot({"iteration": i, "k": k})
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("dispatch", ["inline", "background"])
def test_killed_run_loses_at_most_the_batches_in_flight(tmp_path: Path, dispatch: str) -> None:
    """EventLogSink hands a batch to its writer thread at each iteration boundary and never
    waits for it there; only a hand-over that finds MAX_BATCHES_IN_FLIGHT batches unwritten
    waits. With a disk 100x slower than the loop, a SIGKILL in iteration K still finds every
    event up to the start of iteration K - MAX_BATCHES_IN_FLIGHT on disk. With background
    dispatch, one iteration more: the dispatch thread lags the loop by at most one
    boundary (a boundary is queued once the one before it was dispatched), and a kill
    loses what it had not reached too."""
    in_flight = EventLogSink.MAX_BATCHES_IN_FLIGHT + (dispatch == "background")
    kill_at = in_flight + 6
    proc = subprocess.run(
        [sys.executable, "-c", BOUND_SCRIPT, str(tmp_path), str(kill_at), dispatch],
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    objs = [
        orjson.loads(line)
        for line in (tmp_path / "bound" / "events.jsonl").read_bytes().splitlines()
    ]
    # The batch handed over at boundary i holds iteration i-1's snapshots and
    # iteration_started(i); the last MAX_BATCHES_IN_FLIGHT of them may be unwritten.
    started = [o["iteration"] for o in objs if o["type"] == "iteration_started"]
    assert started == list(range(len(started)))  # whole batches, in order
    assert len(started) >= kill_at + 1 - in_flight, f"lost iterations: only {started} on disk"
    snaps = [(o["state"]["iteration"], o["state"]["k"]) for o in objs if o["type"] == "snapshot"]
    kept = kill_at - in_flight
    assert snaps[: 5 * kept] == [(i, k) for i in range(kept) for k in range(5)]
