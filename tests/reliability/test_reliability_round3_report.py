"""Reliability round 3, ``twinkle report`` and its neighbours (issue 26, item 8 and its
small items): input that used to be reported wrongly or written through — a summary
that the log outgrew, a bad or huge ``summary.json``, planted symbolic links, escape
sequences in a log — and the clear error, or the safe output, each gets now."""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.checks import printable
from twinkle.cli import EXIT_USAGE, main
from twinkle.errors import InvalidArgumentError, ReplayError
from twinkle.perf.stats import MemoryReading
from twinkle.plugins import DISABLE_AUTOLOAD_ENV
from twinkle.report import SUMMARY_MAX_BYTES, load_report, write_plots
from twinkle.reporting import remove_shared_write
from twinkle.run import RunSession, replay
from twinkle.testing import SCRIPTED_CONFIG, scripted_run, shared_writable, umask


def finished(out: Path, run_id: str = "r", iterations: int = 2, **kw: Any) -> Path:
    """A finished scripted run (or one more segment of it); its directory."""
    return scripted_run(out, run_id, iterations, autoload=False, **kw).parent


#: a resumed segment of scripted run ``r`` in ``sys.argv[1]``, killed outright (no
#: run_finished, no summary) in its last iteration, after its optimizer step
KILLED_SEGMENT = textwrap.dedent(
    """
    import os, sys
    from twinkle.hookspecs import hookimpl
    from twinkle.testing import scripted_run

    class Kill:
        @hookimpl
        def twinkle_optimizer_step(self, event):
            if event.step == 4:  # (steps 1 and 2, the first segment's, go by again first)
                os._exit(113)

    scripted_run(
        sys.argv[1], "r", 2, autoload=False, background_writer=False, plugins=[("kill", Kill())]
    )
    """
)


def event_lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)


# -- item 8: a summary the log outgrew ----------------------------------------------------


def test_a_run_whose_resumed_segment_was_killed_is_reported_from_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = finished(tmp_path)
    before = (run_dir / "summary.json").read_bytes()
    child = [sys.executable, "-c", KILLED_SEGMENT, str(tmp_path)]
    assert subprocess.run(child, check=False, timeout=300).returncode == 113
    assert b'"type":"run_resumed"' in (run_dir / "events.jsonl").read_bytes()
    # A resume removes the earlier segment's summary once its own segment began; what
    # an older twinkle left (or a resume killed between the two) still holds it:
    (run_dir / "summary.json").write_bytes(before)  # segment 0's, status ok

    # The summary covers 1 of the log's 2 segments: the run is read from its log, as a
    # replay reads it (the killed segment closed at its last event), marked stopped.
    report = load_report(run_dir)
    assert report["status"] == "stopped" and report["live"]["state"] == "stopped"
    assert main(["replay", str(run_dir), "--out", str(tmp_path / "whole")]) == 0
    replayed = load_report(tmp_path / "whole")
    assert replayed["status"] == "error"
    # (iteration 3, which the kill cut off, is the next resume's to finish)
    assert [row["iteration"] for row in report["iterations"]] == [0, 1, 2]
    for key in ("iterations", "window", "phase_windows", "seconds", "limits", "segments"):
        assert report[key] == replayed[key] or key == "segments", key
    assert [s["status"] for s in report["segments"]] == ["ok", "in progress"]
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith(f"run r (stopped): {run_dir}\nstopped without finishing")


def test_a_comparison_with_a_run_its_summary_does_not_cover_reads_that_runs_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = finished(tmp_path, "good")
    stale = finished(tmp_path, "stale")
    kept = (stale / "summary.json").read_bytes()
    finished(tmp_path, "stale", 1)  # a resumed segment ...
    (stale / "summary.json").write_bytes(kept)  # ... that stopped before its summary
    for a, b in ((good, stale), (stale, good)):
        assert main(["report", str(a), str(b), "--json"]) == 0
        both = json.loads(capsys.readouterr().out)
        from_log = both["a"] if a == stale else both["b"]
        assert from_log["live"]["state"] == "finished"  # (its log holds run_finished)
        assert len(from_log["segments"]) == 2


