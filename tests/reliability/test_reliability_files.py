"""Files: what twinkle writes stays whole and where it belongs.

* A co-appender killed in the middle of a big write never corrupts the writer that
  survives it: the survivor ends the fragment with a newline (recorded in the sidecar)
  before its own lines, and the file reads back whole (real processes, SIGKILL).
* No symlink planted in a run directory is followed; ``trace.json`` is written whole
  (a temporary file renamed into place) or not at all.
* An event log that cannot be opened fails the run's start; nothing is left half open.
* The writer and the reader agree on one line limit: a span batch too long for a line
  is written as several, a huge line is a clear error (never a ``MemoryError``).
* Each event line carries ``seq``; every file is fsynced at close, the trace before its
  rename.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

import twinkle.reporting.jsonl as jsonl_mod
from _recompute import span_list
from reliability._scripted import CONFIG, scripted_run
from twinkle.errors import RecordError, ReporterError, TwinkleError
from twinkle.events import RunFinished, SpanBatch, event_from_dict
from twinkle.hookspecs import RunContext
from twinkle.observers import EventLogSink, TraceSink
from twinkle.perf import ClockAnchor, ManualClock, Span
from twinkle.plugins import make_plugin_manager
from twinkle.reporting import JsonlWriter, read_jsonl
from twinkle.run import Run, RunSession, RunState, replay

ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")


def twinkle_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("twinkle-"))


def event_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# -- 1. a co-appender killed mid-write -------------------------------------------------------

CO_APPENDER = textwrap.dedent(
    """
    import sys, time
    import twinkle.reporting.jsonl as jsonl
    from twinkle.reporting import JsonlWriter

    path, mode, count, pad = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    w = JsonlWriter(path)
    w.write([{"who": "co", "i": 0}])
    batch = [b'{"who":"co","i":%d,"pad":"%s"}\\n' % (i, b"p" * pad) for i in range(1, count)]
    real = jsonl._os_write
    if mode == "stall":  # the big write stops half way; the process is killed there
        def half(fd, data):
            n = real(fd, bytes(memoryview(data)[: len(data) // 2]))
            print("partial", flush=True)
            time.sleep(120)
            return n
        jsonl._os_write = half
    else:  # one real write of the whole batch, killed while the kernel copies it
        print("writing", flush=True)
    w.write_bytes_lines(batch)
    print("done", flush=True)
    time.sleep(120)
    """
)


class Survivor:
    """A writer that stays: a thread appending small batches until stopped."""

    def __init__(self, path: Path) -> None:
        self.writer = JsonlWriter(path)
        self.n = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                k = 1 + self.n % 3
                self.writer.write({"who": "survivor", "n": self.n + j} for j in range(k))
                self.n += k
                time.sleep(0.001)
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.writer.close()
        assert self.errors == []


def kill_co_appender_mid_write(path: Path, mode: str, count: int, pad: int) -> None:
    """Start a co-appender, SIGKILL it in the middle of its big write."""
    child = subprocess.Popen(
        [sys.executable, "-c", CO_APPENDER, str(path), mode, str(count), str(pad)],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    if said == "writing":
        start = path.stat().st_size
        while path.stat().st_size < start + (4 << 20):  # the write is under way
            if child.poll() is not None:
                break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()


def test_a_co_appender_killed_mid_write_never_corrupts_the_survivor(
    tmp_path: Path, figures: Any
) -> None:
    path = tmp_path / "shared.jsonl"
    count, pad = 8_000, 2_000  # a 16 MiB batch, one write
    survivor = Survivor(path)
    rounds = 8
    try:
        for r in range(rounds):
            kill_co_appender_mid_write(path, "stall" if r % 2 == 0 else "real", count, pad)
            time.sleep(0.02)  # the survivor writes after the death
    finally:
        survivor.stop()

    reader = read_jsonl(path)  # strict: every line a record or a recorded fragment
    objs = list(reader)
    mine = [o["n"] for o in objs if o["who"] == "survivor"]
    assert mine == list(range(survivor.n))  # every survivor record, once, in order
    co = [o for o in objs if o["who"] == "co"]
    assert all(o["i"] == 0 or o["pad"] == "p" * pad for o in co)  # none fused or cut
    assert sum(o["i"] == 0 for o in co) == rounds
    cut = rounds - sum(o["i"] == count - 1 for o in co)  # batches the kill cut short
    assert cut >= rounds // 2  # every stalled one, and the real writes the kill caught
    torn = survivor.writer.fragments
    assert rounds // 2 <= torn <= cut
    assert len(reader.fragment_lines) == torn  # each passed over, none taken for data
    side = [orjson.loads(x) for x in path.with_name(path.name + ".torn").read_bytes().splitlines()]
    assert [e["kind"] for e in side] == ["fragment"] * torn
    data = path.read_bytes()
    for entry in side:  # each fragment stays in the file, a line of its own
        fragment = data[entry["offset"] : entry["offset"] + entry["torn_bytes"] + 1]
        assert fragment.endswith(b"\n") and b"\n" not in fragment[:-1]
    figures(rounds=rounds, torn=torn, survivor_records=survivor.n, lost=0)
    path.unlink()


def test_a_bad_line_the_sidecar_does_not_record_exactly_is_still_an_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.jsonl"
    with JsonlWriter(path) as a:
        a.write([{"n": 0}])
        with path.open("ab") as f:
            f.write(b'{"n": 1, "pad": "ppp')  # a co-appender died here
        a.write([{"n": 2}])
    assert a.fragments == 1
    assert [o["n"] for o in read_jsonl(path)] == [0, 2]
    # Real corruption: the same fragment, changed by one byte, is not the recorded one.
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"pad": "ppp', b'"pad": "ppq'))
    with pytest.raises(RecordError, match=r"shared\.jsonl:2: invalid JSON"):
        list(read_jsonl(path))
    # Another bad line elsewhere is an error too, with the fragment recognised.
    path.write_bytes(data + b"garbage\n" + b'{"n": 3}\n')
    with pytest.raises(RecordError, match=r"shared\.jsonl:4: invalid JSON"):
        list(read_jsonl(path))


# -- 2. symlinks and whole files ------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside every run directory that a planted symlink points at."""
    target = tmp_path / "elsewhere" / "precious"
    target.parent.mkdir()
    target.write_bytes(b"precious\n")
    return target


@pytest.mark.parametrize(
    "name", ["events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "trace.json"]
)
def test_a_symlink_planted_in_a_run_directory_is_refused_and_never_followed(
    tmp_path: Path, outside: Path, name: str
) -> None:
    run_dir = tmp_path / "runs" / "planted"
    run_dir.mkdir(parents=True)
    (run_dir / name).symlink_to(outside)
    session = RunSession(out_dir=tmp_path / "runs", run_id="planted", autoload=False)
    with pytest.raises(ReporterError, match=rf"{name}'.*symbolic link.*remove the link"):
        session.start()
    assert session.state is RunState.FAILED
    assert outside.read_bytes() == b"precious\n"
    assert (run_dir / name).is_symlink()
    assert twinkle_threads() == []


def test_the_torn_tail_sidecar_is_never_written_through_a_symlink(
    tmp_path: Path, outside: Path
) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2, "to')
    path.with_name("m.jsonl.torn").symlink_to(outside)
    with pytest.raises(ReporterError, match=r"m\.jsonl\.torn'.*symbolic link"):
        JsonlWriter(path)
    assert outside.read_bytes() == b"precious\n"
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2, "to'  # not cut: the bytes had nowhere


def test_a_fragment_is_never_recorded_through_a_symlinked_sidecar(
    tmp_path: Path, outside: Path
) -> None:
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as w:
        w.write([{"a": 1}])
        with path.open("ab") as f:
            f.write(b'{"a": 2, "to')  # a co-appender died here
        path.with_name("m.jsonl.torn").symlink_to(outside)
        w.write([{"a": 3}])  # logged: cannot record it; its own line still whole
    assert outside.read_bytes() == b"precious\n"
    assert list(read_jsonl(path, on_error="skip")) == [{"a": 1}, {"a": 3}]


ANCHOR = ClockAnchor(monotonic_ns=1_000_000, wall_ns=5, pid=7, hostname="node0")


def _spans(n: int, source: str = "main", pad: int = 0) -> SpanBatch:
    spans = tuple(
        Span(f"s{i}", 1_000_000 + i, 1_000_010 + i, 11, 7, {"pad": "x" * pad} if pad else {}, None)
        for i in range(n)
    )
    return SpanBatch("tr", 1_000_000, 5, source, ANCHOR, spans)


TRACE_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from twinkle.events import IterationStarted, RunStarted
    from twinkle.hookspecs import RunContext
    from twinkle.observers import TraceSink
    from twinkle.perf import ClockAnchor

    anchor = ClockAnchor(monotonic_ns=1_000_000, wall_ns=5, pid=7, hostname="node0")
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id="tr", out_dir=Path(sys.argv[1])))
    sink.twinkle_run_started(RunStarted("tr", 1_000_000, 5, anchor))
    for i in range(100_000):
        sink.twinkle_iteration_started(IterationStarted("tr", 1_000_000 + i, 5, i))
        if i == 50_000:
            print("half", flush=True)
    time.sleep(120)
    """
)


def test_trace_json_is_replaced_whole_at_close_and_a_crash_keeps_the_previous_one(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous = b'[\n{"name": "previous"}\n]\n'
    (run_dir / "trace.json").write_bytes(previous)
    # A live sink: until it closes, readers see the previous trace, never a partial one.
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id="tr", out_dir=run_dir))
    from twinkle.events import RunStarted

    sink.twinkle_run_started(RunStarted("tr", 1_000_000, 5, ANCHOR))
    for _ in range(20):
        sink.twinkle_spans(_spans(50))
    assert (run_dir / "trace.json").read_bytes() == previous
    sink.twinkle_run_finished(RunFinished("tr", 10**12, 9))
    sink.twinkle_unconfigure()
    trace = orjson.loads((run_dir / "trace.json").read_bytes())
    assert trace[0]["name"] == "process_name" and trace[-1]["name"] == "end"
    assert sorted(p.name for p in run_dir.iterdir()) == ["trace.json"]  # no temporary left
    # A process killed half way through its trace leaves the last complete one.
    done = (run_dir / "trace.json").read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", TRACE_CHILD, str(run_dir)], stdout=subprocess.PIPE, env=ENV
    )
    assert child.stdout is not None and child.stdout.readline() == b"half\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    assert (run_dir / "trace.json").read_bytes() == done
    (left,) = [p.name for p in run_dir.iterdir() if p.name != "trace.json"]
    assert left.startswith(f".trace.json.{child.pid}.")  # the dead writer's temporary
    # A run that never started (its start failed) leaves it alone too; opening a trace
    # removes what the dead writer left.
    idle = TraceSink()
    idle.twinkle_configure(RunContext(run_id="tr", out_dir=run_dir))
    idle.twinkle_unconfigure()
    assert (run_dir / "trace.json").read_bytes() == done
    assert [p.name for p in run_dir.iterdir()] == ["trace.json"]


def test_the_trace_is_fsynced_before_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        calls.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    sink = TraceSink()
    sink.twinkle_configure(RunContext(run_id="tr", out_dir=tmp_path, replay=True))
    from twinkle.events import RunStarted

    sink.twinkle_run_started(RunStarted("tr", 1_000_000, 5, ANCHOR))
    sink.twinkle_run_finished(RunFinished("tr", 10**12, 9))
    sink.twinkle_unconfigure()
    kinds = [(kind, Path(what.split(" -> ")[-1]).name) for kind, what in calls]
    tmp_name = Path(calls[0][1]).name
    assert tmp_name.startswith(".trace.json.") and tmp_name.endswith(".tmp")
    assert kinds == [("fsync", tmp_name), ("replace", "trace.json"), ("fsync", tmp_path.name)]


# -- 3. the event log failing to open fails the start ---------------------------------------


def test_an_event_log_that_is_a_directory_fails_the_run_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "nolog"
    (run_dir / "events.jsonl").mkdir(parents=True)
    # The runtime a session and a replay share: the sink's refusal fails its start.
    pm = make_plugin_manager(autoload=False)
    run = Run(pm, RunContext("nolog", run_dir, CONFIG), background=True)
    with pytest.raises(ReporterError, match=r"events\.jsonl' is a directory; pass a file"):
        run.start()
    assert run.state is RunState.FAILED
    assert twinkle_threads() == []
    # Nothing half open: no trace put in place, no temporary left, the manager free.
    assert [p.name for p in run_dir.iterdir()] == ["events.jsonl"]  # opened first
    assert pm.in_use_by is None
    # And a session on that directory does not start either.
    session = RunSession(out_dir=tmp_path / "runs", run_id="nolog", autoload=False)
    with pytest.raises(TwinkleError, match=r"events\.jsonl"):
        session.start()
    assert session.state is not RunState.RUNNING
    assert twinkle_threads() == []


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Makes a file unwritable, for root too (the immutable attribute) where it must."""
    made: list[Path] = []

    def make(path: Path) -> None:
        path.chmod(0o444)
        if os.geteuid() == 0:
            done = subprocess.run(["chattr", "+i", str(path)], check=False, capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"cannot make a file unwritable for root here: {done.stderr!r}")
            made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_an_event_log_that_is_not_writable_fails_the_run_start(
    tmp_path: Path, unwritable: Callable[[Path], None]
) -> None:
    run_dir = tmp_path / "runs" / "ro"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_bytes(b"")
    unwritable(run_dir / "events.jsonl")
    session = RunSession(out_dir=tmp_path / "runs", run_id="ro", autoload=False)
    with pytest.raises(ReporterError, match=r"events\.jsonl'.*fix the permissions"):
        session.start()
    assert session.state is RunState.FAILED
    assert twinkle_threads() == []
    outputs = {p.name for p in run_dir.iterdir()} - {".twinkle.lock"}  # the session's
    assert outputs == {"events.jsonl"}  # nothing else was opened


# -- 4. one line limit ------------------------------------------------------------------------


def _run_with_big_span_batch(out: Path, spans: int, pad: int) -> Path:
    """Two iterations, each publishing one batch of ``spans`` spans of ``pad`` bytes."""
    clock = ManualClock(10**9)
    with RunSession(
        out_dir=out,
        run_id="big",
        config=CONFIG,
        autoload=False,
        clock=clock,
        wall_clock=lambda: 1_700_000_000_000_000_000 + clock(),
        background_writer=False,
    ) as run:
        for i in range(2):
            run.bus.iteration_started(i)
            for k in range(spans):
                with run.recorder.span(f"s{k}", pad="x" * pad):
                    clock.advance(10)
            clock.advance(1_000_000)
    assert run.out_dir is not None
    return run.out_dir


def test_a_span_batch_over_the_line_limit_is_split_and_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 64 << 10
    monkeypatch.setattr(jsonl_mod, "MAX_LINE_BYTES", limit)
    run_dir = _run_with_big_span_batch(tmp_path / "live", spans=400, pad=500)  # ~230 KiB
    raw = (run_dir / "events.jsonl").read_bytes()
    assert max(len(line) + 1 for line in raw.splitlines()) <= limit
    lines = event_lines(run_dir / "events.jsonl")
    assert [o["seq"] for o in lines] == list(range(len(lines)))
    pieces = [o for o in lines if o["type"] == "spans" and o["source"] == "main"]
    assert len(pieces) > 2 * 3  # each of the two batches went out as several lines
    for key in ("run_id", "anchor", "monotonic_ns", "wall_ns"):
        assert len({orjson.dumps(p[key]) for p in pieces}) <= 2
    names = [s["name"] for p in pieces for s in span_list(p)]
    assert names == [f"s{i}" for i in range(400)] * 2  # every span, in order
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["observer_failures"] == {}
    # The log replays into the records the live run wrote.
    events = (event_from_dict({k: v for k, v in o.items() if k != "seq"}) for o in lines)
    replay(events, tmp_path / "replayed", autoload=False)
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        assert (tmp_path / "replayed" / name).read_bytes() == (run_dir / name).read_bytes()


def test_a_split_span_batch_carries_its_dropped_count_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_mod, "MAX_LINE_BYTES", 4096)
    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id="tr", out_dir=tmp_path, replay=True))
    batch = msgspec.structs.replace(_spans(40, pad=300), dropped=7)
    sink.twinkle_event(batch)
    sink.twinkle_unconfigure()
    pieces = event_lines(tmp_path / "events.jsonl")
    assert len(pieces) > 2
    # 7 spans were dropped once, not once per line: a replay adds the pieces up.
    assert [p["dropped"] for p in pieces] == [7] + [0] * (len(pieces) - 1)
    assert [s["name"] for p in pieces for s in span_list(p)] == [f"s{i}" for i in range(40)]


