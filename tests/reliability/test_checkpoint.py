"""Checkpoints: a segment that finishes leaves its observers' state; the next resume
feeds only the log's tail and writes what a resume from the whole log writes, byte for
byte. A checkpoint that does not fit (cut, changed, another config, another code, a
plugin) is passed over, saying why, and the whole log is fed again: never a wrong
figure."""

from __future__ import annotations

import enum
import logging
import os
import pickle
import shutil
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import twinkle.run._checkpoint as checkpoint_module
import twinkle.run._checkpointing as run_module
import twinkle.run._resume as resume_module
from reliability._scripted import CONFIG, killed_when_ready, segment
from reliability.test_reliability_resume import DERIVED, assert_replay_identical, echo_segment
from twinkle.errors import ConfigError, ReplayError, ReporterError
from twinkle.events import IterationStarted
from twinkle.hookspecs import hookimpl
from twinkle.observers._record_sinks import _copy_replanned
from twinkle.perf import ClockAnchor, ManualClock, Span, WorkerReport
from twinkle.reporting import JsonlWriter, line_ending_at
from twinkle.reporting._jsonl_files import open_regular
from twinkle.run import Follower, Resumed, RunSession
from twinkle.run._checkpoint import (
    CHECKPOINT_FILE,
    DIGEST,
    HEADER_BYTES,
    Checkpoint,
    _digest,
    log_edited,
    log_unlike_checkpoint,
)
from twinkle.run._checkpoint import write as write_checkpoint
from twinkle.run._state_pickle import read_state

OUTPUTS = ("events.jsonl", *DERIVED)
HOUR = 3600 * 10**9


def _outputs(run_dir: Path) -> dict[str, object]:
    """The run's files, but for what the last session's record backends handled (the
    records they wrote: a resume from a checkpoint writes only the new ones, its other
    records are the lines it copied) in its ``backends_closed`` and the summary."""
    files: dict[str, object] = {name: (run_dir / name).read_bytes() for name in OUTPUTS}
    log = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    summary = orjson.loads(files["summary.json"])  # type: ignore[arg-type]
    closed = [e["backends"] for e in log if e["type"] == "backends_closed"]
    for health in (*closed, summary["backends"]):
        for backend in health.values():
            del backend["records"], backend["records_written"]
    files["events.jsonl"] = log
    files["summary.json"] = {k: v for k, v in summary.items() if k != "segments"}
    files["segments"] = [
        {k: v for k, v in s.items() if k != "backends"} for s in summary["segments"]
    ]
    return files


def _twins(tmp_path: Path) -> tuple[Path, Path]:
    """A finished first segment, in two copies: ``with`` keeps its checkpoint,
    ``without`` has none (a resume there feeds the whole log)."""
    segment(tmp_path / "with", iterations=3, wall_offset_ns=0)
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    (tmp_path / "without" / "r" / CHECKPOINT_FILE).unlink()
    return tmp_path / "with", tmp_path / "without"


def test_a_resume_from_the_checkpoint_writes_what_a_whole_log_resume_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_, without = _twins(tmp_path)
    logged = len((with_ / "r" / "events.jsonl").read_bytes().splitlines())
    records = [with_ / "r" / name for name in ("metrics_raw.jsonl", "metrics.jsonl")]
    inodes = [path.stat().st_ino for path in records]
    for k in (1, 2):  # two restarts: the second's checkpoint is the first restart's
        (without / "r" / CHECKPOINT_FILE).unlink(missing_ok=True)
        with caplog.at_level(logging.WARNING):
            a = segment(with_, iterations=3, wall_offset_ns=k * HOUR)
        # (each file held just the checkpoint's lines: the new ones were appended to it)
        assert [path.stat().st_ino for path in records] == inodes
        assert not caplog.records, "the record files' copied heads count as lines they hold"
        b = segment(without, iterations=3, wall_offset_ns=k * HOUR)
        assert a.resumed is not None and b.resumed is not None
        assert a.resumed.restored_events == a.resumed.events == logged
        assert b.resumed.restored_events == 0 and b.resumed.events == logged
        assert _outputs(with_ / "r") == _outputs(without / "r")
        logged = len((with_ / "r" / "events.jsonl").read_bytes().splitlines())
    assert_replay_identical(with_ / "r", tmp_path)


def _killed_segment(
    out: Path, every: int = 10**9, *, plugins: str = "[]", background: bool = False
) -> None:
    """A process runs (or resumes) run ``r`` in ``out``, taking a checkpoint at the
    first iteration boundary after every ``every`` events, and is killed outright
    mid-segment; ``plugins``: the session's, as Python source (the tests importable);
    ``background``: its dispatch."""
    script = textwrap.dedent(
        f"""
        import sys
        import time
        sys.path[:0] = {[str(p) for p in Path(__file__).resolve().parents[:2]]!r}
        import twinkle.run._checkpointing
        from twinkle.run import RunSession
        twinkle.run._checkpointing.CHECKPOINT_EVERY = {every}
        with RunSession(out_dir={str(out)!r}, run_id="r", config={CONFIG!r},
                        autoload=False, resume=True, plugins={plugins},
                        background_dispatch={background}) as run:
            first = run.resumed.next_iteration if run.resumed else 0
            for i in range(first, first + 1000):
                run.bus.iteration_started(i)
                with run.recorder.span("generate", iteration=i):
                    time.sleep(0.001)
                run.bus.samples(iteration=i, phase="rollout", lengths=[5], groups=1)
                if i == first + 3:
                    print("ready", flush=True)
        """
    )
    killed_when_ready(script)


