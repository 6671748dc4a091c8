"""What a run's configuration leaves uncounted is said, not shown as idle or as 0: the
spans no phase names, counted by name in ``summary.json`` ``spans.no_phase`` and named by
the report (their time is not busy), and the tokens of a run without ``config.window``
(docs/metrics.md). Every duration here is given, so the answers are worked by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import check_replay, check_run
from observers.test_scripted_run import manual_session
from twinkle.observers import _no_phase
from twinkle.perf import Span
from twinkle.report import format_report, load_report
from twinkle.report._no_phase_text import no_phase_lines, unnamed_work_line
from twinkle.run import replay

MS = 1_000_000
CONFIG: dict[str, Any] = {"phases": {"train": ["train.*"]}}
#: a streaming run's, generation and training in phases of their own
STREAMING: dict[str, Any] = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
    "streaming": {"generation": "rollout", "training": "train"},
}


def _s(name: str, start_ms: int, end_ms: int, **attrs: Any) -> Span:
    return Span(name, start_ms * MS, end_ms * MS, 1, 1, attrs, None)


def _run(out: Path, spans: list[Span]) -> Path:
    run, clock = manual_session(out, "no-phase", CONFIG)
    clock.set(10 * MS)
    run.bus.iteration_started(0)
    clock.set(99 * MS)
    run.bus.publish_spans("main", run.bus.anchor, spans)
    clock.set(100 * MS)
    run.finish()
    assert run.out_dir is not None
    return run.out_dir


def _iteration(run: Any, clock: Any, it: int, spans: list[Span], *, sent_ms: int) -> None:
    """Start iteration ``it`` at ``100 * it`` ms and publish its spans at ``sent_ms``."""
    clock.set(100 * it * MS)
    run.bus.iteration_started(it)
    clock.set(sent_ms * MS)
    run.bus.publish_spans("main", run.bus.anchor, spans)


def _summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = orjson.loads((run_dir / "summary.json").read_bytes())
    return summary


def test_spans_no_phase_names_are_counted_and_named_by_the_report(tmp_path: Path) -> None:
    run_dir = _run(
        tmp_path / "run",
        [
            _s("train.step", 10, 40, iteration=0),  # a phase's: busy 30 ms
            _s("train_step", 40, 60, iteration=0),  # no phase's: 20 ms
            _s("train_step", 60, 65, iteration=0),  # 5 ms more
            _s("save", 65, 90),  # 25 ms, no iteration attribute
            _s("wait.rollout", 90, 95),  # a wait: in no phase by design
            _s("twinkle.observe", 95, 96),  # twinkle's own: neither
        ],
    )
    summary = _summary(run_dir)
    assert summary["spans"]["no_phase"] == {
        "spans": 3,
        "seconds": 0.05,
        "names": {
            "save": {"spans": 1, "seconds": 0.025, "idle_seconds": 0.025},
            "train_step": {"spans": 2, "seconds": 0.025, "idle_seconds": 0.025},
        },
        "other": {"spans": 0, "seconds": 0.0, "idle_seconds": 0.0},
    }
    seconds = summary["seconds"]
    assert seconds["busy_seconds"] == 0.03  # train.step alone
    assert seconds["idle_seconds"] == 0.07  # of the run's 100 ms
    # idle while only unnamed work ran: [40, 90) (the wait and twinkle's own are not)
    assert seconds["unnamed_seconds"] == 0.05
    (timing,) = [
        r["values"]
        for r in map(orjson.loads, (run_dir / "metrics_raw.jsonl").read_bytes().splitlines())
        if r["kind"] == "timing" and r["scope"] == "iteration"
    ]
    assert timing["window_unnamed_seconds"] == 0.05
    lines = format_report(load_report(run_dir)).splitlines()
    at = next(k for k, x in enumerate(lines) if x.startswith("in no phase"))
    assert lines[at].startswith("in no phase         0.050 s idle (71% of idle) ran only spans")
    assert "config.phases" in lines[at]
    # equal seconds: by name
    assert lines[at + 1] == (
        "  idle by name      save 0.025 s (1 span), train_step 0.025 s (2 spans)"
    )
    assert (
        "  unnamed work      0.050 s of the run's idle ran spans no phase names (the most: "
        "save 0.025 s): that idle may be work"
    ) in lines
    replay(run_dir / "events.jsonl", tmp_path / "replayed")
    assert (tmp_path / "replayed" / "summary.json").read_bytes() == (
        run_dir / "summary.json"
    ).read_bytes()


def test_names_beyond_the_kept_ones_are_counted_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_no_phase, "NAMES_KEPT", 2)
    spans = [_s(f"step{k}", 10 + 10 * k, 15 + 10 * k) for k in range(5)]  # 5 ms each
    run_dir = _run(tmp_path / "run", [*spans, _s("step0", 70, 80)])
    no_phase = _summary(run_dir)["spans"]["no_phase"]
    assert no_phase["spans"] == 6
    assert no_phase["seconds"] == 0.035
    # no phase ran: every span's time is idle, and no two overlap
    assert no_phase["names"] == {
        "step0": {"spans": 2, "seconds": 0.015, "idle_seconds": 0.015},  # (its later span too)
        "step1": {"spans": 1, "seconds": 0.005, "idle_seconds": 0.005},
    }
    assert no_phase["other"] == {"spans": 3, "seconds": 0.015, "idle_seconds": 0.015}
    assert _summary(run_dir)["seconds"]["unnamed_seconds"] == 0.035
    text = format_report(load_report(run_dir))
    assert "0.035 s idle (35% of idle)" in text
    assert (
        "idle by name      later names 0.015 s (3 spans), step0 0.015 s (2 spans), "
        "step1 0.005 s (1 span)\n" in text
    )


def test_names_are_ranked_by_the_idle_they_ran_in_not_their_summed_seconds(
    tmp_path: Path,
) -> None:
    """A timer nested in a phase's span (40 ms of ``fwd``) runs in no idle; ``save``,
    10 ms after training, is the name the idle is for, and the one the report names."""
    run_dir = _run(
        tmp_path / "run",
        [
            _s("train.step", 10, 60, iteration=0),
            _s("fwd", 10, 50, iteration=0),
            _s("save", 60, 70, iteration=0),
            _s("log", 65, 75, iteration=0),  # (5 ms of it with save's: both count it)
        ],
    )
    summary = _summary(run_dir)
    assert summary["spans"]["no_phase"]["names"] == {
        "fwd": {"spans": 1, "seconds": 0.04, "idle_seconds": 0.0},
        "log": {"spans": 1, "seconds": 0.01, "idle_seconds": 0.01},
        "save": {"spans": 1, "seconds": 0.01, "idle_seconds": 0.01},
    }
    assert summary["seconds"]["unnamed_seconds"] == 0.015  # [60, 75)
    text = format_report(load_report(run_dir))
    assert "  idle by name      log 0.010 s (1 span), save 0.010 s (1 span)\n" in text
    assert "fwd" not in text
    assert (
        "  unnamed work      0.015 s of the run's idle ran spans no phase names (the most: "
        "log 0.010 s): that idle may be work" in text
    )


def test_spans_in_no_phase_inside_a_phases_are_busy_and_not_reported(tmp_path: Path) -> None:
    """A library's timers nested in a phase's span (TRL's): counted by name, no idle."""
    run_dir = _run(
        tmp_path / "run",
        [_s("fwd", 15, 25, iteration=0), _s("train.step", 10, 40, iteration=0)],
    )
    summary = _summary(run_dir)
    assert summary["spans"]["no_phase"]["names"] == {
        "fwd": {"spans": 1, "seconds": 0.01, "idle_seconds": 0.0}
    }
    assert summary["seconds"]["unnamed_seconds"] == 0.0
    assert "in no phase" not in format_report(load_report(run_dir))


def test_a_run_without_config_window_says_it_counts_no_tokens(tmp_path: Path) -> None:
    """Its run record reads 0 tokens/s (docs/metrics.md: no window, no tokens); the
    report says why instead of quoting that 0."""
    run_dir = _run(tmp_path / "run", [_s("train.step", 10, 40, iteration=0)])
    assert _summary(run_dir)["window"]["tokens_per_s_per_device"] == 0.0
    text = format_report(load_report(run_dir))
    assert "the run's: not counted, config.window names no samples tag" in text
    assert "whole loop" not in text
    assert "steady state        " not in text
    assert "peak memory         none read (run.read_memory(iteration=i)" in text  # (nor that)


def test_a_loop_numbering_its_samples_otherwise_and_naming_training_otherwise(
    tmp_path: Path,
) -> None:
    """A newcomer's loop: rollout samples published with ``iteration=4 * it`` (a step
    count) and the training span named ``train_step`` where the phases say ``train.*``.
    The report names the iterations that never started and says training ran in no
    phase, rather than only quoting 0 tokens and "at most 0% shorter"."""
    run, clock = manual_session(tmp_path, "newcomer", STREAMING)
    for it in range(4):
        at = 100 * it
        spans = [_s("generate", at, at + 40, iteration=it), _s("train_step", at + 40, at + 90)]
        _iteration(run, clock, it, spans, sent_ms=at + 95)
        run.bus.samples(iteration=4 * it, phase="rollout", lengths=[10])
    clock.set(400 * MS)
    run.finish()
    assert run.out_dir is not None
    text = format_report(load_report(run.out_dir))
    # iterations 0-3 started; the samples of 4, 8 and 12 (10 tokens each) are in none
    assert "3 iterations observed but never started (4, 8, 12; the last started: 3)" in text
    assert "tokens 30 rollout in no iteration's figures" in text
    assert "training: none ran (no span of its phase)" in text
    # [40, 90) of each 100 ms window: 4 x 50 ms of idle ran train_step
    assert _summary(run.out_dir)["seconds"]["unnamed_seconds"] == 0.2
    assert "unnamed work      0.200 s of the run's idle ran spans no phase names" in text


def test_a_loop_that_never_starts_an_iteration_is_told_to(tmp_path: Path) -> None:
    config = {"phases": {"rollout": ["generate"]}, "window": {"samples": "rollout", "devices": 1}}
    run, clock = manual_session(tmp_path, "unstarted", config)
    for it in range(2):
        clock.set((100 * it + 50) * MS)
        run.bus.samples(iteration=it, phase="rollout", lengths=[10])
    clock.set(200 * MS)
    run.finish()
    assert run.out_dir is not None
    text = format_report(load_report(run.out_dir))
    assert "2 iterations observed but never started (0, 1; none started: call " in text
    assert "run.bus.iteration_started(i) as each iteration begins)" in text


def test_a_tag_whose_samples_events_were_all_empty_is_named(tmp_path: Path) -> None:
    """``lengths=[]`` every iteration: the tag was seen, its tokens are 0, and the
    report says why rather than quoting 0 tokens/s alone."""
    config = {"phases": {"rollout": ["generate"]}, "window": {"samples": "rollout", "devices": 1}}
    run, clock = manual_session(tmp_path, "empty", config)
    for it in range(3):
        clock.set(100 * it * MS)
        run.bus.iteration_started(it)
        run.bus.samples(iteration=it, phase="rollout", lengths=[])
    clock.set(300 * MS)
    run.finish()
    assert run.out_dir is not None
    missing = _summary(run.out_dir)["missing_sample_tags"]
    assert missing == {
        "rollout": "counted by window, but every samples event with phase='rollout' had an "
        "empty lengths list: pass each sample's tokens"
    }
    assert "no rollout samples  counted by window, but every" in format_report(
        load_report(run.out_dir)
    )


def test_more_names_than_kept_recompute_from_the_log(tmp_path: Path) -> None:
    """40 names in no phase over three iterations, in idle and inside phases, some
    overlapping: the summary's ``spans.no_phase`` (the first 32 names, the later ones
    together) and ``unnamed_seconds`` are what the independent recompute makes of the
    log, and replay gives the same bytes."""
    run, clock = manual_session(tmp_path, "many", STREAMING)
    for it in range(3):
        at = 100 * it
        spans = [_s("generate", at, at + 30, iteration=it), _s("train.step", at + 30, at + 60)]
        for k in range(40):  # names 0-39, each a 1-3 ms span somewhere in [at, at + 95)
            start = at + (7 * k + 3 * it) % 90
            spans.append(_s(f"timer{(k + 13 * it) % 40}", start, start + 1 + k % 3))
        _iteration(run, clock, it, spans, sent_ms=at + 96)
        run.bus.samples(iteration=it, phase="rollout", lengths=[10, 20])
    clock.set(300 * MS)
    run.finish()
    assert run.out_dir is not None
    no_phase = _summary(run.out_dir)["spans"]["no_phase"]
    assert len(no_phase["names"]) == 32 and no_phase["other"]["spans"] > 0
    assert no_phase["spans"] == 120
    check_run(run.out_dir)
    check_replay(run.out_dir, tmp_path / "again")


def test_a_summary_without_idle_seconds_names_no_name_as_the_idles() -> None:
    """A summary from before each name's idle seconds ranks by summed seconds, which
    count time inside phases too: its names are listed as summed, and the limits
    block does not call a nested timer the one that ran in most of the idle."""
    old: dict[str, Any] = {
        "spans": 5,
        "seconds": 0.096,
        "names": {
            "fwd": {"spans": 2, "seconds": 0.076},  # nested in a phase's span: no idle
            "log": {"spans": 1, "seconds": 0.01},
            "save": {"spans": 1, "seconds": 0.01},
            "step": {"spans": 1, "seconds": 0.0},
        },
        "other": {"spans": 0, "seconds": 0.0},
    }
    seconds = {"unnamed": 0.015, "idle": 0.05}
    report = {"seconds": seconds, "no_phase": old}
    assert unnamed_work_line(report) == [
        "  unnamed work      0.015 s of the run's idle ran spans no phase names: that idle "
        "may be work"
    ]
    assert no_phase_lines(seconds, old)[1] == (
        "  by name (summed)  fwd 0.076 s (2 spans), log 0.010 s (1 span), save 0.010 s (1 span)"
    )
    old["names"]["step"]["seconds"] = 0.001
    assert no_phase_lines(seconds, old)[1].endswith(", 1 more name")
