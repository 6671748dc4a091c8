"""JsonlWriter: append, torn-line repair, write errors, backwards scan, the line limit,
co-appenders, symlinks."""

from __future__ import annotations

import base64
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError, WriteError
from twinkle.reporting import JsonlWriter, TornLineRecovery, read_jsonl
from twinkle.reporting import _jsonl_torn as torn_mod
from twinkle.reporting import jsonl as jsonl_mod


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-strict JSON token {name}")


def lines_of(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line, parse_constant=_reject_constant) for line in text.splitlines()]


def write_n(path: Path, n: int, start: int = 0) -> None:
    with JsonlWriter(path) as w:
        w.write({"seq": i, "payload": "x" * 10} for i in range(start, start + n))


def test_write_returns_count_and_each_object_is_one_strict_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonlWriter(path) as w:
        assert w.write([{"a": 1}, {"b": float("nan"), "c": "ü\n"}]) == 2
        assert w.write([]) == 0
        assert w.lines_written == 2
    assert lines_of(path) == [{"a": 1}, {"b": None, "c": "ü\n"}]


def test_dataclasses_are_written_by_field(tmp_path: Path) -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Ev:
        name: str
        duration_ns: int

    path = tmp_path / "e.jsonl"
    with JsonlWriter(path) as w:
        w.write([Ev("span", 5)])
    assert lines_of(path) == [{"name": "span", "duration_ns": 5}]


def test_append_keeps_earlier_lines_and_append_false_truncates(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    write_n(path, 3)
    write_n(path, 2, start=3)
    assert [o["seq"] for o in lines_of(path)] == [0, 1, 2, 3, 4]
    with JsonlWriter(path, append=False) as w:
        w.write([{"seq": 99}])
    assert lines_of(path) == [{"seq": 99}]


def test_missing_parents_are_created_and_file_mode_is_0644_less_umask(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r1" / "metrics_raw.jsonl"
    umask = os.umask(0)
    os.umask(umask)
    with JsonlWriter(path) as w:
        w.write([{"a": 1}])
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755 & ~umask


def test_fsync_mode_writes_and_flushes(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlWriter(path, fsync=True) as w:
        w.write([{"a": 1}])
        w.flush()
    assert lines_of(path) == [{"a": 1}]


def test_directory_path_raises_reporter_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ReporterError, match=rf"{tmp_path}.*is a directory.*pass a file path"):
        JsonlWriter(tmp_path)


def test_parent_that_is_a_file_raises_reporter_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ReporterError, match=r"cannot create the directory .*file"):
        JsonlWriter(blocker / "sub" / "x.jsonl")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_directory_raises_reporter_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ReporterError, match=r"cannot open .*locked.*permissions"):
        JsonlWriter(locked / "x.jsonl")


def test_bad_path_type_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="path must be a str"):
        JsonlWriter(3)  # type: ignore[arg-type]


def test_unserialisable_object_names_it_and_writes_nothing_of_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonlWriter(path) as w:
        w.write([{"ok": 1}])
        with pytest.raises(RecordError, match=r"object 1 of the batch .*\{1: 'x'\}"):
            w.write([{"fine": 2}, {1: "x"}, {"fine": 3}])
        with pytest.raises(RecordError, match=r"object 0 .*object at"):
            w.write([{"obj": object()}])
    assert lines_of(path) == [{"ok": 1}]