def test_a_run_killed_as_it_wrote_its_summary_is_reported_from_its_log_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed after its log took run_finished, before summary.json was in place: the
    report reads the log (the same figures), and says the file is missing and how to
    write it; a summary of fewer segments than the log is named as such."""
    run_dir = finished(tmp_path)
    whole = load_report(run_dir)
    (run_dir / "summary.json").unlink()
    report = load_report(run_dir)
    assert report["live"]["state"] == "finished"
    assert report["live"]["files_missing"] == ["summary.json"]
    for key in ("status", "iterations", "window", "phase_windows", "limits"):
        assert report[key] == whole[key], key
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "its log holds its finish, but it has no summary.json (a process killed as it "
        "finished, or the log copied alone): these figures are its log's, and `twinkle "
        "replay events.jsonl --out DIR` writes its files anew"
    )
    kept = (finished(tmp_path, "two") / "summary.json").read_bytes()
    (finished(tmp_path, "two", 1) / "summary.json").write_bytes(kept)
    assert main(["report", str(tmp_path / "two")]) == 0
    assert "but its summary.json covers fewer segments than its log" in capsys.readouterr().out


def test_a_run_killed_before_its_first_event_is_named_so_by_report_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its log is empty and the process its lock file names is gone: no "in a moment";
    replay names the file and why there is nothing to replay."""
    import socket
    import time

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    pid = int(gone.stdout)
    run_dir = tmp_path / "e0"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes(b"")
    lock = {"pid": pid, "hostname": socket.gethostname(), "since_unix_ns": time.time_ns()}
    (run_dir / ".twinkle.lock").write_bytes(orjson.dumps(lock))
    assert main(["report", str(run_dir)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"holds no event: the process that began the run (pid {pid} on " in err
    assert "which is gone) was stopped before it wrote one; there is nothing to report" in err
    assert main(["replay", str(run_dir), "--out", str(tmp_path / "x")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{run_dir / 'events.jsonl'} must start with a run_started event, got no event" in err
    assert "a run killed as it started wrote none, and there is nothing to replay" in err


def test_a_summary_that_covers_more_than_the_log_or_another_run_is_refused(
    tmp_path: Path,
) -> None:
    run_dir = finished(tmp_path)
    finished(tmp_path, iterations=1)  # segment 1, finished: its summary covers both
    assert load_report(run_dir)["status"] == "ok"  # a resumed run reports as before
    lines = event_lines(run_dir)
    cut = next(i for i, line in enumerate(lines) if b'"type":"run_resumed"' in line)
    (run_dir / "events.jsonl").write_bytes(b"".join(lines[:cut]))
    with pytest.raises(InvalidArgumentError, match=r"holds 1 segment\(s\).*covers 2.*cut"):
        load_report(run_dir)

    other, third = finished(tmp_path, "other"), finished(tmp_path, "third")
    shutil.copy(other / "summary.json", third / "summary.json")
    with pytest.raises(InvalidArgumentError, match=r"summary of run 'other'.*log of run 'third'"):
        load_report(third)


def test_only_a_whole_run_resumed_line_counts_as_a_segment(tmp_path: Path) -> None:
    """The segments are counted by a byte search, not by parsing the log: the same
    bytes in a value (the configuration here), or in a torn last line (a resume killed
    while writing its run_resumed, which no replay counts either), begin no segment."""
    config = {**copy.deepcopy(SCRIPTED_CONFIG), "x_note": {"type": "run_resumed"}}
    run_dir = finished(tmp_path, config=config)
    assert b'"x_note":{"type":"run_resumed"}' in event_lines(run_dir)[0]
    seq = len(event_lines(run_dir))
    with (run_dir / "events.jsonl").open("ab") as log:
        log.write(b'{"seq":%d,"type":"run_resumed","run_id":"r","monot' % seq)
    report = load_report(run_dir)
    assert report["status"] == "ok" and len(report["iterations"]) == 2


@pytest.mark.parametrize("chunk", [1, 7, 23, 40, 41, 64, 1 << 20])
def test_segments_are_counted_alike_whatever_the_chunks_the_log_is_read_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """The log is searched a chunk at a time: a run_resumed line split across chunks at
    any byte counts once, the same bytes in a value none, a torn last line none."""
    import twinkle.report._log_segments as segments_module
    from twinkle.report._log_segments import logged_segments

    lines = [
        b'{"seq":0,"type":"run_started","config":{"x":{"type":"run_resumed"}}}\n',
        b'{"seq":5,"a":{"type":"run_resumed"}}\n',  # near a line's start, not its type
        b'{"seq":1,"type":"run_resumed","segment":1}\n',
        b'{"type":"run_resumed","segment":2}\n',
        b'{"seq":3,"type":"spans","note":"{\\"seq\\":4,\\"type\\":\\"run_resumed\\""}\n',
        b'{"seq":40,"type":"run_resumed","segment":3}\n',
        b'{"seq":41,"type":"run_resumed","mono',  # torn
    ]
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"".join(lines))
    monkeypatch.setattr(segments_module, "_CHUNK", chunk)
    assert logged_segments(log) == 4
    log.write_bytes(b"".join(lines[:-1]))
    assert logged_segments(log) == 4
    log.write_bytes(b"")
    assert logged_segments(log) == 0


def test_the_report_reads_peaks_and_segments_from_the_summary_as_the_log_gives_them(
    tmp_path: Path,
) -> None:
    """A summary has each worker's peaks and each segment's iterations: the report
    takes them there instead of reading the log, and gives what the log gives (a
    summary from before them still reports, from the log)."""
    finished(tmp_path)
    run_dir = finished(tmp_path)  # a second segment
    report = load_report(run_dir)
    assert [(s["first_iteration"], s["last_iteration"]) for s in report["segments"]] == [
        (0, 1),
        (2, 3),
    ]
    assert report["memory_peak_bytes"]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    del summary["memory_peaks"]
    for segment in summary["segments"]:
        del segment["first_iteration"], segment["last_iteration"]
    (run_dir / "summary.json").write_bytes(orjson.dumps(summary))
    assert load_report(run_dir) == report


# -- summary.json: its shape and its size ------------------------------------------------


def _with(summary: dict[str, Any], **changes: object) -> bytes:
    return orjson.dumps({**summary, **changes})


#: a bad summary.json made from a good one, and what the error must say of it
BAD_SUMMARIES: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "not JSON": (lambda s: b'{"run_id": "r", "stat', "is not JSON"),
    "a list": (lambda s: b"[]", "summary: expected `object`, got `array`"),
    "no run id": (
        lambda s: orjson.dumps({k: v for k, v in s.items() if k != "run_id"}),
        "summary lacks field(s) ['run_id']",
    ),
    "a bad status": (lambda s: _with(s, status="fine"), "summary.status = 'fine'"),
    "a word for a number": (
        lambda s: _with(s, window={**s["window"], "tokens": "many"}),
        "summary.window['tokens'] = 'many'",
    ),
    "segments not a list": (lambda s: _with(s, segments=3), "summary.segments = 3"),
    "an unsafe run id": (lambda s: _with(s, run_id="../r"), "summary.run_id = '../r'"),
}


@pytest.mark.parametrize("case", BAD_SUMMARIES)
def test_a_bad_summary_is_refused_naming_the_file_the_culprit_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    run_dir = finished(tmp_path)
    path = run_dir / "summary.json"
    make, culprit = BAD_SUMMARIES[case]
    path.write_bytes(make(orjson.loads(path.read_bytes())))
    with pytest.raises(InvalidArgumentError) as refused:
        load_report(run_dir)
    message = str(refused.value)
    assert repr(str(path)) in message and culprit in message
    assert f"twinkle replay {run_dir}/events.jsonl --out DIR" in message
    assert main(["report", str(run_dir)]) == EXIT_USAGE  # (no KeyError, no traceback)
    assert capsys.readouterr().err.startswith("twinkle: error: ")


def test_a_summary_of_gigabytes_is_refused_without_reading_it(tmp_path: Path) -> None:
    run_dir = finished(tmp_path)
    os.truncate(run_dir / "summary.json", 3 * 1024**3)  # (sparse: no disk, no time)
    with pytest.raises(InvalidArgumentError) as refused:
        load_report(run_dir)
    message = str(refused.value)
    assert f"holds {3 * 1024**3:,} bytes, more than the {SUMMARY_MAX_BYTES:,}" in message
    assert "summary.json" in message and "twinkle replay" in message


# -- report --plots: no symbolic link written through -------------------------------------


def test_plots_never_write_through_a_planted_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    report = load_report(finished(tmp_path))
    plots = tmp_path / "plots"
    plots.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (plots / "throughput.png").symlink_to(victim)
    with pytest.raises(InvalidArgumentError, match=r"throughput\.png'.*symbolic link"):
        write_plots(report, plots)
    assert victim.read_bytes() == b"precious"
    assert main(["report", str(tmp_path / "r"), "--plots", str(plots)]) == EXIT_USAGE
    assert "symbolic link" in capsys.readouterr().err
    assert victim.read_bytes() == b"precious" and (plots / "throughput.png").is_symlink()


def test_plots_never_replace_a_file_that_is_not_a_png(tmp_path: Path) -> None:
    """A file of the plots' names that is not an earlier plot (a PNG) is kept, and no
    plot is written: each is checked before any is."""
    pytest.importorskip("matplotlib")
    report = load_report(finished(tmp_path))
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "throughput.png").write_bytes(b"precious")
    with pytest.raises(InvalidArgumentError, match=r"throughput\.png' holds something other"):
        write_plots(report, plots)
    assert [p.name for p in plots.iterdir()] == ["throughput.png"]
    assert (plots / "throughput.png").read_bytes() == b"precious"
    (plots / "throughput.png").unlink()
    written = write_plots(report, plots)
    assert write_plots(report, plots) == written  # (its own plots are replaced)


def test_a_plots_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = load_report(finished(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "plots").symlink_to(elsewhere)
    with pytest.raises(InvalidArgumentError, match=r"--plots '.*plots' is a symbolic link"):
        write_plots(report, tmp_path / "plots")
    assert list(elsewhere.iterdir()) == []


def test_plots_are_written_whole_and_writable_by_their_owner_alone(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = load_report(finished(tmp_path))
    with umask(0):
        written = write_plots(report, tmp_path / "new" / "plots")
    assert [p.name for p in written] == ["limits.png", "throughput.png", "time.png", "memory.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert sorted(p.name for p in (tmp_path / "new" / "plots").iterdir()) == sorted(
        p.name for p in written
    )  # (no temporary file left)
    assert shared_writable(tmp_path / "new") == []


def test_a_run_made_under_umask_000_leaves_no_directory_writable_by_others(
    tmp_path: Path,
) -> None:
    with umask(0):
        scripted_run(tmp_path / "deep" / "runs", "r", iterations=1, autoload=False)
    assert shared_writable(tmp_path / "deep") == []  # the parents made for it included


# -- replay --out: a link is refused before anything is made ------------------------------


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-directory", "dangling"])
def test_replay_into_a_link_is_refused_and_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dangling: bool
) -> None:
    run_dir = finished(tmp_path / "runs")
    target = tmp_path / "target"
    if not dangling:
        target.mkdir()
    out = tmp_path / "out"
    out.symlink_to(target)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ReplayError, match=r"replay output '.*out' is a symbolic link"):
        replay(run_dir, out, autoload=False)
    assert main(["replay", str(run_dir), "--out", str(out), "--no-autoload"]) == EXIT_USAGE
    assert "symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging directory
    assert target.exists() != dangling and (dangling or list(target.iterdir()) == [])


# -- files of libraries: not writable by others ------------------------------------------


def test_remove_shared_write_leaves_links_and_what_they_point_at_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    outside.chmod(0o666)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_bytes(b"")
    for entry in (tree, tree / "sub", tree / "sub" / "file"):
        entry.chmod(0o777 if entry.is_dir() else 0o666)
    (tree / "link").symlink_to(outside)
    remove_shared_write(tree)
    modes = {p.name: p.lstat().st_mode & 0o777 for p in (tree, tree / "sub", tree / "sub" / "file")}
    assert modes == {"tree": 0o755, "sub": 0o755, "file": 0o644}
    assert outside.stat().st_mode & 0o777 == 0o666


# -- escape sequences from a log: shown, never obeyed --------------------------------------

EVIL = "gpu\x1b[2J\x1b[31m\u202e"


def test_a_worker_id_with_escape_sequences_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reading = MemoryReading(
        worker_id=EVIL,
        rank=1,
        pid=1,
        hostname="h",
        device="cpu",
        host_rss_bytes=1 << 20,
        host_peak_rss_bytes=2 << 20,
        device_allocated_bytes=None,
        device_allocated_peak_bytes=None,
        device_reserved_bytes=None,
        device_reserved_peak_bytes=None,
    )
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False) as run:
        run.bus.iteration_started(0)
        run.read_memory(iteration=0, others=[reading])
    run_dir, other = tmp_path / "r", finished(tmp_path, "other")
    for argv in (["report", str(run_dir)], ["report", str(other), str(run_dir)]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\u202e" not in out
    assert main(["report", str(run_dir)]) == 0
    assert r"gpu\x1b[2J\x1b[31m\u202e: host_peak_rss 2 MiB" in capsys.readouterr().out
    assert main(["report", str(run_dir), "--json"]) == 0  # JSON escapes it itself
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and EVIL in json.loads(printed)["memory_peak_bytes"]


def test_a_plugins_error_with_escape_sequences_is_printed_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "twinkle_shouts.py").write_text(
        textwrap.dedent(
            """
            raise ImportError("no licence\\x1b[2J\\x1b]0;owned\\x07")
            """
        )
    )
    info = site / "twinkle_shouts-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twinkle-shouts\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[twinkle.observers]\nshouts = twinkle_shouts:S\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    importlib.invalidate_caches()
    assert main(["plugins"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert r"no licence\x1b[2J\x1b]0;owned\x07" in out
    assert "\x1b" not in out + err and "\x07" not in out + err
    log = finished(tmp_path / "runs") / "events.jsonl"
    assert main(["replay", str(log), "--out", str(tmp_path / "out")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: ") and "\x1b" not in err and "shouts" in err


def test_printable_escapes_control_characters_once_and_keeps_the_rest() -> None:
    text = "a\x1b[31mb\nc\td\x7f\x85e\u202ef\u2066 é ü 漢 \\x1b"
    shown = printable(text)
    assert shown == r"a\x1b[31mb\nc\td\x7f\x85e\u202ef\u2066 é ü 漢 \x1b"
    assert printable(shown) == shown  # (a table's cells, escaped already, stay as they are)


@pytest.mark.parametrize("change", ["cut", "added", "added-torn"])
def test_a_finished_runs_log_changed_after_its_summary_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    """A log cut within its one segment (or added to) after the run finished ok: the
    report showed the summary's figures beside it, exit 0. Now it is refused, with the
    replay that recomputes the log as it is; the run as written reports as before."""
    run = finished(tmp_path)
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    log = run / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    if change == "cut":
        log.write_bytes(b"".join(lines[: len(lines) // 2]))
    elif change == "added":
        log.write_bytes(b"".join(lines) + b"garbage\n")
    else:  # (a torn line after a whole one: still added to)
        log.write_bytes(b"".join(lines) + b'{"seq":99,"type":"scalars"}\n{"seq":')
    assert main(["report", str(run)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "its summary.json says the run finished ok, but its events.jsonl does not end " in err
    assert "twinkle replay" in err
