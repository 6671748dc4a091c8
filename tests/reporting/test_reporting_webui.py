"""WebUIFlatBackend: one flat numeric object per iteration, merged across kinds."""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.reporting import (
    JsonlBackend,
    MetricRecord,
    MetricsReporter,
    WebUIFlatBackend,
    make_record,
)

RUN = "flat-run"


def rec(kind: str, step: int, values: dict[str, Any], wall_ns: int = 0, **kw: Any) -> MetricRecord:
    return make_record(
        kind=kind,
        scope=kw.pop("scope", "iteration"),
        run_id=RUN,
        step=step,
        iteration=kw.pop("iteration", step),
        wall_ns=wall_ns or (1_700_000_000 + step) * 10**9,
        monotonic_ns=step,
        values=values,
        **kw,
    )


def flat_lines(path: Path) -> list[dict[str, Any]]:
    def reject(name: str) -> Any:
        raise ValueError(name)

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_records_of_one_iteration_merge_into_one_line_in_deterministic_key_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=10)
    b.write([rec("train", 1, {"loss": 0.5, "tokens": 10}), rec("rollout", 1, {"tokens": 7})])
    b.write([rec("train", 2, {"loss": 0.25})])
    b.close()
    lines = flat_lines(path)
    assert lines == [
        {
            "ts": 1_700_000_001.0,
            "step": 1,
            "total_steps": 10,
            "iteration": 1,
            "rollout/tokens": 7,
            "train/loss": 0.5,
            "train/tokens": 10,
        },
        {"ts": 1_700_000_002.0, "step": 2, "total_steps": 10, "iteration": 2, "train/loss": 0.25},
    ]
    assert list(lines[0]) == [
        "ts",
        "step",
        "total_steps",
        "iteration",
        "rollout/tokens",
        "train/loss",
        "train/tokens",
    ]


def test_line_is_written_once_an_iteration_hold_later_arrives_or_at_flush(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=3, hold=2)
    b.write([rec("train", 0, {"a": 1})])
    b.write([rec("train", 1, {"a": 3})])
    assert path.read_text() == ""
    b.write([rec("timing", 0, {"late": 9})])  # iteration 0 is still open: same line
    assert path.read_text() == ""
    b.write([rec("train", 2, {"a": 4})])
    assert [(x["iteration"], x.get("timing/late")) for x in flat_lines(path)] == [(0, 9)]
    b.flush()
    assert [line["iteration"] for line in flat_lines(path)] == [0, 1, 2]
    b.flush()  # nothing pending: no empty line
    b.close()
    assert [line["iteration"] for line in flat_lines(path)] == [0, 1, 2]


def test_run_and_window_records_never_reach_the_flat_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=3)
    b.write([rec("iteration", 2, {"tokens": 10})])
    b.write([rec("iteration", 2, {"tokens": 999}, scope="run")])
    b.write([rec("rollout", 2, {"tokens": 999}, scope="window")])
    b.close()
    (line,) = flat_lines(path)
    assert line["iteration/tokens"] == 10
    assert "rollout/tokens" not in line


def test_interleaved_iterations_still_give_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=3, hold=3)
    # the end of a run: several observers each finalise the last iterations
    b.write([rec("timing", 1, {"a": 1}), rec("timing", 2, {"a": 2})])
    b.write([rec("rollout", 1, {"b": 1}), rec("rollout", 2, {"b": 2})])
    b.close()
    assert flat_lines(path) == [
        {
            "ts": 1_700_000_001.0,
            "step": 1,
            "total_steps": 3,
            "iteration": 1,
            "rollout/b": 1,
            "timing/a": 1,
        },
        {
            "ts": 1_700_000_002.0,
            "step": 2,
            "total_steps": 3,
            "iteration": 2,
            "rollout/b": 2,
            "timing/a": 2,
        },
    ]


def test_values_are_numeric_only_and_non_finite_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=1)
    b.write(
        [rec("train", 0, {"ok": 2, "bad": float("nan"), "inf": float("inf")}, attrs={"s": "x"})]
    )
    b.close()
    (line,) = flat_lines(path)
    assert line == {"ts": line["ts"], "step": 0, "total_steps": 1, "iteration": 0, "train/ok": 2}
    assert all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in line.values())


def test_ts_is_latest_wall_time_of_the_iteration_step_highest_and_later_values_win(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    b = WebUIFlatBackend(path, total_steps=5)
    b.write(
        [
            rec("train", 4, {"x": 1}, wall_ns=2_000_000_000),
            rec("train", 5, {"x": 2}, wall_ns=3_500_000_000, iteration=4),
            rec("rollout", 4, {"y": 1}, wall_ns=2_500_000_000),
        ]
    )
    b.close()
    (line,) = flat_lines(path)
    assert line["ts"] == 3.5
    assert line["train/x"] == 2
    assert line["step"] == 5


def test_flat_file_appends_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for step in range(3):
        b = WebUIFlatBackend(path, total_steps=3)
        b.write([rec("train", step, {"a": step})])
        b.close()
    assert [line["step"] for line in flat_lines(path)] == [0, 1, 2]


def test_through_a_reporter_next_to_the_raw_file(tmp_path: Path) -> None:
    raw, flat = tmp_path / "metrics_raw.jsonl", tmp_path / "metrics.jsonl"
    with MetricsReporter(
        [JsonlBackend(raw), WebUIFlatBackend(flat, total_steps=2)], run_id=RUN, background=True
    ) as reporter:
        for step in range(2):
            reporter.report(rec("rollout", step, {"tokens": 10 * step}))
            reporter.report(rec("train", step, {"loss": 1.0 / (step + 1), "p95": float("nan")}))
    assert len(flat_lines(raw)) == 4
    assert flat_lines(flat) == [
        {
            "ts": 1_700_000_000.0,
            "step": 0,
            "total_steps": 2,
            "iteration": 0,
            "rollout/tokens": 0,
            "train/loss": 1.0,
        },
        {
            "ts": 1_700_000_001.0,
            "step": 1,
            "total_steps": 2,
            "iteration": 1,
            "rollout/tokens": 10,
            "train/loss": 0.5,
        },
    ]


@pytest.mark.parametrize("bad", [-1, 1.5, None, True, "10"])
def test_total_steps_must_be_a_non_negative_int(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"total_steps must be an int >= 0.*{bad!r}"):
        # `bad` is not always an int: the wrong type is the point
        WebUIFlatBackend(tmp_path / "m.jsonl", total_steps=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_hold_must_be_a_positive_int(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"hold must be an int >= 1.*{bad!r}"):
        # `bad` is not always an int: the wrong type is the point
        WebUIFlatBackend(tmp_path / "m.jsonl", total_steps=1, hold=bad)  # type: ignore[arg-type]
