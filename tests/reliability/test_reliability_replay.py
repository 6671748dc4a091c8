"""Replay's safety: it never writes over an output directory without ``force``, leaves
nothing behind when it fails, takes a run directory as well as its log, refuses a log
whose lines were duplicated, reordered or lost (their ``seq``), and says clearly when a
line is too long to be one twinkle wrote (also for a 2 GiB file of one line).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import twinkle.reporting.jsonl as jsonl_module
from _whatif_run import recorded_events
from reliability._scripted import scripted_run
from twinkle.cli import main
from twinkle.errors import InvalidArgumentError, ReplayError
from twinkle.hookspecs import hookimpl
from twinkle.run import Follower, iter_events, replay
from twinkle.testing import press_ctrl_c
from twinkle.whatif import predict

RECOMPUTED = ["metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json"]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scripted_run(tmp_path_factory.mktemp("live"), run_id="valid")


def objects(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in lines))
    return path


def numbered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines as the event-log sink writes them: ``seq`` first, 0, 1, 2, ..."""
    return [{"seq": i, **{k: v for k, v in o.items() if k != "seq"}} for i, o in enumerate(lines)]


def unnumbered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines as an older twinkle wrote them: no ``seq``."""
    return [{k: v for k, v in o.items() if k != "seq"} for o in lines]


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the output directory -----------------------------------------------------------------


def test_replay_refuses_a_non_empty_out_unless_forced(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "summary.json").write_text("{}")
    with pytest.raises(ReplayError, match=r"'.*out' is not empty \(it holds 'notes\.txt', "):
        replay(log, out, autoload=False)
    assert (out / "summary.json").read_text() == "{}"
    result = replay(log, out, autoload=False, force=True)
    assert result.out_dir == out
    assert (out / "notes.txt").read_text() == "mine", "files of other names are kept"
    for name in RECOMPUTED:
        assert (out / name).read_bytes() == (log.parent / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging left"


def test_an_out_that_is_a_loop_of_links_is_refused_by_name(log: Path, tmp_path: Path) -> None:
    """``Path.resolve()`` raised a bare RuntimeError ("Symlink loop from ...") there, from
    the check that the output is not the log's own directory: replay and whatif."""
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    refusal = r"replay output '.*l1' is a symbolic link \(to '.*l2'\): a replay never writes"
    with pytest.raises(ReplayError, match=refusal):
        replay(log, tmp_path / "l1", autoload=False)
    run = tmp_path / "run"
    replay(recorded_events(), run, autoload=False)
    linked = r"--out '.*l1' is a symbolic link \(to '.*l2'\)"
    with pytest.raises(InvalidArgumentError, match=linked):
        predict(run, out_dir=tmp_path / "l1")


