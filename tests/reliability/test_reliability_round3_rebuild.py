"""Reliability round 3, item 3: a resume rebuilds the record files beside the old ones
and puts each in place only once it holds at least as much, fsynced — so a process
killed at any moment after a resume leaves no file shorter than before it; and the
summary of the earlier segments is gone until the new one finishes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from twinkle.reporting import read_jsonl
from twinkle.run import RunSession, replay
from twinkle.testing import SCRIPTED_CONFIG, scripted_run

FILES = ("metrics_raw.jsonl", "metrics.jsonl")


def _lines(path: Path) -> int:
    return len(list(read_jsonl(path)))  # (strict: every line parses)


def _counts(run_dir: Path) -> dict[str, int]:
    return {name: _lines(run_dir / name) for name in FILES}


def test_the_rebuilt_files_are_in_place_only_once_they_hold_as_much(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, "r", 12, autoload=False)
    run_dir = log.parent
    before = _counts(run_dir)
    session = RunSession(
        out_dir=tmp_path, run_id="r", config=SCRIPTED_CONFIG, autoload=False, resume=True
    ).start()
    try:
        # Right after the resume: the old files, or rebuilds at least as long.
        assert all(n >= before[name] for name, n in _counts(run_dir).items())
        assert not (run_dir / "summary.json").exists()  # it described the old segment only
        first = session.resumed.next_iteration if session.resumed else 0
        for i in range(first, first + 3):
            session.bus.iteration_started(i)
            session.bus.scalars(iteration=i, name="grpo", values={"loss": 0.1})
    finally:
        session.finish()
    after = _counts(run_dir)
    assert all(after[name] > before[name] for name in FILES)
    assert not list(run_dir.glob(".*.resume.*.tmp"))  # every rebuild took its place
    out = tmp_path / "replayed"
    replay(log, out, autoload=False)
    for name in (*FILES, "summary.json"):
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


CHILD = textwrap.dedent(
    """
    import sys, time
    from twinkle.run import RunSession
    from twinkle.testing import SCRIPTED_CONFIG

    session = RunSession(out_dir=sys.argv[1], run_id="r", config=SCRIPTED_CONFIG,
                         autoload=False, resume=True).start()
    print("started", flush=True)
    i = session.resumed.next_iteration
    while True:
        session.bus.iteration_started(i)
        session.bus.scalars(iteration=i, name="grpo", values={"loss": 0.1})
        i += 1
        time.sleep(0.002)
    """
)


@pytest.mark.parametrize("delay_ms", [0, 10, 30, 60, 100, 300])
def test_a_resume_killed_at_any_moment_leaves_no_file_shorter(
    tmp_path: Path, delay_ms: int
) -> None:
    log = scripted_run(tmp_path, "r", 40, autoload=False)
    run_dir = log.parent
    before = _counts(run_dir)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"started"
        time.sleep(delay_ms / 1000)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    after = _counts(run_dir)
    assert all(after[name] >= before[name] for name in FILES), (before, after)
    # A later resume takes the killed segment's leftovers away, and the run is whole.
    scripted_run(tmp_path, "r", 2, autoload=False)
    assert not list(run_dir.glob(".*.resume.*.tmp"))
    out = tmp_path / "replayed"
    replay(log, out, autoload=False)
    for name in (*FILES, "summary.json"):
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


def test_a_resumed_runs_summary_names_its_files_not_their_rebuilds(tmp_path: Path) -> None:
    scripted_run(tmp_path, "r", 2, autoload=False)
    log = scripted_run(tmp_path, "r", 2, autoload=False)  # resumes: rebuilt, then in place
    summary = orjson.loads((log.parent / "summary.json").read_bytes())
    names = sorted(h["backend"] for h in summary["backends"].values())
    assert names == ["JsonlBackend(metrics_raw.jsonl)", "WebUIFlatBackend(metrics.jsonl)"]
    assert not list(log.parent.glob(".*.tmp"))