def test_write_bytes_lines_checks_line_framing(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonlWriter(path) as w:
        assert w.write_bytes_lines([b'{"a":1}\n', b'{"b":2}\n']) == 2
        with pytest.raises(RecordError, match=r"lines\[0\].*single b'\\n'"):
            w.write_bytes_lines([b'{"a":1}'])
        with pytest.raises(RecordError, match=r"lines\[1\]"):
            w.write_bytes_lines([b"{}\n", b'{"a":1}\n{"b":2}\n'])
    assert lines_of(path) == [{"a": 1}, {"b": 2}]


def test_closed_writer_refuses_writes_and_close_is_idempotent(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "a.jsonl")
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(ReporterError, match="is closed"):
        w.write([{"a": 1}])


# -- torn last line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("torn", "reason"),
    [
        (b"\x00\xffgarbage", "no trailing newline"),
        (b'{"seq": 5, "payload": "xx', "no trailing newline"),
        (b'{"seq": 5, "pay\n', "not valid JSON"),
    ],
)
def test_torn_last_line_moves_to_sidecar_and_complete_lines_survive(
    tmp_path: Path, torn: bytes, reason: str
) -> None:
    path = tmp_path / "m.jsonl"
    write_n(path, 5)
    good_size = path.stat().st_size
    with path.open("ab") as f:
        f.write(torn)
    with JsonlWriter(path) as w:
        rec = w.recovery
        assert isinstance(rec, TornLineRecovery)
        assert rec.path == str(path)
        assert rec.offset == good_size
        assert rec.torn_bytes == len(torn)
        assert rec.sidecar == str(path) + ".torn"
        assert reason in rec.reason
        w.write([{"seq": 5, "payload": "after"}])
    assert [o["seq"] for o in lines_of(path)] == [0, 1, 2, 3, 4, 5]
    side = lines_of(Path(rec.sidecar))
    assert len(side) == 1
    assert base64.b64decode(side[0]["base64"]) == torn
    assert side[0]["offset"] == good_size and side[0]["path"] == str(path)


def test_torn_file_with_no_complete_line_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"se')
    with JsonlWriter(path) as w:
        assert w.recovery is not None and w.recovery.offset == 0
    assert path.read_bytes() == b""


def test_complete_last_record_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"seq": 0}\n{"seq": 1}')
    with JsonlWriter(path) as w:
        assert w.recovery is not None
        assert w.recovery.torn_bytes == 0 and w.recovery.sidecar is None
        w.write([{"seq": 2}])
    assert [o["seq"] for o in lines_of(path)] == [0, 1, 2]
    assert not Path(str(path) + ".torn").exists()


def test_clean_file_reports_no_recovery(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    write_n(path, 2)
    with JsonlWriter(path) as w:
        assert w.recovery is None
    with JsonlWriter(tmp_path / "new.jsonl") as w:
        assert w.recovery is None


def test_append_false_does_not_recover(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a":1}\ngarbage')
    with JsonlWriter(path, append=False) as w:
        assert w.recovery is None
    assert path.read_bytes() == b""


def test_sidecar_accumulates_recoveries(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    for junk in (b"first", b"second"):
        write_n(path, 1)
        with path.open("ab") as f:
            f.write(junk)
        JsonlWriter(path).close()
    side = lines_of(Path(str(path) + ".torn"))
    assert [base64.b64decode(e["base64"]) for e in side] == [b"first", b"second"]
    assert len(lines_of(path)) == 2


def test_huge_unterminated_last_line_is_refused_not_moved(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a":1}\n' + b"x" * 5000)
    with pytest.raises(ReporterError, match=r"longer than MAX_LINE_BYTES=1000 bytes.*append=False"):
        JsonlWriter(path, max_line_bytes=1000)
    assert path.stat().st_size == 8 + 5000


# -- write errors --------------------------------------------------------------------


def _dev_full_writable() -> bool:
    try:
        fd = os.open("/dev/full", os.O_WRONLY)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.skipif(not _dev_full_writable(), reason="/dev/full is not writable here")
def test_disk_full_raises_write_error_and_keeps_the_lines() -> None:
    w = JsonlWriter("/dev/full")
    assert w.recovery is None
    with pytest.raises(WriteError, match=r"/dev/full.*1 line.*kept in memory") as info:
        w.write([{"a": 1}])
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError)
    assert w.unwritten_records == 1
    with pytest.raises(WriteError):
        w.write([{"b": 2}, {"c": 3}])
    assert w.unwritten_records == 3
    with pytest.raises(WriteError):
        w.flush()
    assert w.last_object() is None  # a device is not scanned
    with pytest.raises(WriteError, match="lost 3 unwritten line"):
        w.close()
    assert w.closed


def test_partial_write_then_failure_completes_the_line_on_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    real_write = os.write
    calls = {"n": 0}

    def flaky_write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:7]))  # half of the first line
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    with JsonlWriter(path) as w:
        monkeypatch.setattr(jsonl_mod, "_os_write", flaky_write)
        with pytest.raises(WriteError) as info:
            w.write([{"seq": 0, "p": "abcdef"}, {"seq": 1}])
        assert info.value.errno == errno.ENOSPC
        assert w.unwritten_records == 2
        assert w.lines_written == 0
        w.flush()  # the fault is gone
        assert w.unwritten_records == 0
        w.write([{"seq": 2}])
        assert w.lines_written == 3
    assert [o["seq"] for o in lines_of(path)] == [0, 1, 2]


