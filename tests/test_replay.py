"""Replay: a run's event log reproduces its records and summary byte for byte."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from twinkle.cli import main
from twinkle.errors import ReplayError
from twinkle.run import RunSession, replay

CONFIG = {
    "phases": {"rollout": ["generate", "reward"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 2},
    "total_steps": 10,
}
OUTPUTS = ["metrics_raw.jsonl", "metrics.jsonl", "summary.json", "events.jsonl", "trace.json"]


def recorded_run(out_dir: Path, iterations: int = 5) -> Path:
    """A real-clock run: spans on two threads, samples, steps and memory readings."""
    with RunSession(out_dir=out_dir, run_id="recorded", config=CONFIG, autoload=False) as run:
        rec = run.recorder
        for i in range(iterations):
            run.bus.iteration_started(i)

            def rollout(it: int = i + 1) -> None:
                with rec.span("generate", iteration=it):
                    sum(range(2000))
                run.bus.samples(iteration=it, phase="rollout", lengths=[it + 3, 7], groups=1)

            t = threading.Thread(target=rollout)
            t.start()
            with rec.span("train.fwd"):
                with rec.span("train.micro", micro=0):
                    sum(range(3000))
            run.bus.samples(iteration=i, phase="train", lengths=[i + 3, 7])
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
            run.read_memory(iteration=i)
            t.join()
        run_dir = run.out_dir
    assert run_dir is not None
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_run(tmp_path_factory.mktemp("live"))


def test_replay_reproduces_every_output_byte_for_byte(run_dir: Path, tmp_path: Path) -> None:
    result = replay(run_dir / "events.jsonl", tmp_path / "again", autoload=False)
    assert result.summary["status"] == "ok"
    for name in OUTPUTS:
        live = (run_dir / name).read_bytes()
        assert live, name
        assert (tmp_path / "again" / name).read_bytes() == live, name


def test_replay_command_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["replay", str(run_dir / "events.jsonl"), "--out", str(tmp_path / "cli"), "--no-autoload"]
    )
    assert rc == 0
    assert "replayed" in capsys.readouterr().out
    for name in ["metrics_raw.jsonl", "metrics.jsonl", "summary.json"]:
        assert (tmp_path / "cli" / name).read_bytes() == (run_dir / name).read_bytes()


def test_replay_refuses_to_write_into_the_logs_own_directory(run_dir: Path) -> None:
    with pytest.raises(ReplayError, match="own directory"):
        replay(run_dir / "events.jsonl", run_dir)


def test_replay_of_a_missing_log_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=r"does not exist or is not a file: give a run's dir"):
        replay(tmp_path / "nope.jsonl", tmp_path / "out")


def test_replay_names_the_line_of_a_malformed_event(run_dir: Path, tmp_path: Path) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    bad = tmp_path / "bad" / "events.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(
        b"\n".join([*lines[:3], b'{"type":"samples","run_id":"recorded"}', *lines[3:]]) + b"\n"
    )
    with pytest.raises(ReplayError, match=r"events.jsonl:4: .*lacks field") as raised:
        replay(bad, tmp_path / "out")
    # the fix: a line taken out would put every later one out of place (seq)
    assert "restore the original log, or cut the log just before that line" in str(raised.value)
    assert "does not begin with a twinkle event" not in str(raised.value)


@pytest.mark.parametrize("name", ["summary.json", "metrics_raw.jsonl", "trace.json"])
def test_replay_of_another_file_of_the_run_says_it_may_not_be_the_log(
    run_dir: Path, tmp_path: Path, name: str
) -> None:
    """The run's summary, records or trace given for its log: the first line is no
    event, so the file may be another (not only a corrupted log)."""
    with pytest.raises(ReplayError, match=rf"{name}:1: .*; {name} does not begin with a twin"):
        replay(run_dir / name, tmp_path / "out")


def test_replay_needs_run_started_first(run_dir: Path, tmp_path: Path) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    bad = tmp_path / "bad" / "events.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(b"\n".join(lines[1:]) + b"\n")
    with pytest.raises(ReplayError, match="must start with a run_started"):
        replay(bad, tmp_path / "out")


def test_replay_of_a_log_cut_short_closes_the_run_as_error(run_dir: Path, tmp_path: Path) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    cut = tmp_path / "cut" / "events.jsonl"
    cut.parent.mkdir()
    cut.write_bytes(b"\n".join(lines[: len(lines) // 2]) + b"\n")
    result = replay(cut, tmp_path / "out", autoload=False)
    assert result.summary["status"] == "error"
    assert "without run_finished" in result.summary["error"]


def test_a_live_log_numbers_its_lines_and_replay_refuses_one_line_twice(
    run_dir: Path, tmp_path: Path
) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    unnumbered = [i for i, line in enumerate(lines) if not line.startswith(b'{"seq":%d,' % i)]
    assert unnumbered == []
    i = next(i for i, line in enumerate(lines) if b'"type":"samples"' in line)
    twice = tmp_path / "twice" / "events.jsonl"
    twice.parent.mkdir()
    twice.write_bytes(b"\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]) + b"\n")
    with pytest.raises(ReplayError, match=rf"twice/events.jsonl:{i + 2}: seq {i} where {i + 1}"):
        replay(twice, tmp_path / "out", autoload=False)
    assert not (tmp_path / "out").exists()


def test_replay_of_a_run_directory_reproduces_its_outputs(run_dir: Path, tmp_path: Path) -> None:
    result = replay(run_dir, tmp_path / "again", autoload=False)
    assert result.log == run_dir / "events.jsonl"
    for name in OUTPUTS:
        assert (tmp_path / "again" / name).read_bytes() == (run_dir / name).read_bytes(), name
