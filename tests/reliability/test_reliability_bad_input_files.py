"""Bad input to the file layer (JSONL writer and reader, whole files, the sinks): a clear
error naming the culprit path or value and the fix, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability._cases import Case
from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, TwinkleError
from twinkle.events import IterationStarted, dumps_event
from twinkle.hookspecs import RunContext
from twinkle.observers import EventLogSink, TraceSink
from twinkle.reporting import MAX_LINE_BYTES, JsonlWriter, ReplacingFile, read_jsonl


def writer(tmp: Path, name: str = "a.jsonl") -> JsonlWriter:
    return JsonlWriter(tmp / name)


def symlinked(tmp: Path, name: str) -> Path:
    (tmp / "elsewhere").write_bytes(b"")
    (tmp / name).symlink_to(tmp / "elsewhere")
    return tmp / name


def huge_last_line(tmp: Path) -> Path:
    """A file whose last line (no newline) is one byte over the limit (sparse)."""
    path = tmp / "huge.jsonl"
    with path.open("wb") as f:
        f.truncate(MAX_LINE_BYTES + 1)
    return path


def torn_with_sidecar_dir(tmp: Path) -> JsonlWriter:
    path = tmp / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": ')
    (tmp / "t.jsonl.torn").mkdir()
    return JsonlWriter(path)


def configure(sink: EventLogSink | TraceSink, tmp: Path, resumed: int = 0) -> None:
    sink.twinkle_configure(RunContext(run_id="r", out_dir=tmp, resumed_events=resumed))


def resumed_mismatch(tmp: Path) -> None:
    line = b'{"seq":0,' + dumps_event(IterationStarted("r", 1, 2, 0))[1:] + b"\n"
    (tmp / "events.jsonl").write_bytes(line)
    configure(EventLogSink(), tmp, resumed=4)


def events_dir(tmp: Path) -> None:
    (tmp / "events.jsonl").mkdir()
    configure(EventLogSink(), tmp)


CASES = [
    Case(
        "write a dict",
        lambda tmp: writer(tmp).write({"a": 1}),
        InvalidArgumentError,
        r"^write\(\) takes an iterable of objects, one per line, got a single dict \{'a': 1\} "
        r"for '.*a\.jsonl'; wrap it in a list: write\(\[value\]\)$",
    ),
    Case(
        "write a str",
        lambda tmp: writer(tmp).write('{"a": 1}'),
        InvalidArgumentError,
        r"got a single str '\{\"a\": 1\}' .*write\(\[value\]\)",
    ),
    Case(
        "write bytes",
        lambda tmp: writer(tmp).write(b"ab"),
        InvalidArgumentError,
        r"got a single bytes b'ab' .*write\(\[value\]\)",
    ),
    Case(
        "write_bytes_lines of one bytes",
        # one bytes, not a sequence of them, is the point
        lambda tmp: writer(tmp).write_bytes_lines(b'{"a":1}\n'),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"^write_bytes_lines\(\) takes an iterable of bytes lines.*single bytes .*"
        r"write_bytes_lines\(\[value\]\)$",
    ),
    Case(
        "write_bytes_lines of str lines",
        lambda tmp: writer(tmp).write_bytes_lines(['{"a":1}\n']),  # type: ignore[list-item]
        RecordError,
        r"lines\[0\] of the batch for '.*a\.jsonl' must be one JSON value ending in a single",
    ),
    Case(
        "a line over the limit",
        lambda tmp: writer(tmp).write([{"n": 1}, {"pad": "x" * MAX_LINE_BYTES}]),
        RecordError,
        rf"line 1 of the batch for '.*a\.jsonl' is {MAX_LINE_BYTES + 11} bytes, longer than "
        rf"MAX_LINE_BYTES={MAX_LINE_BYTES} .*nothing of this batch was written",
    ),
    Case(
        "a symlinked JSONL file",
        lambda tmp: JsonlWriter(symlinked(tmp, "link.jsonl")),
        ReporterError,
        r"cannot open '.*link\.jsonl': it is a symbolic link; twinkle never writes through a "
        r"symlink .*remove the link",
    ),
    Case(
        "a directory as JSONL file",
        JsonlWriter,
        ReporterError,
        r"JSONL path '.*' is a directory; pass a file path inside it",
    ),
    Case(
        "a torn tail with nowhere to go",
        torn_with_sidecar_dir,
        ReporterError,
        r"'.*t\.jsonl' ends with a torn line .* cannot be moved to '.*t\.jsonl\.torn'",
    ),
    Case(
        "a last line over the limit",
        lambda tmp: JsonlWriter(huge_last_line(tmp)),
        ReporterError,
        rf"the last line of '.*huge\.jsonl' is longer than MAX_LINE_BYTES={MAX_LINE_BYTES} "
        r"bytes: this is not a JSONL file twinkle wrote; .*append=False",
    ),
    Case(
        "reading a line over the limit",
        lambda tmp: list(read_jsonl(huge_last_line(tmp), allow_torn_tail=True)),
        RecordError,
        rf"huge\.jsonl:1: line longer than MAX_LINE_BYTES={MAX_LINE_BYTES} bytes.*"
        r"on_error='skip'",
    ),
    Case(
        "a whole file through a symlink",
        lambda tmp: ReplacingFile(symlinked(tmp, "whole.json")),
        ReporterError,
        r"cannot write '.*whole\.json': it is a symbolic link",
    ),
    Case(
        "a whole file path of the wrong type",
        lambda tmp: ReplacingFile(3),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"path must be a str or os\.PathLike, got 3",
    ),
    Case(
        "a symlinked trace",
        lambda tmp: configure(TraceSink(), symlinked(tmp, "trace.json").parent),
        ReporterError,
        r"cannot write '.*trace\.json': it is a symbolic link",
    ),
    Case(
        "an event log that is a directory",
        events_dir,
        ReporterError,
        r"JSONL path '.*events\.jsonl' is a directory",
    ),
    Case(
        "resuming another log",
        resumed_mismatch,
        ReporterError,
        r"'.*events\.jsonl' ends with the event of seq 0, but the run resumes after 4 logged "
        r"event\(s\)",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_file_input_raises_a_clear_error_naming_the_culprit(case: Case, tmp_path: Path) -> None:
    with pytest.raises(case.error, match=case.match) as info:
        case.call(tmp_path)
    assert isinstance(info.value, TwinkleError)