def test_an_event_too_big_for_a_line_is_refused_named_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_mod, "MAX_LINE_BYTES", 4096)
    from twinkle.events import IterationStarted, Snapshot

    sink = EventLogSink()
    sink.twinkle_configure(RunContext(run_id="tr", out_dir=tmp_path, replay=True))
    sink.twinkle_event(IterationStarted("tr", 1, 2, 0))
    with pytest.raises(RecordError, match=r"'snapshot' is \d+ bytes.*MAX_LINE_BYTES=4096"):
        sink.twinkle_event(Snapshot("tr", 3, 4, {"blob": "b" * 5000}))
        sink.flush()
    one_span_too_big = _spans(2, pad=5000)
    sink.twinkle_event(one_span_too_big)
    with pytest.raises(RecordError, match=r"span 0 \('s0'\).*alone makes a line longer"):
        sink.twinkle_event(IterationStarted("tr", 5, 6, 1))
    sink.twinkle_unconfigure()
    assert sink.unwritable == 2
    lines = event_lines(tmp_path / "events.jsonl")
    assert [(o["seq"], o["type"]) for o in lines] == [
        (0, "iteration_started"),
        (1, "iteration_started"),
    ]


def test_the_default_writer_and_reader_limits_agree(tmp_path: Path) -> None:
    limit = jsonl_mod.MAX_LINE_BYTES
    path = tmp_path / "limit.jsonl"
    longest = {"pad": "x" * (limit - len(b'{"pad":""}\n'))}
    with JsonlWriter(path) as w:
        assert w.max_line_bytes == limit
        w.write([{"n": 0}, longest])  # the longest line the writer writes...
        with pytest.raises(RecordError, match=rf"line 0 .* longer than MAX_LINE_BYTES={limit}"):
            w.write([{"pad": longest["pad"] + "x"}])
    assert path.stat().st_size == len(b'{"n":0}\n') + limit
    with JsonlWriter(path) as again:  # ...is one it reopens without complaint
        assert again.recovery is None
        assert again.last_object() == longest
    assert list(read_jsonl(path)) == [{"n": 0}, longest]  # ...and reads back
    del longest
    with path.open("ab") as f:  # a line one byte longer than any twinkle writes
        f.write(b'{"pad":"' + b"y" * (limit - 10) + b'"}\n')
    reader = read_jsonl(path)
    with pytest.raises(RecordError, match=r"limit\.jsonl:3: line longer than MAX_LINE_BYTES"):
        list(reader)
    assert reader.lineno == 2


