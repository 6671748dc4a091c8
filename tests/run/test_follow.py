"""Following a run's log as it grows (:class:`~twinkle.run.Follower`): at every point of
a two-segment run, behind a torn line, the snapshot is what a replay of the log so far
gives (its status aside), and the followed observers go on unchanged by it."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.errors import ReplayError
from twinkle.locks import RUN_LOCK_FILE
from twinkle.report import format_report, load_report
from twinkle.run import Follower, replay, writer_of

CFG = DemoConfig(iterations=4, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8)


@pytest.fixture(scope="module")
def two_segments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 iterations, then resumed for 3 more (its config's total_steps changed:
    the follower starts its observers again on the second segment's)."""
    out = tmp_path_factory.mktemp("follow")
    run_demo(CFG, out_dir=out, run_id="f", autoload=False)
    run_demo(dataclasses.replace(CFG, iterations=3), out_dir=out, run_id="f", autoload=False,
             resume=True)  # fmt: skip
    return out / "f"


def _no_seq(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seq"} for r in records]


def test_a_snapshot_anywhere_is_a_replay_of_the_log_so_far(
    two_segments: Path, tmp_path: Path
) -> None:
    lines = (two_segments / "events.jsonl").read_bytes().splitlines(keepends=True)
    resumed_at = next(i for i, x in enumerate(lines) if b'"type":"run_resumed"' in x)
    growing = tmp_path / "growing"
    growing.mkdir()
    log = growing / "events.jsonl"
    log.write_bytes(b"")
    follower = Follower(growing)
    cuts = sorted({3, 20, len(lines) // 3, resumed_at, resumed_at + 1, len(lines) - 1, len(lines)})
    for k in cuts:
        log.write_bytes(b"".join(lines[:k]) + lines[k][:9] if k < len(lines) else b"".join(lines))
        assert follower.poll() >= 0
        assert follower.events == k  # (the torn line waits for its newline)
        snap = follower.snapshot()
        (tmp_path / f"cut{k}.jsonl").write_bytes(b"".join(lines[:k]))
        again = replay(tmp_path / f"cut{k}.jsonl", tmp_path / f"r{k}", autoload=False)
        raw = (tmp_path / f"r{k}" / "metrics_raw.jsonl").read_bytes().splitlines()
        assert _no_seq(snap.records) == _no_seq([orjson.loads(x) for x in raw]), k
        want = orjson.loads((tmp_path / f"r{k}" / "summary.json").read_bytes())
        assert again.summary["run_id"] == want["run_id"]
        if not snap.finished:  # closed at its last event, as the replay closes it
            assert snap.summary["status"] == "in progress" and snap.summary["error"] is None
            assert snap.summary["segments"][-1]["status"] == "in progress"
            for key in ("status", "error", "segments"):
                want.pop(key), snap.summary.pop(key)
        else:  # the log so far ends with a segment's run_finished: its own summary
            segment = lines[resumed_at:k] if k > resumed_at else lines[:k]
            assert snap.summary["status"] == "ok"
            assert any(b'"type":"run_finished"' in x for x in segment)
        assert snap.summary == want, k
    follower.close()


def test_a_snapshot_leaves_the_followed_observers_as_they_were(
    two_segments: Path, tmp_path: Path
) -> None:
    with Follower(two_segments) as follower:
        follower.poll()
        first, second = follower.snapshot(), follower.snapshot()
    assert first.summary == second.summary and first.records == second.records
    live = orjson.loads((two_segments / "summary.json").read_bytes())
    assert first.summary == {**live, "observer_failures": first.summary["observer_failures"]}


def test_the_report_of_a_stopped_run_is_its_log_so_far(two_segments: Path, tmp_path: Path) -> None:
    lines = (two_segments / "events.jsonl").read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "events.jsonl").write_bytes(b"".join(lines[:60]))
    report = load_report(cut)
    assert report["status"] == "stopped" and writer_of(cut) is None
    assert report["live"] == {
        "state": "stopped", "writer": None, "pid": None, "host": None, "alive": None,
        "events": 60, "whole_log_why": "the run has no checkpoint",
    }  # fmt: skip
    assert "60 events (read from the whole log: the run has no checkpoint)" in format_report(report)
    assert load_report(two_segments)["live"] is None  # a finished run's: its own files


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(3 * 2**30)  # (sparse)


def _to_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _negative_pid(path: Path) -> None:
    path.write_bytes(orjson.dumps({"pid": -5, "hostname": socket.gethostname()}))


@pytest.mark.parametrize("plant", [_fifo, _huge, _to_zero, _negative_pid])
def test_a_lock_file_twinkle_did_not_write_is_no_writer(
    two_segments: Path, tmp_path: Path, plant: Callable[[Path], None]
) -> None:
    """A FIFO as the lock file hung the report, a 3 GB one or a link to /dev/zero was
    read whole (MemoryError), a negative pid failed it with psutil's ValueError: a
    stopped run's report names no writer, whatever its lock file."""
    lines = (two_segments / "events.jsonl").read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "events.jsonl").write_bytes(b"".join(lines[:60]))
    plant(cut / RUN_LOCK_FILE)
    assert writer_of(cut) is None
    assert load_report(cut)["status"] == "stopped"


def test_a_log_cut_shorter_while_followed_is_refused(two_segments: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    data = (two_segments / "events.jsonl").read_bytes()
    (run / "events.jsonl").write_bytes(data)
    with Follower(run) as follower:
        follower.poll()
        (run / "events.jsonl").write_bytes(data[: len(data) // 2])
        with pytest.raises(ReplayError, match="is shorter than when it was read"):
            follower.poll()


def test_lines_longer_than_one_read_are_read_whole(
    two_segments: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import twinkle.run._follow as follow

    monkeypatch.setattr(follow, "_READ_BYTES", 64)  # every line is longer
    lines = (two_segments / "events.jsonl").read_bytes().splitlines()
    with Follower(two_segments) as follower:
        follower.poll()
        assert follower.events == len(lines) and follower.finished