def _followed(run_dir: Path, *, from_checkpoint: bool) -> tuple[Any, ...]:
    """What a follower of ``run_dir`` makes of its files: its snapshot's parts."""
    with Follower(run_dir, from_checkpoint=from_checkpoint) as follower:
        follower.poll()
        snap = follower.snapshot()
        if from_checkpoint:
            assert follower.whole_log_why is None, follower.whole_log_why
    return snap.events, snap.finished, snap.summary, snap.records


@pytest.mark.parametrize("every", [10**9, 20])
def test_a_run_in_progress_is_followed_from_its_checkpoint_as_from_its_whole_log(
    tmp_path: Path, every: int
) -> None:
    """A finished segment, then one killed outright: the checkpoint is the killed
    one's own, taken as it began (``every`` 10**9) or a running one's at a later
    boundary (20). A follower (``twinkle
    report`` of a run in progress, ``twinkle watch``) starts from it, reading the log
    after it and the records before it from ``metrics_raw.jsonl``: its snapshot is the
    one a follower of the whole log makes; one whose records are not what the
    checkpoint marks reads the whole log, saying why."""
    segment(tmp_path, iterations=3, wall_offset_ns=0)
    _killed_segment(tmp_path, every)
    run_dir = tmp_path / "r"
    marked = orjson.loads((run_dir / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    logged = len(lines)
    began = 1 + next(i for i, line in enumerate(lines) if b'"type":"run_resumed"' in line)
    # the killed segment's events after it (as it began); or (a later one) none or a
    # few: the follower's last event is then the one before the checkpoint's offset
    assert marked["scan"]["segments"] == 2
    assert marked["events"] == began < logged if every > 20 else began <= marked["events"]
    whole = _followed(run_dir, from_checkpoint=False)
    assert whole[:2] == (logged, False)
    assert _followed(run_dir, from_checkpoint=True) == whole
    size, _, _, name = marked["files"]["metrics_raw.jsonl"]
    os.truncate(run_dir / name, size - 1)
    with Follower(run_dir) as follower:
        assert f"metrics_raw.jsonl holds {size - 1} bytes, fewer than its {size}" in str(
            follower.whole_log_why
        )


def test_a_follower_reads_the_whole_log_when_the_checkpoint_cannot_serve_it(
    tmp_path: Path,
) -> None:
    """Not a failure of the report or the watch, the whole log read instead (saying
    why), as its snapshot: a line before the checkpoint's last 64 KiB that is no record
    (its digest cannot see it), and the log behind a symbolic link."""
    segment(tmp_path, iterations=60, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    whole = _followed(run_dir, from_checkpoint=False)
    records = run_dir / "metrics_raw.jsonl"
    data = records.read_bytes()
    assert len(data) > 2 * 64 * 1024
    first = data.index(b"\n")
    records.write_bytes(b"{" * first + data[first:])  # (the same length)
    with Follower(run_dir) as follower:
        assert "the files it marks changed since" in str(follower.whole_log_why)
    # JSON, but no record (it failed the snapshot with KeyError 'scope')
    other = orjson.dumps({"kind": "timing", "x": "y" * (first - 24)})
    assert len(other) == first
    records.write_bytes(other + data[first:])
    with Follower(run_dir) as follower:
        why = str(follower.whole_log_why)
        assert "metrics_raw.jsonl line 1: not a record" in why and "scope" in why
        follower.poll()
        snap = follower.snapshot()
    assert (snap.events, snap.finished, snap.summary, snap.records) == whole
    records.write_bytes(data)
    linked = tmp_path / "linked"
    linked.mkdir()
    for entry in run_dir.iterdir():
        if entry.name != "events.jsonl":
            shutil.copy(entry, linked / entry.name)
    (linked / "events.jsonl").symlink_to(run_dir / "events.jsonl")
    with Follower(linked) as follower:
        assert "events.jsonl is a symbolic link" in str(follower.whole_log_why)
        follower.poll()
        snap = follower.snapshot()
    assert (snap.events, snap.finished, snap.summary, snap.records) == whole


def test_a_follower_of_segments_configured_a_b_a_reads_the_log_once_more_at_most(
    tmp_path: Path,
) -> None:
    """Three segments planning 10, 20 and 10 steps (a resume may change total_steps):
    the observers work to the newest segment's configuration. Reading the log whole,
    the follower starts again once per later configuration, never again for an
    earlier one met on the way (A, B, A looped forever before), and its snapshot is the
    replay's."""
    for k, steps in enumerate((10, 20, 10)):
        segment(tmp_path, {**CONFIG, "total_steps": steps}, iterations=2, wall_offset_ns=k * HOUR)
    run_dir = tmp_path / "r"
    logged, finished, summary, records = _followed(run_dir, from_checkpoint=False)
    assert logged == len((run_dir / "events.jsonl").read_bytes().splitlines())
    assert finished and summary == orjson.loads((run_dir / "summary.json").read_bytes())
    assert records == [
        orjson.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()
    ]


def test_the_line_before_an_offset_is_found_however_long(tmp_path: Path) -> None:
    path = tmp_path / "log"
    lines = [b"a" * 10, b"b" * 300_000, b"c" * 5]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    ends = [11, 11 + 300_001, 11 + 300_001 + 6]
    assert [line_ending_at(path, end, 10**6) for end in ends] == lines
    assert line_ending_at(path, ends[1], 200_000) is None  # (past the limit)


def test_a_segment_killed_after_the_checkpoint_is_fed_from_the_log(tmp_path: Path) -> None:
    """The checkpoint is the finished segment's; the killed one after it is in the
    log's tail: fed again, closed as an error, and the run goes on."""
    segment(tmp_path / "with", iterations=3, wall_offset_ns=0)
    _killed_segment(tmp_path / "with")
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    (tmp_path / "without" / "r" / CHECKPOINT_FILE).unlink()
    for out in (tmp_path / "with", tmp_path / "without"):
        segment(out, iterations=2, wall_offset_ns=HOUR)
    assert _outputs(tmp_path / "with" / "r") == _outputs(tmp_path / "without" / "r")
    summary = orjson.loads((tmp_path / "with" / "r" / "summary.json").read_bytes())
    assert [s["status"] for s in summary["segments"]] == ["ok", "error", "ok"]
    assert_replay_identical(tmp_path / "with" / "r", tmp_path)


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
@pytest.mark.parametrize("resumed", [False, True])
def test_a_segment_killed_outright_resumes_from_its_own_last_checkpoint(
    tmp_path: Path, resumed: bool, background: bool
) -> None:
    """A running segment takes a checkpoint every few events (here 20): killed outright,
    its restart feeds only the events since the last one. Its record files then are a
    first segment's own, or (``resumed``) a rebuild's temporary ones, and its trace the
    killed process's temporary file: a resume copies their heads from there. With
    background dispatch too: there the checkpoint is taken on the dispatch thread."""
    if resumed:
        segment(tmp_path / "with", iterations=2, wall_offset_ns=0)
    _killed_segment(tmp_path / "with", every=20, background=background)
    marked = orjson.loads((tmp_path / "with" / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    assert marked["files"]["trace.json"][3].endswith(".tmp")  # the killed process's
    a = assert_resumes_agree(tmp_path, lambda out: segment(out, iterations=2, wall_offset_ns=HOUR))
    assert a.events - a.restored_events < 40  # the tail: since the last checkpoint


def assert_resumes_agree(tmp_path: Path, resume: Callable[[Path], RunSession]) -> Resumed:
    """The run in ``tmp_path / "with"`` resumed by ``resume`` from its checkpoint, and a
    copy of it without the checkpoint resumed from the whole log, write the same (and
    what a replay of the first writes); the first's resume."""
    with_, without = tmp_path / "with", tmp_path / "without"
    marked = orjson.loads((with_ / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    shutil.copytree(with_, without)
    (without / "r" / CHECKPOINT_FILE).unlink()
    a, b = resume(with_).resumed, resume(without).resumed
    assert a is not None and b is not None
    assert 0 < a.restored_events == marked["events"] <= a.events
    assert b.restored_events == 0 and b.events == a.events
    assert _outputs(with_ / "r") == _outputs(without / "r")
    assert_replay_identical(with_ / "r", tmp_path)
    return a


def test_a_resume_in_place_that_fails_cuts_the_record_files_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment killed just after its checkpoint leaves record files that hold just the
    lines it covers: a resume appends to them where they are. One that fails before the
    new segment begins (here Ctrl-C, once the killed segment is closed in the log)
    leaves them as they were, with no record of the logged tail and no WebUI line it
    held open, and a later restart resumes the run."""
    _killed_segment(tmp_path, every=20)
    run_dir = tmp_path / "r"
    marked = orjson.loads((run_dir / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        size, _, _, path = marked["files"][name]
        assert path == name
        os.truncate(run_dir / name, size)  # (killed before it wrote more)
    records = ("metrics_raw.jsonl", "metrics.jsonl")
    before = {name: (run_dir / name).read_bytes() for name in records}

    def interrupted(**_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(resume_module, "Resumed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False, resume=True).start()
    assert {name: (run_dir / name).read_bytes() for name in records} == before
    monkeypatch.undo()
    segment(tmp_path, iterations=2, wall_offset_ns=HOUR)
    assert_replay_identical(run_dir, tmp_path)


def _cut_payload(run_dir: Path) -> None:
    path = run_dir / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:-10])


def _garbage(run_dir: Path) -> None:
    (run_dir / CHECKPOINT_FILE).write_bytes(b"not a checkpoint\n\x00\x01")


def _other_code(run_dir: Path) -> None:
    path = run_dir / CHECKPOINT_FILE
    head, _, payload = path.read_bytes().partition(b"\n")
    header = orjson.loads(head)
    header["code"] = "0" * 64
    path.write_bytes(orjson.dumps(header) + b"\n" + payload)


def _planted_code(run_dir: Path) -> None:
    """A pickle that would run a command, under a header that vouches for it."""
    path = run_dir / CHECKPOINT_FILE
    head, _, _ = path.read_bytes().partition(b"\n")
    header = orjson.loads(head)
    payload = pickle.dumps(os.system)
    header[DIGEST] = _digest(header, payload)
    path.write_bytes(orjson.dumps(header) + b"\n" + payload)


def _edited_header(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A checkpoint whose header line is edited by ``edit`` (still JSON, the state and
    the digest as written)."""

    def spoil(run_dir: Path) -> None:
        path = run_dir / CHECKPOINT_FILE
        head, _, payload = path.read_bytes().partition(b"\n")
        header = orjson.loads(head)
        edit(header)
        path.write_bytes(orjson.dumps(header) + b"\n" + payload)

    spoil.__name__ = edit.__name__
    return spoil


def _fewer_events(header: dict[str, Any]) -> None:
    header["events"] -= 1


def _later_iteration(header: dict[str, Any]) -> None:
    header["scan"]["last_iteration"] += 1  # (the trainer would skip an iteration)


def _fifo(run_dir: Path) -> None:
    """A FIFO in the checkpoint's place: reading it would wait for a writer forever."""
    (run_dir / CHECKPOINT_FILE).unlink()
    os.mkfifo(run_dir / CHECKPOINT_FILE)


def _link_to_device(run_dir: Path) -> None:
    """A symbolic link to an endless device: reading it would fill the memory."""
    (run_dir / CHECKPOINT_FILE).unlink()
    (run_dir / CHECKPOINT_FILE).symlink_to("/dev/zero")


def _changed_trace(run_dir: Path) -> None:
    path = run_dir / "trace.json"
    data = bytearray(path.read_bytes())
    data[40] = ord(" ") if data[40] != ord(" ") else ord("\t")
    path.write_bytes(bytes(data))


def _huge(run_dir: Path) -> None:
    """3 GB of zeros (a sparse file): no header line."""
    with (run_dir / CHECKPOINT_FILE).open("wb") as f:
        f.truncate(3 * 2**30)


def _another_runs(run_dir: Path) -> None:
    """Another run's checkpoint, whole (copied in from run ``other``'s directory: it
    marks that run's log, of one iteration)."""
    other = run_dir.parent.parent / "other"
    segment(other, iterations=1, wall_offset_ns=0)
    header = orjson.loads((other / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    theirs = checkpoint_module.load(other / "r", "r", header["observers"])
    assert isinstance(theirs, Checkpoint)
    theirs.run_id = "other"
    write_checkpoint(run_dir, theirs)


def test_another_runs_checkpoint_is_not_taken_for_an_edit_of_the_log(tmp_path: Path) -> None:
    """A checkpoint copied in from run ``other`` says nothing of this run's log: the log
    is not called changed (the resume passes the checkpoint over naming its run, above)."""
    with_, _ = _twins(tmp_path)
    _another_runs(with_ / "r")
    assert log_unlike_checkpoint(with_ / "r") is None and log_edited(with_ / "r") is None
    assert segment(with_, iterations=1, wall_offset_ns=HOUR).resumed is not None
    # a log that cannot be read is still said to be unlike what the checkpoint marks
    log = with_ / "r" / "events.jsonl"  # (the resume's own checkpoint marks it now)
    log.rename(tmp_path / "kept.jsonl")
    log.mkdir()
    assert "events.jsonl" in (log_unlike_checkpoint(with_ / "r") or "")


def _cut_records(run_dir: Path) -> None:
    path = run_dir / "metrics_raw.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (_cut_payload, "cut or changed"),
        (_edited_header(_fewer_events), "cut or changed"),
        (_edited_header(_later_iteration), "cut or changed"),
        (_fifo, "checkpoint.bin is not a regular file"),
        (_link_to_device, "checkpoint.bin is a symbolic link"),
        (_garbage, "not a checkpoint twinkle wrote"),
        (_huge, "not a checkpoint twinkle wrote"),
        (_other_code, "written by another twinkle"),
        (_planted_code, "cannot be read back (UnpicklingError: a checkpoint holds only twinkle"),
        (_changed_trace, "trace.json no longer begins with the bytes"),
        (_cut_records, "metrics_raw.jsonl holds"),
        (_another_runs, "it is run 'other''s, not 'r''s"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_passed_over_saying_why(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spoil: Callable[[Path], None],
    why: str,
) -> None:
    with_, without = _twins(tmp_path)
    spoil(with_ / "r")
    if spoil in (_changed_trace, _cut_records):  # (the run's files: both copies alike)
        spoil(without / "r")
    with caplog.at_level(logging.WARNING, logger="twinkle.session"):
        a = segment(with_, iterations=2, wall_offset_ns=HOUR)
    assert a.resumed is not None and a.resumed.restored_events == 0
    assert any(why in r.getMessage() and "whole log" in r.getMessage() for r in caplog.records)
    segment(without, iterations=2, wall_offset_ns=HOUR)
    assert _outputs(with_ / "r") == _outputs(without / "r")


def test_a_log_edited_before_its_checkpoints_mark_is_not_resumed_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line of the part the checkpoint covers edited (not only cut short): resuming
    would rebuild the run's figures from what the log says now, so the resume is
    refused, naming both fixes, and nothing is written; without the checkpoint (its
    second fix) the run resumes from the log as it is. A log cut short resumes from
    the whole log, saying why, as before."""
    with_, _ = _twins(tmp_path)
    run_dir = with_ / "r"
    log = run_dir / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"type":"samples"' in line)
    lines[at] = lines[at].replace(b'"lengths":[', b'"lengths":[999999,', 1)
    cut = run_dir.parent.parent / "cut"
    shutil.copytree(with_, cut)
    log.write_bytes(b"".join(lines))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(ConfigError, match=r"events\.jsonl changed since the run wrote it") as e:
        segment(with_, iterations=1, wall_offset_ns=HOUR)
    assert "Restore the original log" in str(e.value) and "remove '" in str(e.value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    (run_dir / CHECKPOINT_FILE).unlink()
    resumed = segment(with_, iterations=1, wall_offset_ns=HOUR).resumed
    assert resumed is not None and resumed.restored_events == 0
    cut_log = cut / "r" / "events.jsonl"  # (whole lines cut, before the mark)
    cut_log.write_bytes(b"".join(cut_log.read_bytes().splitlines(keepends=True)[:-3]))
    with caplog.at_level(logging.WARNING, logger="twinkle.session"):
        # (a segment that takes no checkpoint of its own: the trace blocked)
        resumed = segment(cut, iterations=3, wall_offset_ns=HOUR, blocked=("trace",)).resumed
    assert resumed is not None and resumed.restored_events == 0
    assert any("whole log" in r.getMessage() for r in caplog.records)
    # The cut log's checkpoint was removed before the log grew past its mark: what the
    # segment appended there is not read as an edit by the next resume.
    assert not (cut / "r" / CHECKPOINT_FILE).exists()
    assert segment(cut, iterations=1, wall_offset_ns=2 * HOUR).resumed is not None


def test_a_new_run_of_a_run_id_whose_files_were_removed_drops_their_checkpoint(
    tmp_path: Path,
) -> None:
    """The run's files removed but its checkpoint: a new run of the id killed before a
    checkpoint of its own (none taken here: the trace blocked) is resumed, not refused
    as an edit of the old run's log."""
    segment(tmp_path, iterations=3)
    for path in (tmp_path / "r").iterdir():
        if path.name != CHECKPOINT_FILE:
            path.unlink()
    segment(tmp_path, iterations=4, blocked=("trace",))
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()
    resumed = segment(tmp_path, iterations=1, wall_offset_ns=HOUR).resumed
    assert resumed is not None and resumed.restored_events == 0


class _Counted:
    """A file whose bytes read are counted."""

    def __init__(self, f: Any) -> None:
        self.f, self.read_bytes = f, 0

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self.f.readline(size)
        self.read_bytes += len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.f.read(size)
        self.read_bytes += len(data)
        return data

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


@pytest.mark.parametrize("spoil", [_huge, _other_code])
def test_a_checkpoint_another_code_wrote_is_not_read_past_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path], None]
) -> None:
    """A 3 GB file with no header line used to be read whole (a MemoryError under a
    memory limit, 20 s and 6 GB without); it is read to its first MiB, and a header of
    another code's to its end of line: the state is read only for this code's."""
    segment(tmp_path, iterations=3, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    spoil(run_dir)
    opened: list[_Counted] = []
    real = open_regular

    def counted(path: Path) -> _Counted:
        opened.append(_Counted(real(path)))
        return opened[-1]

    monkeypatch.setattr(checkpoint_module, "open_regular", counted)
    why = checkpoint_module.load(run_dir, "r", [])
    assert isinstance(why, str)
    [f] = opened
    if spoil is _huge:
        assert "not a checkpoint twinkle wrote" in why
        assert f.read_bytes == HEADER_BYTES + 1
    else:
        assert "written by another twinkle" in why
        assert f.read_bytes < 10_000 < os.path.getsize(run_dir / CHECKPOINT_FILE)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_record_file_that_is_a_fifo_fails_the_resume_naming_it(
    tmp_path: Path, checkpoint: bool
) -> None:
    """A FIFO planted as ``metrics_raw.jsonl`` is neither waited on (a resume counts
    the lines of the file it rebuilds) nor taken for the checkpoint's lines: the resume
    fails at once naming the file and the fix, and the log is as it was."""
    segment(tmp_path, iterations=3, wall_offset_ns=0)
    run_dir = tmp_path / "r"
    if not checkpoint:
        (run_dir / CHECKPOINT_FILE).unlink()
    log = (run_dir / "events.jsonl").read_bytes()
    (run_dir / "metrics_raw.jsonl").unlink()
    os.mkfifo(run_dir / "metrics_raw.jsonl")
    with pytest.raises(ReporterError, match=r"metrics_raw.jsonl is not a regular file.*move it"):
        segment(tmp_path, iterations=2, wall_offset_ns=HOUR)
    assert (run_dir / "events.jsonl").read_bytes() == log


def test_a_resume_that_plans_more_steps_starts_from_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A resume may change ``total_steps`` and the caller's ``x_`` keys: the checkpoint
    serves it, and the copied WebUI lines carry the new plan, as a whole-log resume
    writes them."""
    with_, without = _twins(tmp_path)
    more = {**CONFIG, "total_steps": 99, "x_note": "longer"}
    inodes = [(with_ / "r" / name).stat().st_ino for name in ("metrics_raw.jsonl", "metrics.jsonl")]
    with caplog.at_level(logging.WARNING):
        a = segment(with_, more, iterations=2, wall_offset_ns=HOUR)
    assert not caplog.records
    b = segment(without, more, iterations=2, wall_offset_ns=HOUR)
    assert inodes[0] == (with_ / "r" / "metrics_raw.jsonl").stat().st_ino  # (appended)
    assert inodes[1] != (with_ / "r" / "metrics.jsonl").stat().st_ino  # (lines rewritten)
    assert a.resumed is not None and a.resumed.restored_events == a.resumed.events > 0
    assert _outputs(with_ / "r") == _outputs(without / "r")
    webui = [orjson.loads(x) for x in (with_ / "r" / "metrics.jsonl").read_bytes().splitlines()]
    assert len(webui) == 5 and {line["total_steps"] for line in webui} == {99}
    assert b.resumed is not None and b.resumed.restored_events == 0


def test_only_twinkles_webui_lines_are_given_a_new_plan(tmp_path: Path) -> None:
    """The copied head's lines get the new ``total_steps`` and keep every other byte;
    a line twinkle did not write (the checkpoint's mark covers only the file's last
    64 KiB) fails the resume naming the file, the line and the fix."""
    good = b'{"ts":1.5,"step":2,"total_steps":10,"iteration":0,"a/b":0.1}\n'
    source = tmp_path / "metrics.jsonl"
    source.write_bytes(good * 2 + b'{"ts":2.5,"step":3}\n')
    with source.open("rb") as f:
        _copy_replanned(f, tmp_path / "new", 2 * len(good), 123)
    assert (tmp_path / "new").read_bytes() == good.replace(b":10,", b":123,") * 2
    source.write_bytes(good + good.replace(b'"ts":', b'"ts" :'))
    with source.open("rb") as f, pytest.raises(ReporterError) as caught:
        _copy_replanned(f, tmp_path / "new", source.stat().st_size, 123)
    assert "metrics.jsonl' line 2 is not a line twinkle wrote" in str(caught.value)
    assert "move checkpoint.bin out of the run directory" in str(caught.value)


def test_a_run_with_a_plugin_writes_no_checkpoint_and_resumes_from_its_log(
    tmp_path: Path,
) -> None:
    """A plugin rebuilds its outputs from the events it sees: a run that has one is fed
    the whole log again."""
    echo_segment(tmp_path, 2)
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()
    again = echo_segment(tmp_path, 2)
    assert again.resumed is not None and again.resumed.restored_events == 0
    assert_replay_identical(tmp_path / "r", tmp_path)


def test_a_run_with_a_built_in_observer_blocked_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """A blocked observer is not the run's: the others' state is checkpointed and a
    resume with the same block starts from it, writing what a whole-log resume writes."""
    segment(tmp_path / "with", iterations=3, blocked=("mfu",))
    assert (tmp_path / "with" / "r" / CHECKPOINT_FILE).exists()
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    (tmp_path / "without" / "r" / CHECKPOINT_FILE).unlink()
    a = segment(tmp_path / "with", iterations=2, wall_offset_ns=HOUR, blocked=("mfu",))
    b = segment(tmp_path / "without", iterations=2, wall_offset_ns=HOUR, blocked=("mfu",))
    assert a.resumed is not None and a.resumed.restored_events == a.resumed.events > 0
    assert b.resumed is not None and b.resumed.restored_events == 0
    assert _outputs(tmp_path / "with" / "r") == _outputs(tmp_path / "without" / "r")


@pytest.mark.parametrize("first", ["finished", "killed"])
def test_a_resume_killed_before_its_first_boundary_leaves_a_checkpoint_that_fits(
    tmp_path: Path, first: str
) -> None:
    """A resume re-plans ``metrics.jsonl`` (a new ``total_steps``) and removes the killed
    process's temporary trace, both files the checkpoint it came from marks; killed
    before its first boundary (in its set-up: loading a model), it left no checkpoint
    that fits, and every later resume read the whole log. Its own, taken as it began,
    serves the next resume, which writes what a resume from the whole log writes."""
    if first == "finished":
        segment(tmp_path, iterations=3, wall_offset_ns=0)
    else:
        _killed_segment(tmp_path, every=20)
    script = textwrap.dedent(
        f"""
        import sys
        import time
        sys.path[:0] = {[str(p) for p in Path(__file__).resolve().parents[:2]]!r}
        from twinkle.run import RunSession
        with RunSession(out_dir={str(tmp_path)!r}, run_id="r",
                        config={ {**CONFIG, "total_steps": 77}!r}, autoload=False,
                        resume=True) as run:
            print("ready", flush=True)
            time.sleep(60)
        """
    )
    killed_when_ready(script)
    without = tmp_path / "without"
    shutil.copytree(tmp_path / "r", without / "r")
    (without / "r" / CHECKPOINT_FILE).unlink()
    a = segment(tmp_path, {**CONFIG, "total_steps": 77}, iterations=2, wall_offset_ns=HOUR)
    assert a.resumed is not None and a.resumed.restored_events == a.resumed.events
    segment(without, {**CONFIG, "total_steps": 77}, iterations=2, wall_offset_ns=HOUR)
    assert _outputs(tmp_path / "r") == _outputs(without / "r")
    assert_replay_identical(tmp_path / "r", tmp_path)


def test_no_checkpoint_is_taken_while_a_resume_feeds_the_log_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints start once the logged events went by again: one taken among them
    would say the whole log was seen. The first is the resumed segment's own, once it
    began: it covers every event logged, its run_resumed the last."""
    segment(tmp_path, iterations=30, wall_offset_ns=0)
    (tmp_path / "r" / CHECKPOINT_FILE).unlink()
    monkeypatch.setattr(run_module, "CHECKPOINT_EVERY", 5)
    taken: list[int] = []

    def write(out: Path, checkpoint: Checkpoint) -> None:
        taken.append(checkpoint.events)
        write_checkpoint(out, checkpoint)

    monkeypatch.setattr(run_module, "write_checkpoint", write)
    session = RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, autoload=False, resume=True)
    session.start()
    lines = (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()
    assert taken == [len(lines)] and b'"type":"run_resumed"' in lines[-1]
    session.finish()
    assert len(taken) == 2 and (tmp_path / "r" / CHECKPOINT_FILE).exists()


class Gate:
    """Holds the dispatch thread in iteration 6's boundary until let through (a plugin
    that keeps a state, so the run still takes checkpoints)."""

    def __init__(self) -> None:
        self.open = threading.Event()

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        if event.iteration == 6:
            assert self.open.wait(30)

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return 0

    @hookimpl
    def twinkle_restore_state(self, state: object) -> None:
        pass


def test_with_background_dispatch_a_checkpoint_keeps_the_run_as_it_stood_at_its_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch thread takes a running segment's checkpoint at a boundary it
    dispatched, while the publishers went on: the order and segments it keeps are those
    of the boundary's queueing, not of the events checked since."""
    monkeypatch.setattr(run_module, "CHECKPOINT_EVERY", 1)  # at every boundary
    gate = Gate()
    with RunSession(
        out_dir=tmp_path,
        run_id="r",
        config=CONFIG,
        autoload=False,
        background_dispatch=True,
        plugins=[("gate", gate)],
    ) as run:
        for i in range(7):
            run.bus.iteration_started(i)
            run.bus.samples(iteration=i, phase="rollout", lengths=[5], groups=1)
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=1)
        # the dispatch thread is held in boundary 6; the steps of iteration 6 went by
        gate.open.set()
        run.run.dispatcher.flush()  # type: ignore[union-attr]
        marked = orjson.loads((tmp_path / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
        assert marked["scan"]["last_iteration"] == 6
        assert marked["scan"]["optimizer_steps"] == 6  # not 7: step 7 came after
        lines = (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()
        logged = [orjson.loads(line) for line in lines]
        assert logged[marked["events"] - 1]["type"] == "iteration_started"
        assert logged[marked["events"] - 1]["iteration"] == 6
    again = segment(tmp_path, iterations=1, wall_offset_ns=HOUR, plugins=(("gate", Gate()),))
    assert again.resumed is not None and again.resumed.restored_events == again.resumed.events
    assert_replay_identical(tmp_path / "r", tmp_path)


class _Colour(enum.Enum):
    RED = 1


def test_twinkles_enums_read_back_where_python_pickles_them_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python 3.11.2 pickles an enum member as ``getattr(class, name)``, which the
    checkpoint's unpickler refuses: every checkpoint there was passed over, as the
    trace budget's state holds ``Fate`` members. They pickle by value on any Python."""
    import io

    from twinkle.observers._trace_budget import Fate

    def by_name(self: enum.Enum, protocol: int) -> tuple[Any, ...]:  # (3.11.2's)
        return getattr, (type(self), self._name_)

    monkeypatch.setattr(enum.Enum, "__reduce_ex__", by_name)
    with pytest.raises(pickle.UnpicklingError, match=r"not builtins\.getattr"):
        read_state(io.BytesIO(pickle.dumps(_Colour.RED)))  # (an enum of its own)
    members = [Fate.FULL, Fate.LEFT_OUT, Fate.OUTLINE]
    assert read_state(io.BytesIO(pickle.dumps(members))) == members


def test_the_unpickler_makes_twinkles_values_only() -> None:
    import io

    # a class a twinkle module imports is not that module's (a file handler truncates)
    planted = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x17twinkle.observers.sinks"
    planted += b"\x94\x8c\x13logging.FileHandler\x94\x93\x94."
    with pytest.raises(pickle.UnpicklingError, match=r"not twinkle\.observers\.sinks\.logging"):
        read_state(io.BytesIO(planted))
    with pytest.raises(pickle.UnpicklingError, match="JsonlWriter"):
        read_state(io.BytesIO(pickle.dumps(JsonlWriter)))
    with pytest.raises(
        pickle.UnpicklingError, match=r"holds only twinkle.s values, not (posix|os)\.system"
    ):
        read_state(io.BytesIO(pickle.dumps(os.system)))
    plain = {"a": [1, 2.5, None], "b": {3}, "c": (b"x",)}
    assert read_state(io.BytesIO(pickle.dumps(plain))) == plain


def test_the_unpickler_makes_no_class_of_twinkles_that_does_io(tmp_path: Path) -> None:
    """A class of an observers' module that opens a file when made (the event log's
    ``HeldLog``) is refused: made of a FIFO, it would wait on it, and a planted
    checkpoint (its digest is no secret) would hang the resume. Its ledgers are still
    made."""
    import io

    from twinkle.observers._no_phase import NoPhase

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    planted = b"ctwinkle.observers._held_log\nHeldLog\n(S'" + str(fifo).encode() + b"'\ntR."
    outcome: list[BaseException | object] = []

    def load() -> None:
        try:
            outcome.append(read_state(io.BytesIO(planted)))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # (let it go: a writer's open frees the reader's)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the unpickler made a HeldLog of a FIFO and waited on it")
    assert isinstance(outcome[0], pickle.UnpicklingError)
    assert "twinkle.observers._held_log.HeldLog" in str(outcome[0])
    ledger = NoPhase()
    ledger.add("save", 5)
    assert read_state(io.BytesIO(pickle.dumps(ledger))).names == {"save": [1, 5]}


def test_a_log_whose_first_line_is_bad_is_refused_when_read_not_when_followed(
    tmp_path: Path,
) -> None:
    """``twinkle watch`` takes a follower that cannot be made for a run not started
    yet: the bad first line is refused by the first read (naming it), not by the
    follower's making (which would wait for the run for ever)."""
    (tmp_path / "events.jsonl").write_bytes(b'{"type":"iteration_started","x":1}\n')
    follower = Follower(tmp_path)
    assert "events.jsonl:1" in str(follower.whole_log_why)
    with pytest.raises(ReplayError, match=r"events\.jsonl:1: .*unknown field"):
        follower.poll()


def test_a_checkpoint_that_cannot_be_written_never_fails_the_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's anchor (each field within its bounds) placing a span's end past 2**64
    ns: the checkpoint's header cannot hold that time, and finish() raised a TypeError
    after summary.json said ok. The checkpoint is left out, saying so; the run finishes
    and replays."""
    clock = ManualClock(0)
    big = 2**63 - 1
    with caplog.at_level(logging.WARNING, logger="twinkle.run"):
        with RunSession(out_dir=tmp_path, run_id="r", config=CONFIG, clock=clock,
                        autoload=False) as run:  # fmt: skip
            run.bus.iteration_started(0)
            clock.advance(10**9)
            anchor = ClockAnchor(monotonic_ns=-(2**63), wall_ns=big, pid=7, hostname="h")
            spans = (Span("generate", big - 10, big, 1, 7, {}, None),)
            run.receive(WorkerReport("engine0", anchor, spans))
            clock.advance(10**9)
    assert run.summary is not None and run.summary["status"] == "ok"
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()
    assert "no checkpoint written (Integer exceeds 64-bit range)" in caplog.text
    assert_replay_identical(tmp_path / "r", tmp_path)
