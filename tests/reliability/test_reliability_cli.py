"""The command line end to end: blocking any built-in observer leaves the demo's output
readable (or is refused in one line), a run that fails to start exits 1 in one line, and
the help says how a trainer of one's own finishes on signals."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from reliability._scripted import BUILTINS, scripted_run
from twinkle.cli import build_parser, main
from twinkle.plugins import DISABLE_AUTOLOAD_ENV

DEMO = ["demo", "--iterations", "2", "--prompts", "2", "--completions", "2"]
DEMO += ["--micro-batch", "4", "--grad-accum", "1", "--no-progress", "--no-autoload"]


@pytest.mark.parametrize("blocked", sorted(BUILTINS))
def test_demo_with_any_builtin_blocked_prints_its_summary_or_one_line(
    blocked: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*DEMO, "--out", str(tmp_path), "--run-id", "r", "--block", blocked])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if blocked == "timeline":  # the timing observer needs it: refused at the start
        assert rc == 2
        assert captured.err.startswith("twinkle: error: observer 'timing' reads the run's")
        assert captured.err.count("\n") == 1
        return
    assert rc == 0, captured.err
    assert "run r: ok" in captured.out
    counted = "n/a" if blocked == "throughput" else "8"  # its observer counts them
    assert f"samples generated       {counted} (those the trainer took: " in captured.out
    assert "None" not in captured.out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["observer_failures"] == {}
    if blocked in ("metrics_raw", "events"):
        missing = {"metrics_raw": "metrics_raw.jsonl", "events": "events.jsonl"}[blocked]
        assert not (tmp_path / "r" / missing).exists()
        assert f"(no report: the run wrote no {missing}; is {blocked} blocked?)" in captured.out
    else:
        assert "tok/s/dev" in captured.out


@pytest.fixture
def refusing_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed observer that cannot set up (a TwinkleError in twinkle_configure:
    it is left out of the run, unless the run requires it)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "twinkle_refuses.py").write_text(
        "from twinkle.errors import TwinkleError\n"
        "from twinkle.hookspecs import hookimpl\n\n"
        "class Refuses:\n"
        "    @hookimpl\n"
        "    def twinkle_configure(self, context):\n"
        "        raise TwinkleError('the licence server at 10.0.0.1 does not answer')\n"
    )
    info = site / "twinkle_refuses-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twinkle-refuses\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[twinkle.observers]\nrefuses = twinkle_refuses:Refuses\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    importlib.invalidate_caches()
    return site


def test_a_plugin_that_cannot_set_up_is_left_out_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refusing_plugin: Path
) -> None:
    log = scripted_run(tmp_path / "live", run_id="refused")  # (autoload off)
    out = tmp_path / "out"
    assert main(["replay", str(log), "--out", str(out)]) == 0
    assert "plugin 'refuses' left out of the run" in caplog.text  # (stderr, in the command)
    assert "the licence server at 10.0.0.1 does not answer" in caplog.text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["plugins_left_out"] == {}  # the run's, from its log: the replay's own
    # plugin set is not the run's (named on stderr, as above)


def test_a_run_that_cannot_start_exits_1_in_one_line_and_leaves_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], refusing_plugin: Path
) -> None:
    runs = tmp_path / "runs"
    argv = ["demo", "--out", str(runs), "--run-id", "r", "--iterations", "1"]
    assert main([*argv, "--require-plugin", "refuses"]) == 1
    lines = capsys.readouterr().err.replace("\r", "\n").split("\n")
    said = [line for line in lines if line.startswith("twinkle:")]  # (not the progress bar)
    assert said == ["twinkle: error: the licence server at 10.0.0.1 does not answer"]
    assert not (runs / "r").exists()


def test_help_says_how_signals_end_a_run_and_how_a_trainer_gets_the_same() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "exit 130, 143, 129" in text
    assert "with twinkle.run.finish_on_signals(), RunSession(...) as run:" in text
