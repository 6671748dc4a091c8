"""A framework's own figures beside twinkle's (twinkle.observers.compare, config.compare):
a run with a manual clock, worked by hand; a bad section named; replay byte-identical."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from twinkle.errors import ConfigError
from twinkle.perf import ManualClock
from twinkle.run import RunSession, replay

MS = 10**6
COMPARE = {
    "scalars": "fw",
    "seconds": {"step": "timing_s/step", "gen": "timing_s/gen"},
    "throughput": {"key": "perf/throughput", "span": "step", "samples": "rollout", "devices": 2},
}


def _run(out: Path, compare: dict[str, Any] | None) -> Path:
    clock = ManualClock(10**9)
    config: dict[str, Any] = {"phases": {"step": ["step"]}}
    if compare is not None:
        config["compare"] = compare
    with RunSession(
        out_dir=out,
        run_id="r",
        config=config,
        clock=clock,
        wall_clock=lambda: 1_700_000_000 * 10**9 + clock(),
        autoload=False,
        background_writer=False,
    ) as run:
        for i, (gen_ms, theirs_gen, theirs_tp) in enumerate(((100, 0.1, 40.0), (200, 0.19, 20.0))):
            run.bus.iteration_started(i)
            with run.recorder.span("step", iteration=i):
                for _ in range(2):  # a timer that runs twice in a step: its seconds add up
                    with run.recorder.span("gen", iteration=i):
                        clock.advance(gen_ms // 2 * MS)
                clock.advance(300 * MS)
            run.bus.samples(iteration=i, phase="rollout", lengths=[10, 14])
            run.bus.samples(iteration=i, phase="train", lengths=[99])  # another tag
            figures = {"timing_s/gen": theirs_gen, "perf/throughput": theirs_tp}
            if i == 0:
                figures["timing_s/step"] = 0.4
            run.bus.scalars(iteration=i, name="fw", values=figures)
            run.bus.scalars(iteration=i, name="other", values={"timing_s/gen": 9.0})
    return out / "r"


def test_each_figure_is_set_beside_twinkles(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, COMPARE)
    compare = json.loads((run_dir / "summary.json").read_text())["compare"]
    assert compare["scalars"] == "fw"
    # gen: 0.1 s and 0.2 s against theirs 0.1 and 0.19
    gen = compare["seconds"]["gen"]
    assert gen["key"] == "timing_s/gen" and gen["iterations"] == 2
    assert gen["twinkle_seconds"] == pytest.approx(0.3)
    assert gen["theirs_seconds"] == pytest.approx(0.29)
    assert gen["max_difference_seconds"] == pytest.approx(0.01)
    # step: logged in iteration 0 only (0.4 s both)
    step = compare["seconds"]["step"]
    assert step["iterations"] == 1 and step["max_difference_seconds"] == pytest.approx(0.0)
    # throughput: 24 rollout tokens over the step's 0.4 s and 0.5 s on 2 devices
    # = 30 and 24 tokens/s/device, against theirs 40 and 20
    tp = compare["throughput"]
    assert tp["iterations"] == 2
    assert tp["twinkle_mean"] == pytest.approx(27.0)
    assert tp["theirs_mean"] == pytest.approx(30.0)
    assert tp["max_relative_difference"] == pytest.approx(0.25)  # |30/40 - 1| and |24/20 - 1|


def test_the_report_sets_them_beside_the_window_figure(tmp_path: Path) -> None:
    """The figures above in words; a timer the framework never logged is named."""
    from twinkle.report import format_report, load_report

    seconds = {"step": "timing_s/step", "gen": "timing_s/gen", "reward": "timing_s/reward"}
    compare = {**COMPARE, "seconds": seconds}
    run_dir = _run(tmp_path, compare)
    reward = json.loads((run_dir / "summary.json").read_text())["compare"]["seconds"]["reward"]
    assert reward == {  # nothing compared: no 0 s
        "key": "timing_s/reward",
        "iterations": 0,
        "twinkle_seconds": None,
        "theirs_seconds": None,
        "max_difference_seconds": None,
    }
    text = format_report(load_report(run_dir))
    assert (
        "fw's own            perf/throughput 30.000 (mean of 2 steps) against 27.000 "
        "recomputed from the log, largest difference 25.0% (its definition: a step's tokens "
        "over its step span; the window figure above also counts the time between steps)"
    ) in text
    assert (
        "  timers            2 of fw's timers against their spans over their steps: largest "
        "difference 0.0100 s (gen); never logged: reward\n"
    ) in text


def test_the_comparison_replays_byte_identical(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, COMPARE)
    replay(run_dir, tmp_path / "again")
    for name in ("summary.json", "metrics_raw.jsonl"):
        assert (tmp_path / "again" / name).read_bytes() == (run_dir / name).read_bytes()


def test_no_section_no_comparison(tmp_path: Path) -> None:
    summary = json.loads((_run(tmp_path, None) / "summary.json").read_text())
    assert "compare" not in summary


@pytest.mark.parametrize(
    ("compare", "match"),
    [
        ({"seconds": {}}, "config.compare.scalars"),
        ({"scalars": "fw", "secs": {}}, r"unknown key\(s\) \['secs'\] in config.compare"),
        ({"scalars": "fw", "seconds": {"gen": 3}}, "config.compare.seconds"),
        (
            {"scalars": "fw", "throughput": {"key": "k", "span": "s", "samples": "r"}},
            "config.compare.throughput.devices",
        ),
    ],
)
def test_a_bad_section_names_the_key(tmp_path: Path, compare: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RunSession(
            out_dir=tmp_path, run_id="r", config={"compare": compare}, autoload=False
        ).start()