def test_injected_eacces_raises_write_error_and_lines_follow_once_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    write_n(path, 2)
    real_write = os.write
    state = {"denied": True}

    def maybe_denied(fd: int, data: Any) -> int:
        if state["denied"]:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_write(fd, data)

    monkeypatch.setattr(jsonl_mod, "_os_write", maybe_denied)
    w = JsonlWriter(path)
    with pytest.raises(WriteError, match=r"Permission denied.*fix permissions") as info:
        w.write([{"seq": 2}])
    assert info.value.errno == errno.EACCES
    assert w.unwritten_records == 1
    state["denied"] = False
    w.close()
    assert [o["seq"] for o in lines_of(path)] == [0, 1, 2]


# -- last_object -----------------------------------------------------------------------


def test_last_object_returns_last_line_or_none(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as w:
        assert w.last_object() is None
        w.write([{"seq": 0}, {"seq": 1}])
        assert w.last_object() == {"seq": 1}


def test_last_object_scans_back_across_chunks_with_predicate(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as w:
        w.write([{"run_id": "a", "seq": 41}])
        # ~300 KiB of another run's records after it, several scan chunks.
        w.write({"run_id": "b", "seq": i, "pad": "y" * 200} for i in range(1500))
        found = w.last_object(lambda o: o.get("run_id") == "a")
        assert found == {"run_id": "a", "seq": 41}
        assert w.last_object(lambda o: o.get("run_id") == "zzz") is None
        last = w.last_object()
        assert last is not None and last["seq"] == 1499


def test_last_object_skips_lines_that_are_not_objects(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"seq": 0}\n[1, 2]\n\n')
    with JsonlWriter(path) as w:
        assert w.last_object() == {"seq": 0}


def test_last_object_finds_a_single_long_first_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    big = {"seq": 7, "pad": "z" * 200_000}
    with JsonlWriter(path) as w:
        w.write([big])
        assert w.last_object() == big


# -- co-appenders, the line limit, symlinks ---------------------------------------------


def test_a_line_left_half_written_is_written_again_whole_after_another_writers_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    real_write = os.write
    calls = {"n": 0}

    def flaky_write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:7]))  # half of the first line
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    a = JsonlWriter(path)
    with JsonlWriter(path) as b:
        monkeypatch.setattr(jsonl_mod, "_os_write", flaky_write)
        with pytest.raises(WriteError):
            a.write([{"w": "a", "p": "abcdef"}])
        b.write([{"w": "b"}])  # ends a's half line with a newline (recorded) first
        assert b.fragments == 1
    a.flush()  # the file no longer ends with a's half line: the line goes out whole
    a.close()
    reader = read_jsonl(path)
    assert list(reader) == [{"w": "b"}, {"w": "a", "p": "abcdef"}]
    assert reader.fragment_lines == [1]
    assert path.read_bytes().startswith(b'{"w":"a\n{"w":"b"}\n')


