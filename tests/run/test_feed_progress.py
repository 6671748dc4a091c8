"""A long feed of a log (a replay, a resume feeding its log again) says how far it is
on the logger ``twinkle.progress``; ``twinkle replay`` prints it on stderr."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import twinkle.run._feed as feed_module
from reliability._scripted import segment
from reliability.test_checkpoint import HOUR
from twinkle.cli import main
from twinkle.run import replay
from twinkle.run._checkpoint import CHECKPOINT_FILE
from twinkle.run._feed import FeedProgress, _duration
from twinkle.testing import scripted_run


class Reader:
    """A log's reader: the bytes read so far."""

    offset = 0


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "twinkle.progress"]


def test_the_progress_worked_by_hand(caplog: pytest.LogCaptureFixture) -> None:
    """A 1 MB log: 250,000 bytes and 128 events read at 10 s, so 13 events/s (12.8)
    and the other 750,000 bytes at 25,000 bytes/s: 30 s left. Nothing before 10 s,
    then nothing until 10 s more."""
    now = [0.0]
    reader = Reader()
    progress = FeedProgress("replay of run 'r'", reader, 1_000_000, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="twinkle.progress")
    now[0], reader.offset = 5.0, 120_000
    progress.note(64)
    now[0], reader.offset = 10.0, 250_000
    progress.note(128)
    now[0] = 19.0
    progress.note(192)
    now[0], reader.offset = 20.0, 1_000_000
    progress.note(512)
    assert _said(caplog) == [
        "replay of run 'r': 128 events, 25% of its 1.0 MB, 13 events/s, about 30 s left",
        "replay of run 'r': 512 events, 100% of its 1.0 MB, 26 events/s, about 0 s left",
    ]


def test_a_resume_paces_only_what_it_feeds(caplog: pytest.LogCaptureFixture) -> None:
    """From a checkpoint at byte 600,000 and event 1,000: at 10 s, byte 800,000 and event
    1,640: 64 events/s fed; 200,000 bytes in 10 s, 200,000 left: 10 s."""
    now = [0.0]
    reader = Reader()
    reader.offset = 600_000
    progress = FeedProgress("r", reader, 1_000_000, fed_before=1_000, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="twinkle.progress")
    now[0], reader.offset = 10.0, 800_000
    progress.note(1_640)
    assert _said(caplog) == ["r: 1,640 events, 80% of its 1.0 MB, 64 events/s, about 10 s left"]


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0, "0 s"), (89, "89 s"), (90, "2 min"), (5399, "90 min"), (5400, "1.5 h")],
)
def test_durations_are_said_in_a_unit_that_reads(seconds: float, said: str) -> None:
    assert _duration(seconds) == said


@pytest.fixture
def every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feed_module, "PROGRESS_EVERY_S", 0.0)


def test_a_replay_says_how_far_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, every_time: None
) -> None:
    log = scripted_run(tmp_path / "live", run_id="long", iterations=30, autoload=False)
    caplog.set_level(logging.INFO, logger="twinkle.progress")
    result = replay(log, tmp_path / "out", autoload=False)
    said = _said(caplog)
    assert said and all(s.startswith(f"replay of run 'long' ({log}): ") for s in said)
    assert len(said) == result.events // 64


def test_twinkle_replay_prints_it_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], every_time: None
) -> None:
    log = scripted_run(tmp_path / "live", run_id="long", iterations=30, autoload=False)
    assert main(["replay", str(log), "--out", str(tmp_path / "out"), "--no-autoload"]) == 0
    assert "twinkle: replay of run 'long' (" in capsys.readouterr().err
    assert not logging.getLogger("twinkle.progress").handlers  # (taken off again)


def test_a_resume_feeding_its_log_says_how_far_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, every_time: None
) -> None:
    segment(tmp_path, iterations=30)
    (tmp_path / "r" / CHECKPOINT_FILE).unlink()  # (the whole log is fed again)
    caplog.set_level(logging.INFO, logger="twinkle.progress")
    session = segment(tmp_path, iterations=1, wall_offset_ns=HOUR)
    said = _said(caplog)
    assert session.resumed is not None and len(said) == session.resumed.events // 64
    assert all(s.startswith("run 'r' resuming: its log fed again: ") for s in said)
