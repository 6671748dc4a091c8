"""read_jsonl / JsonlReader: order, blank lines, errors naming file:line, skip mode, the
bounded line limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinkle.errors import InvalidArgumentError, RecordError, ReporterError
from twinkle.reporting import MAX_LINE_BYTES, read_jsonl


def test_read_jsonl_yields_objects_in_order_and_ignores_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n\n  \n{"a": 2}')
    reader = read_jsonl(path)
    assert list(reader) == [{"a": 1}, {"a": 2}]
    assert reader.skipped == 0


def test_read_jsonl_names_file_and_line_on_error(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": NaN}\n')
    it = read_jsonl(path)
    assert next(it) == {"a": 1}
    with pytest.raises(RecordError, match=rf"{path}:2: invalid JSON"):
        next(it)
    path.write_bytes(b'{"a": 1}\n[1]\n')
    with pytest.raises(RecordError, match=rf"{path}:2: expected a JSON object, got list"):
        list(read_jsonl(path))


def test_read_jsonl_skip_mode_counts_skipped_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\ntorn{\n"str"\n{"a": 2}\n{"a": 3')
    reader = read_jsonl(path, on_error="skip")
    assert list(reader) == [{"a": 1}, {"a": 2}]
    assert reader.skipped == 3
    assert reader.skipped_lines == [2, 3, 5]


def test_read_jsonl_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="on_error must be 'raise' or 'skip'"):
        read_jsonl(tmp_path / "x", on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ReporterError, match=r"cannot read .*missing.jsonl"):
        list(read_jsonl(tmp_path / "missing.jsonl"))


def test_read_jsonl_skips_a_line_over_the_limit_reading_it_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"x" * 5_000_000 + b'\n{"a": 2}\n')
    reader = read_jsonl(path, on_error="skip", max_line_bytes=1000)
    assert list(reader) == [{"a": 1}, {"a": 2}]
    assert reader.skipped_lines == [2]
    with pytest.raises(RecordError, match=r"m\.jsonl:2: line longer than MAX_LINE_BYTES=1000"):
        list(read_jsonl(path, allow_torn_tail=True, max_line_bytes=1000))


def test_a_reader_line_limit_that_is_not_a_lower_positive_int_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"max_line_bytes must be an int .* got 0"):
        read_jsonl(tmp_path / "m.jsonl", max_line_bytes=0)
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    assert read_jsonl(path).max_line_bytes == MAX_LINE_BYTES