BOUNDED_READ = textwrap.dedent(
    """
    import resource, sys
    from twinkle.errors import RecordError
    from twinkle.reporting import read_jsonl
    # Room for the line limit and some: a reader holding a 2 GiB line would not fit.
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1])
    resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (768 << 20),) * 2)
    try:
        list(read_jsonl(sys.argv[1]))
    except RecordError as exc:
        print("refused:", exc)
    """
)


def test_a_2_gib_line_without_newline_is_a_record_error_not_a_memory_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sparse.jsonl"
    with path.open("wb") as f:
        f.write(b'{"ok": 1}\n')
        f.truncate(2 << 30)  # a sparse 2 GiB tail of zero bytes, no newline
    out = subprocess.run(
        [sys.executable, "-c", BOUNDED_READ, str(path)],
        check=False,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused:" in out.stdout and "sparse.jsonl:2: line longer than MAX_LINE_BYTES" in (
        out.stdout
    )
    with pytest.raises(ReporterError, match=r"last line .* longer than MAX_LINE_BYTES"):
        JsonlWriter(path)  # the torn-tail repair has the same limit
    path.unlink()


# -- 7. durability at close -----------------------------------------------------------------


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths ``os.fsync`` is called on, in order."""
    paths: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield paths


def test_every_jsonl_file_is_fsynced_at_close_and_a_new_ones_directory_once(
    tmp_path: Path, fsynced: list[str]
) -> None:
    path = tmp_path / "d" / "new.jsonl"
    with JsonlWriter(path) as w:
        w.write([{"a": 1}])
        assert fsynced == []  # nothing on the hot path
    assert fsynced == [str(path), str(path.parent)]
    fsynced.clear()
    with JsonlWriter(path) as w:  # it exists: no directory entry to make durable
        w.write([{"a": 2}])
    assert fsynced == [str(path)]
    fsynced.clear()
    with JsonlWriter(path, fsync=True) as w:
        w.write([{"a": 3}])
        w.write([{"a": 4}])
    assert fsynced == [str(path)] * 3


def test_a_run_makes_its_logs_and_records_durable_before_the_summary(
    tmp_path: Path, fsynced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        order.extend(Path(p).name for p in fsynced)
        fsynced.clear()
        order.append(f"rename {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    scripted_run(tmp_path)
    done = order[: order.index("rename summary.json")]
    for name in ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl"):
        assert name in done, order
    assert done.index("rename trace.json") > done.index(
        next(n for n in done if n.startswith(".trace.json."))
    )


# -- 8 and the rest: bad input -------------------------------------------------------------


def test_write_of_a_single_dict_or_string_is_refused_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as w:
        for value in ({"a": 1}, "ab", b"ab"):
            with pytest.raises(Exception, match=r"iterable of objects.*wrap it in a list"):
                w.write(value)
        with pytest.raises(Exception, match=r"write_bytes_lines\(\[value\]\)"):
            w.write_bytes_lines(b'{"a":1}\n')  # type: ignore[arg-type]  # one bytes is the point
    assert path.read_bytes() == b""
