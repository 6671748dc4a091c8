"""Resume only on purpose (issue 27, item 6): a run whose last segment finished ``ok`` is
never extended unless the caller asks (``resume=True``, ``twinkle demo --resume``,
``train(resume_from_checkpoint=...)``); one that crashed or ended in ``error`` is
continued without asking (a restarted job recovers); the refusal comes before anything
is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.cli import EXIT_USAGE, main
from twinkle.errors import FinishedRunError, InvalidArgumentError
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG, crashed_run, scripted_run

FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def _files(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in FILES}


def _summary(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def _session(out: Path, **options: Any) -> RunSession:
    return RunSession(out_dir=out, run_id="r", config=SCRIPTED_CONFIG, autoload=False, **options)


def test_a_run_that_finished_ok_is_not_extended_without_asking(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, "r", 2, autoload=False)
    before = _files(log.parent)
    with pytest.raises(FinishedRunError) as caught:
        _session(tmp_path).start()
    message = str(caught.value)
    assert "run 'r' in" in message and "finished ok (segment 0, last iteration 1" in message
    assert "pass RunSession(resume=True) to continue it" in message
    assert "or another run_id" in message
    assert _files(log.parent) == before  # nothing written, the summary still says ok
    # Asked, it goes on: a second segment numbering on.
    with _session(tmp_path, resume=True) as run:
        assert run.resumed is not None and run.resumed.next_iteration == 2
    assert [s["status"] for s in _summary(log.parent)["segments"]] == ["ok", "ok"]


def test_a_crashed_run_is_continued_without_asking(tmp_path: Path) -> None:
    crashed_run(tmp_path, "r", 2)
    with _session(tmp_path) as run:  # a restarted job recovers
        assert run.resumed is not None and run.resumed.previous_status is None


def test_a_run_whose_last_segment_ended_in_error_is_continued_without_asking(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError), _session(tmp_path) as run:
        run.bus.iteration_started(0)
        raise RuntimeError("the trainer broke")
    with _session(tmp_path) as run:
        assert run.resumed is not None and run.resumed.previous_status == "error"
    segments = _summary(tmp_path / "r")["segments"]
    assert [s["status"] for s in segments] == ["error", "ok"]  # the first stays an error


def test_resume_false_never_continues_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    crashed_run(tmp_path, "r", 1)
    with pytest.raises(FinishedRunError, match=r"resume=False does not continue a run"):
        _session(tmp_path, resume=False).start()
    with pytest.raises(InvalidArgumentError, match=r"resume must be True, False or None"):
        _session(tmp_path, resume="yes")
    # A directory without the run's log is a new run for every value.
    with _session(tmp_path / "new", resume=False) as run:
        assert run.resumed is None


def test_the_demo_run_twice_is_refused_with_the_fix_and_continues_with_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--out", str(tmp_path), "--run-id", "x", "--iterations", "2"]
    argv += ["--no-progress", "--no-autoload"]
    assert main(argv) == 0
    capsys.readouterr()
    before = _files(tmp_path / "x")
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: run 'x' in ") and err.count("\n") == 1
    assert "pass --resume to continue it (--iterations more), or give --run-id a new id" in err
    assert _files(tmp_path / "x") == before  # byte for byte
    assert main([*argv, "--resume"]) == 0
    summary = _summary(tmp_path / "x")
    assert summary["iterations"] == 4 and len(summary["segments"]) == 2


def test_a_trl_train_from_step_0_on_a_finished_run_is_refused_naming_the_trl_fix(
    tmp_path: Path,
) -> None:
    pytest.importorskip("trl")
    from reliability.test_reliability_round3_resume_config import _grpo
    from twinkle.integrations.trl import TwinkleCallback

    runs = str(tmp_path / "runs")
    _grpo(tmp_path, TwinkleCallback(out_dir=runs, run_id="grpo"), max_steps=2).train()
    before = _files(tmp_path / "runs" / "grpo")
    again = _grpo(tmp_path, TwinkleCallback(out_dir=runs, run_id="grpo"), max_steps=2)
    with pytest.raises(FinishedRunError) as caught:
        again.train()
    message = str(caught.value)
    assert "train(resume_from_checkpoint=...) continues it" in message
    assert "TwinkleCallback(resume=True)" in message
    assert _files(tmp_path / "runs" / "grpo") == before