def test_replay_into_an_empty_existing_directory_needs_no_force(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    replay(log, out, autoload=False)
    assert (out / "summary.json").read_bytes() == (log.parent / "summary.json").read_bytes()


def test_cli_replay_refuses_a_non_empty_out_and_force_replaces(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["replay", str(log), "--out", str(out), "--no-autoload"]) == 0
    first = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert main(["replay", str(log), "--out", str(out), "--no-autoload"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twinkle: error: replay output {str(out)!r} is not empty")
    assert "pass --force" in err and err.count("\n") == 1
    assert main(["replay", str(log), "--out", str(out), "--no-autoload", "--force"]) == 0
    assert (out / "summary.json").read_bytes() == first


def test_force_never_replaces_another_runs_log(log: Path, tmp_path: Path) -> None:
    """--force replaces a copy of the log replayed (an earlier replay's), never another
    run's events.jsonl, which nothing rebuilds; the directory is left as it was."""
    other = scripted_run(tmp_path / "runs", "other", 2).parent
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    with pytest.raises(ReplayError, match=r"holds an events\.jsonl that is not the log replayed"):
        replay(log, other, autoload=False, force=True)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert sorted(p.name for p in other.parent.iterdir()) == ["other"]  # no staging left
    out = tmp_path / "out"
    replay(log, out, autoload=False)
    (out / "events.jsonl").write_bytes(log.read_bytes()[:100])  # (a copy cut short)
    replay(log, out, autoload=False, force=True)
    assert (out / "events.jsonl").read_bytes() == log.read_bytes()


def test_force_must_be_a_bool(log: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"force must be True or False, got 'yes'"):
        replay(log, tmp_path / "out", force="yes")  # type: ignore[arg-type]


class Breaks:
    """Raises ``exc`` in the hook of the ``at``-th event (KeyboardInterrupt is not
    isolated like an ordinary failure: it stops the replay)."""

    def __init__(self, exc: BaseException, at: int) -> None:
        self.exc, self.at, self.seen = exc, at, 0

    @hookimpl
    def twinkle_event(self, event: Any) -> None:
        self.seen += 1
        if self.seen == self.at:
            if isinstance(self.exc, KeyboardInterrupt):
                press_ctrl_c()  # (the user's: a plugin's own is its failure)
            else:
                raise self.exc


def test_failed_replay_leaves_nothing_behind_and_keeps_what_out_held(
    log: Path, tmp_path: Path
) -> None:
    lines = objects(log)
    bad = log.read_bytes().splitlines()
    bad.insert(len(bad) // 2, b'{"type": "samples", oops}')
    corrupt = tmp_path / "bad" / "events.jsonl"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\n".join(bad) + b"\n")
    fresh = tmp_path / "a" / "b" / "c"
    with pytest.raises(ReplayError, match=r"bad/events\.jsonl:\d+: invalid JSON"):
        replay(corrupt, fresh, autoload=False)
    assert not (tmp_path / "a").exists(), "the directories it made are gone too"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "summary.json").write_text("earlier")
    with pytest.raises(ReplayError):
        replay(corrupt, kept, autoload=False, force=True)
    assert listing(kept) == ["summary.json"] and (kept / "summary.json").read_text() == "earlier"
    with pytest.raises(KeyboardInterrupt):
        replay(log, fresh, autoload=False, plugins=[("ctrl_c", Breaks(KeyboardInterrupt(), 3))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "kept"]
    assert len(lines) > 3


def test_replay_output_directory_has_the_modes_of_a_run_directory(
    log: Path, tmp_path: Path
) -> None:
    replay(log, tmp_path / "out", autoload=False)
    assert (tmp_path / "out").stat().st_mode & 0o777 == (log.parent.stat().st_mode & 0o777)


# -- a run directory as input -------------------------------------------------------------


def test_replay_takes_a_run_directory(log: Path, tmp_path: Path) -> None:
    result = replay(log.parent, tmp_path / "out", autoload=False)
    assert result.log == log
    for name in RECOMPUTED:
        assert (tmp_path / "out" / name).read_bytes() == (log.parent / name).read_bytes()
    assert [e.TYPE for e in iter_events(log.parent)] == [e.TYPE for e in iter_events(log)]
    with pytest.raises(ReplayError, match=r"run directory '.*' holds no events\.jsonl"):
        replay(tmp_path / "out" / "..", tmp_path / "o2", autoload=False)


def test_cli_replay_of_a_run_directory(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(log.parent), "--out", str(tmp_path / "o"), "--no-autoload"]) == 0
    assert "replayed" in capsys.readouterr().out
    with pytest.raises(ReplayError, match="own directory"):
        replay(log.parent, log.parent)


# -- seq: duplicated, reordered and missing lines -----------------------------------------


def test_a_numbered_log_replays_the_same_figures_as_an_unnumbered_one(
    log: Path, tmp_path: Path
) -> None:
    lines = objects(log)
    a = replay(write(tmp_path / "n" / "events.jsonl", numbered(lines)), tmp_path / "a")
    b = replay(write(tmp_path / "u" / "events.jsonl", unnumbered(lines)), tmp_path / "b")
    assert a.events == b.events == len(lines)
    for name in RECOMPUTED:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() == (log.parent / name).read_bytes()


def _duplicate(lines: list[Any]) -> int:
    assert lines[3]["type"] == "samples"  # twice is no error of the event itself
    lines.insert(4, lines[3])
    return 5


def _swap(lines: list[Any]) -> int:
    lines[5], lines[6] = lines[6], lines[5]
    return 6


def _drop(lines: list[Any]) -> int:
    del lines[5]
    return 6


def _drop_three(lines: list[Any]) -> int:
    del lines[5:8]
    return 6


def _duplicate_far(lines: list[Any]) -> int:
    lines.insert(9, lines[3])
    return 10


def _unnumbered_line(lines: list[Any]) -> int:
    del lines[5]["seq"]
    return 6


def _seq_str(lines: list[Any]) -> int:
    lines[5]["seq"] = "5"
    return 6


def _starts_at_one(lines: list[Any]) -> int:
    for o in lines:
        o["seq"] += 1
    return 1


SEQ_CASES = [
    ("duplicated line", _duplicate, r"seq 3 where 4 was due: it repeats the line before it"),
    (
        "reordered lines",
        _swap,
        r"seq 6 where 5 was due: seq 5 missing before it \(lines lost or moved\)",
    ),
    ("missing line", _drop, r"seq 6 where 5 was due: seq 5 missing"),
    ("missing lines", _drop_three, r"seq 8 where 5 was due: seq 5\.\.7 missing before it"),
    ("line copied from earlier", _duplicate_far, r"seq 3 where 9 was due: seq 3 belongs to"),
    (
        "a line without seq",
        _unnumbered_line,
        r"the line has no 'seq' although the lines from line 1 on have one",
    ),
    ("seq not an int", _seq_str, r"seq = '5': expected the line's 0-based number"),
    ("numbered from 1", _starts_at_one, r"seq 1 where 0 was due"),
]


@pytest.mark.parametrize(
    ("edit", "match"), [c[1:] for c in SEQ_CASES], ids=[c[0] for c in SEQ_CASES]
)
def test_duplicated_reordered_or_missing_lines_are_refused_naming_file_and_line(
    log: Path, tmp_path: Path, edit: Any, match: str
) -> None:
    lines = numbered(objects(log))
    line = edit(lines)
    bad = write(tmp_path / "run" / "events.jsonl", lines)
    with pytest.raises(ReplayError, match=rf"run/events\.jsonl:{line}: {match}"):
        replay(bad, tmp_path / "out", autoload=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ReplayError, match=rf":{line}: "):
        list(iter_events(bad))
    if " was due" in match:  # (twinkle report and watch say it alike, with the fix)
        with pytest.raises(ReplayError, match=rf"run/events\.jsonl:{line}: {match}.*restore"):
            Follower(bad.parent).poll()


def test_a_duplicated_step_is_said_to_be_a_duplicated_line_not_a_repeated_step(
    log: Path, tmp_path: Path
) -> None:
    """The run refuses the copy (its step repeats): the line's number says why."""
    lines = numbered(objects(log))
    i = next(k for k, o in enumerate(lines) if o["type"] == "optimizer_step")
    lines.insert(i + 1, lines[i])
    bad = write(tmp_path / "run" / "events.jsonl", lines)
    said = rf"events\.jsonl:{i + 2}: seq {i} where {i + 1} was due: it repeats the line before"
    with pytest.raises(ReplayError, match=said):
        replay(bad, tmp_path / "out", autoload=False)


def test_an_unnumbered_log_with_a_duplicated_line_is_not_checked_as_before(
    log: Path, tmp_path: Path
) -> None:
    """An older twinkle's log (no seq) replays as it always did: nothing to check against."""
    lines = unnumbered(objects(log))
    assert lines[3]["type"] == "samples"
    lines.insert(4, lines[3])  # counted twice, as an older twinkle would have
    result = replay(write(tmp_path / "old" / "events.jsonl", lines), tmp_path / "out")
    assert result.events == len(lines)
    assert result.summary["status"] == "ok"


def test_cli_reports_a_reordered_log_in_one_line(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = numbered(objects(log))
    _swap(lines)
    bad = write(tmp_path / "run" / "events.jsonl", lines)
    assert main(["replay", str(bad), "--out", str(tmp_path / "out"), "--no-autoload"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"twinkle: error: {bad}:6: seq 6 where 5 was due") and err.count("\n") == 1
    )


# -- lines too long to be twinkle's -------------------------------------------------------


def test_a_line_over_the_line_limit_is_a_replay_error_naming_it(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "MAX_LINE_BYTES", 4096)
    lines = numbered(objects(log))
    long = dict(lines[3])
    long["x_padding"] = "p" * 10_000
    lines[3] = long
    bad = write(tmp_path / "run" / "events.jsonl", lines)
    with pytest.raises(ReplayError, match=r"run/events\.jsonl:4: .*MAX_LINE_BYTES=4096") as info:
        replay(bad, tmp_path / "out", autoload=False)
    assert not isinstance(info.value.__cause__, MemoryError)
    assert not (tmp_path / "out").exists()


def test_a_2_gib_sparse_log_is_a_clear_replay_error_without_reading_it_into_memory(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "run" / "events.jsonl"
    huge.parent.mkdir()
    with huge.open("wb") as f:
        f.write(log.read_bytes().splitlines(keepends=True)[0])  # a good run_started
        f.truncate(2 << 30)  # then 2 GiB of holes: one line, no newline
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    start = time.monotonic()
    with pytest.raises(ReplayError, match=r"run/events\.jsonl:2: ") as info:
        replay(huge, tmp_path / "out", autoload=False)
    took = time.monotonic() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 256, f"the replay's peak memory grew {grown_mib:.0f} MiB"
    assert took < 30, f"{took:.1f} s"
    assert "MemoryError" not in str(info.value)
    assert not (tmp_path / "out").exists()
    assert main(["replay", str(huge), "--out", str(tmp_path / "out"), "--no-autoload"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twinkle: error: {huge}:2: ") and err.count("\n") == 1
    json.dumps(err)  # one printable line, no traceback
