"""ReplacingFile: whole or nothing at commit, discard, symlinks refused, a failed commit
keeps the previous file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from twinkle.errors import ReporterError, WriteError
from twinkle.reporting import ReplacingFile


def test_replacing_file_puts_the_whole_file_in_place_at_commit_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "whole.json"
    out = ReplacingFile(path)
    out.write(b"[1,")
    assert not path.exists()
    out.write(b"2]\n")
    out.commit()
    assert path.read_bytes() == b"[1,2]\n" and out.closed
    again = ReplacingFile(path)
    again.write(b"half")
    again.discard()
    assert path.read_bytes() == b"[1,2]\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["whole.json"]
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(ReporterError, match=r"link\.json'.*symbolic link"):
        ReplacingFile(tmp_path / "link.json")


def test_replacing_file_that_cannot_be_put_in_place_keeps_the_old_and_says_so(
    tmp_path: Path,
) -> None:
    path = tmp_path / "taken"
    path.mkdir()  # a rename onto a directory fails
    (path / "inside").write_bytes(b"x")
    out = ReplacingFile(path)
    out.write(b"data")
    with pytest.raises(WriteError, match=r"cannot write .*taken'.*previous file .* is kept"):
        out.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_write_the_disk_refuses_names_the_file(tmp_path: Path) -> None:
    """A full disk or a file size limit while writing (``--html`` under ``ulimit -f``):
    the error names the file, as a failed commit does; the old file is kept."""
    path = tmp_path / "report.html"
    path.write_bytes(b"old")
    out = ReplacingFile(path)

    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(errno.EFBIG, "File too large")

    real, out._file = out._file, Full()  # type: ignore[assignment]
    try:
        with pytest.raises(WriteError, match=r"File too large: '.*report\.html'$") as caught:
            out.write(b"data")
        assert (caught.value.strerror, caught.value.filename) == ("File too large", str(path))
    finally:
        out._file = real
    out.discard()
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_what_killed_writers_left_is_removed_also_under_this_processs_pid(
    tmp_path: Path,
) -> None:
    """A container's first process restarted has the pid of the one killed: the
    temporary file that one left (up to 7/8 of the trace's budget) was kept as this
    process's own, one more per restart. It goes; a file this process has open stays,
    and so does one of a live process."""
    path = tmp_path / "trace.json"
    mine = ReplacingFile(path)  # open in this process
    same_pid = tmp_path / f".trace.json.{os.getpid()}.0badf00d.tmp"  # the killed one's
    same_pid.write_bytes(b"[{...")
    live = tmp_path / f".trace.json.{os.getppid()}.00c0ffee.tmp"  # a live process's
    live.write_bytes(b"[{...")
    again = ReplacingFile(path)
    assert not same_pid.exists()
    assert mine.tmp.exists() and live.exists() and again.tmp.exists()
    mine.discard()
    again.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "trace.json"]


def test_a_summary_the_disk_refuses_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """summary.json on a full disk: the file, the reason and the fix, each said once."""
    from twinkle.run._summary import write_summary

    def full(self: ReplacingFile, data: bytes) -> None:
        raise WriteError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(ReplacingFile, "write", full)
    path = tmp_path / "summary.json"
    with pytest.raises(WriteError) as caught:
        write_summary(path, {"status": "ok"})
    assert str(caught.value) == (
        f"[Errno {errno.ENOSPC}] cannot write {str(path)!r}: No space left on device; the "
        f"summary can be rebuilt: twinkle replay {str(tmp_path)!r}"
    )
    assert list(tmp_path.iterdir()) == []