def test_lines_over_the_limit_are_refused_and_nothing_of_the_batch_is_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path, max_line_bytes=100) as w:
        assert w.max_line_bytes == 100
        w.write([{"pad": "x" * 89}])  # 100 bytes with its newline: the longest allowed
        with pytest.raises(RecordError, match=r"line 2 .* 101 bytes, longer than MAX_LINE"):
            w.write([{"a": 1}, {"b": 2}, {"pad": "x" * 90}])
        with pytest.raises(RecordError, match=r"line 0 .* 101 bytes"):
            w.write_bytes_lines([b'{"pad":"' + b"x" * 90 + b'"}\n'])
    assert lines_of(path) == [{"pad": "x" * 89}]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "100", jsonl_mod.MAX_LINE_BYTES + 1])
def test_a_line_limit_that_is_not_a_lower_positive_int_is_refused_naming_it(
    tmp_path: Path, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"max_line_bytes must be an int .*{bad!r}"):
        # `bad` is not always an int: the wrong type is the point
        JsonlWriter(tmp_path / "m.jsonl", max_line_bytes=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "m.jsonl").exists()


def test_a_writer_without_a_line_limit_takes_max_line_bytes(tmp_path: Path) -> None:
    with JsonlWriter(tmp_path / "m.jsonl") as w:
        assert w.max_line_bytes == jsonl_mod.MAX_LINE_BYTES


def test_the_writer_modules_never_import_the_reader() -> None:
    """The reader imports the writer's module (for its line limit), never the other way
    round: no import circle between twinkle.reporting.jsonl and .jsonl_reader."""
    import ast

    import twinkle.reporting

    folder = Path(twinkle.reporting.__file__).parent
    for name in (
        "jsonl",
        "_jsonl_batch",
        "_jsonl_files",
        "_jsonl_locks",
        "_jsonl_tail",
        "_jsonl_torn",
    ):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
            a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
        }
        assert "twinkle.reporting.jsonl_reader" not in imported, name
        assert "twinkle.reporting" not in imported, name  # (the package imports the reader)


def test_last_object_passes_over_a_line_longer_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"seq": 1}\n{"pad": "' + b"z" * 300_000 + b'"}\n{"x": 1}\n')
    with JsonlWriter(path, max_line_bytes=100_000) as w:
        assert w.last_object() == {"x": 1}
        assert w.last_object(lambda o: "seq" in o) == {"seq": 1}  # not the 300 KB line


def test_a_long_torn_tail_goes_to_the_sidecar_in_parts_that_fit_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torn_mod, "_SIDECAR_PART_BYTES", 1000)
    path = tmp_path / "m.jsonl"
    tail = b'{"pad": "' + b"q" * 3500
    path.write_bytes(b'{"a": 1}\n' + tail)
    with JsonlWriter(path) as w:
        assert w.recovery is not None and w.recovery.torn_bytes == len(tail)
    side = lines_of(Path(str(path) + ".torn"))
    assert [(e["part"], e["parts"]) for e in side] == [(k, 4) for k in range(4)]
    assert b"".join(base64.b64decode(e["base64"]) for e in side) == tail
    assert [e["part_offset"] for e in side] == [9 + 1000 * k for k in range(4)]
    assert lines_of(path) == [{"a": 1}]


def test_a_planted_symlink_is_refused_naming_it_and_never_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep\n")
    link = tmp_path / "m.jsonl"
    link.symlink_to(target)
    for append in (True, False):
        with pytest.raises(ReporterError, match=r"m\.jsonl'.*symbolic link.*remove the link"):
            JsonlWriter(link, append=append)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ReporterError, match=r"dangling\.jsonl'.*symbolic link"):
        JsonlWriter(tmp_path / "dangling.jsonl")
    assert target.read_bytes() == b"keep\n" and not (tmp_path / "nowhere").exists()
