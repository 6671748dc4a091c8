"""``twinkle report``: every figure it shows is the run's own record, two runs compare
figure by figure, and what is not a finished run is refused with the fix."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from _recompute import read_events
from observers.test_scripted_run import CONFIG, manual_session
from reliability._scripted import segment
from twinkle.cli import EXIT_USAGE, main
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.hookspecs import hookimpl
from twinkle.report import (
    PLOTS,
    compare,
    format_compare,
    format_report,
    load_report,
    phases_differ,
    streaming_effect,
    time_parts,
    write_plots,
)
from twinkle.report._format import num
from twinkle.report._limits_text import _stragglers
from twinkle.report._text import memory_lines, throughput_lines

CFG = DemoConfig(iterations=3, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("report")
    run_demo(CFG, out_dir=out, run_id="a", autoload=False)
    run_demo(dataclasses.replace(CFG, iterations=4), out_dir=out, run_id="b", autoload=False)
    return out / "a", out / "b"


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics_raw.jsonl").read_text().splitlines()]


def test_every_figure_is_the_runs_own_record(runs: tuple[Path, Path]) -> None:
    run = runs[0]
    report = load_report(run)
    records = _records(run)
    summary = json.loads((run / "summary.json").read_text())
    rows = {r["iteration"]: r for r in report["iterations"]}
    assert sorted(rows) == [0, 1, 2]
    for rec in records:
        if rec["scope"] != "iteration":
            continue
        row, values = rows[rec["iteration"]], rec["values"]
        if rec["kind"] == "iteration":
            assert row["tokens"] == values["tokens"]
            assert row["tokens_per_s_per_device"] == values["tokens_per_s_per_device"]
        elif rec["kind"] == "timing":
            assert row["window_wall_seconds"] == values["window_wall_seconds"]
            assert row["window_idle_seconds"] == values["window_idle_seconds"]
            for phase in ("rollout", "train", "publish"):
                assert row["window_phase_seconds"][phase] == values[f"window_{phase}_seconds"]
                assert (
                    row["attributed_phase_seconds"][phase] == values[f"attributed_{phase}_seconds"]
                )
            assert (
                row["window_overlap_generation_training_seconds"]
                == values["window_overlap_rollout_train_seconds"]
            )
        elif rec["kind"] == "grpo":
            assert row["reward"] == values["reward_mean"]
    assert report["reward"] == "grpo.reward_mean"
    assert report["window"] == summary["window"]
    assert report["seconds"]["idle"] == summary["seconds"]["idle_seconds"]
    assert report["seconds"]["phases"]["train"] == summary["seconds"]["train_seconds"]
    peaks: dict[str, int] = {}
    for event in read_events(run):
        if event["type"] == "memory":
            for r in event["readings"]:
                peaks[r["worker_id"]] = max(peaks.get(r["worker_id"], 0), r["host_peak_rss_bytes"])
    assert {w: p["host_peak_rss_bytes"] for w, p in report["memory_peak_bytes"].items()} == peaks


def test_the_text_shows_the_table_and_the_runs_figures(runs: tuple[Path, Path]) -> None:
    report = load_report(runs[0])
    text = format_report(report)
    lines = text.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("iter"))
    assert header.split()[:5] == ["iter", "flag", "limit", "tokens", "tok/s/dev"]
    assert "reward" in header
    assert "rollout tok/s/dev" in header and "train tok/s/dev" in header
    first, middle, last = report["iterations"]
    rows = {line.split()[0]: line.split() for line in lines if line[:4].strip().isdigit()}
    limits = {"train", "gen", "publish", "mixed", "-"}
    assert rows["0"][1] == "warm-up" and rows["0"][2] in limits
    assert rows["0"][3] == f"{first['tokens']:,}"
    assert rows["1"][1] in limits and rows["1"][2] == f"{middle['tokens']:,}"  # no flag
    assert rows["2"][1] == "drain" and rows["2"][3] == f"{last['tokens']:,}"
    # the steady state leads (iteration 1 alone), the whole loop follows
    steady = report["window"]["steady_tokens_per_s_per_device"]
    assert steady == middle["tokens_per_s_per_device"]
    assert text.index(f"steady state        {num(steady)} tokens/s/device over 1 of 3") < (
        text.index("whole loop          ")
    )
    rollout = report["phase_windows"]["rollout"]["steady_tokens_per_s_per_device"]
    assert f"rollout {num(rollout)}, train " in text
    tps = report["window"]["tokens_per_s_per_device"]
    assert f"whole loop          {num(tps)} tokens/s/device over all 3 iterations" in text
    assert "reward (grpo.reward_mean)" in text and "peak memory" in text
    assert "columns (docs/metrics.md, 'Report columns'):" in text  # the legend


def test_two_runs_compare_figure_by_figure(runs: tuple[Path, Path]) -> None:
    a, b = (load_report(r) for r in runs)
    rows = {r["figure"]: r for r in compare(a, b)}
    assert (
        rows["tokens"]["a"] == a["window"]["tokens"]
        and rows["tokens"]["b"] == b["window"]["tokens"]
    )
    assert rows["tokens"]["ratio"] == b["window"]["tokens"] / a["window"]["tokens"]
    assert rows["train_seconds"]["ratio"] == pytest.approx(
        b["seconds"]["phases"]["train"] / a["seconds"]["phases"]["train"]
    )
    assert all(r["ratio"] == 1.0 for r in compare(a, a) if r["a"])
    text = format_compare(a, b)
    assert text.splitlines()[3].split() == ["figure", "A", "B", "B", "/", "A"]
    # each run's shape, which the ratios depend on, heads the table
    for tag, report, line in zip("AB", (a, b), text.splitlines()[:2], strict=True):
        n, steady = len(report["iterations"]), report["window"]["steady_iterations"]
        assert line == (
            f"{tag}: run {report['run_id']} (ok, {n} iterations, {steady} steady): "
            f"{report['run_dir']}"
        )


def test_two_runs_that_define_a_phase_by_other_names_are_told_so(
    runs: tuple[Path, Path],
) -> None:
    """B times its rollout phase by other spans, and has a phase A lacks: the two
    phases are named under the table, with both runs' span names; the others not."""
    a = load_report(runs[0])
    b = dict(load_report(runs[1]))
    b["phase_patterns"] = {
        **a["phase_patterns"],
        "rollout": ["gen.*", "sample"],
        "judge": ["judge"],
    }
    assert phases_differ(a, b) == {
        "rollout": {"a": a["phase_patterns"]["rollout"], "b": ["gen.*", "sample"]},
        "judge": {"a": None, "b": ["judge"]},
    }
    assert phases_differ(a, a) == {}
    rollout = ", ".join(a["phase_patterns"]["rollout"])
    assert format_compare(a, b).splitlines()[-1] == (
        "phases defined differently, so their figures time other spans: rollout (A: "
        f"{rollout}, B: gen.*, sample); judge (A: no such phase, B: judge)"
    )
    assert "phases defined differently" not in format_compare(a, a)


def test_report_json_is_strict_json_whatever_the_figures(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two summaries with extreme (finite, valid) wall seconds: B / A is past a float's
    range. ``report --json A B`` printed ``"ratio": Infinity``, which JSON readers
    refuse; the ratio is null (no ratio), and the output strict JSON."""
    copies = []
    for name, wall in (("a", 1e-300), ("b", 1e300)):
        copy_ = tmp_path / name
        copy_.mkdir()
        for file in ("events.jsonl", "summary.json", "metrics_raw.jsonl"):
            (copy_ / file).write_bytes((runs[0] / file).read_bytes())
        summary = json.loads((copy_ / "summary.json").read_text())
        summary["seconds"]["wall_seconds"] = wall
        (copy_ / "summary.json").write_text(json.dumps(summary))
        copies.append(str(copy_))
    assert main(["report", "--json", *copies]) == 0

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    out = json.loads(capsys.readouterr().out, parse_constant=refuse)
    [wall] = [r for r in out["compare"] if r["figure"] == "wall_seconds"]
    assert (wall["a"], wall["b"], wall["ratio"]) == (1e-300, 1e300, None)
    # a run directory whose name is not UTF-8 (a Latin-1 name, decoded as surrogates)
    odd = tmp_path / os.fsdecode(b"caf\xe9")
    (tmp_path / "a").rename(odd)
    assert main(["report", "--json", str(odd)]) == 0
    text = capsys.readouterr().out
    assert text.isascii() and json.loads(text)["run_dir"] == str(odd)


def test_concurrency_is_never_called_a_saving_and_a_saving_only_where_measured(
    runs: tuple[Path, Path],
) -> None:
    overlapped = load_report(runs[0])
    assert "concurrency, not a saving" in format_report(overlapped)
    assert streaming_effect(overlapped, overlapped) is None  # both overlap: not measured
    # A run of the same work without overlap (A: share 0, 1,000 tok/s/dev) and one with
    # it (B: 1,250): streaming gave 1,250 / 1,000 = 1.25x, measured.
    a, b = copy.deepcopy(overlapped), copy.deepcopy(overlapped)
    a["seconds"]["generation_hidden_share"] = 0.0
    a["window"]["steady_tokens_per_s_per_device"] = 1000.0
    b["window"]["steady_tokens_per_s_per_device"] = 1250.0
    assert streaming_effect(a, b) == {
        "overlapped": "b",
        "figure": "steady state",
        "tokens_per_s_per_device_with_overlap": 1250.0,
        "tokens_per_s_per_device_without": 1000.0,
        "throughput_ratio": 1.25,
    }
    assert streaming_effect(b, a)["overlapped"] == "a"  # type: ignore[index]
    assert (
        "streaming, measured: B overlapped generation with training, A did not; B's "
        "steady state throughput is 1.250x A's" in format_compare(a, b)
    )
    assert "streaming, measured" not in format_compare(b, b)


def test_the_command_prints_text_or_json(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(runs[0])]) == 0
    assert "steady state" in capsys.readouterr().out
    assert main(["report", str(runs[0]), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert printed["window"] == summary["window"] and printed["run_id"] == "a"
    assert [r["iteration"] for r in printed["iterations"]] == [0, 1, 2]
    assert main(["report", str(runs[0]), str(runs[1]), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert set(both) == {"a", "b", "compare", "streaming_effect", "phases_differ"}
    assert both["streaming_effect"] is None  # both runs overlap: neither measures it
    assert both["phases_differ"] == {}  # (one demo's phases both)


def test_a_run_with_its_log_alone_is_reported_from_it_and_what_is_no_run_is_refused(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidArgumentError, match="is not a run directory"):
        load_report(tmp_path / "nowhere")
    alone = tmp_path / "alone"  # the log of a finished run, without its other files
    alone.mkdir()
    (alone / "events.jsonl").write_bytes((runs[0] / "events.jsonl").read_bytes())
    from_log, own = load_report(alone), load_report(runs[0])
    assert from_log["live"] == {
        "state": "finished", "writer": None, "pid": None, "host": None, "alive": None,
        "events": len((alone / "events.jsonl").read_bytes().splitlines()),
        "whole_log_why": "the run has no checkpoint",
        "files_missing": ["summary.json", "metrics_raw.jsonl"],
    }  # fmt: skip
    assert {**from_log, "run_dir": "", "live": None} == {**own, "run_dir": ""}
    (alone / "events.jsonl").unlink()
    with pytest.raises(InvalidArgumentError, match=r"has no summary\.json, metrics_raw\.jsonl"):
        load_report(alone)
    os.mkfifo(alone / "events.jsonl")  # (it said the log was missing)
    with pytest.raises(InvalidArgumentError, match=r"events\.jsonl' is not a regular file"):
        load_report(alone)
    with pytest.raises(InvalidArgumentError, match=r"--reward 'grpo\.nope' names no scalar"):
        load_report(runs[0], reward="grpo.nope")
    assert main(["report", str(tmp_path / "nowhere")]) == EXIT_USAGE
    assert "is not a run directory" in capsys.readouterr().err


def test_a_finished_runs_records_that_are_not_its_summarys_are_refused_with_the_fix(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run a (3 iterations: 3 timing records) with its records cut after the second
    iteration's timing record, at a line's end, or with a torn last line: the summary
    counts 3, the records hold 2, or a line is not a record. Either is refused naming
    the file and the replay that rebuilds it, never reported beside a summary it
    contradicts (nor with a reader's option a command line has not)."""
    cut, torn = tmp_path / "cut", tmp_path / "torn"
    for copy_ in (cut, torn):
        copy_.mkdir()
        for name in ("events.jsonl", "summary.json", "metrics_raw.jsonl"):
            (copy_ / name).write_bytes((runs[0] / name).read_bytes())
    lines = (runs[0] / "metrics_raw.jsonl").read_bytes().splitlines(keepends=True)
    timing = [i for i, x in enumerate(lines) if b'"kind":"timing","scope":"iteration"' in x]
    assert len(timing) == 3
    (cut / "metrics_raw.jsonl").write_bytes(b"".join(lines[: timing[1] + 1]))
    with pytest.raises(InvalidArgumentError) as caught:
        load_report(cut)
    assert "holds the records of 2 iteration(s), but summary.json beside it counts 3" in str(
        caught.value
    )
    assert f"twinkle replay {cut}/events.jsonl --out DIR" in str(caught.value)
    (torn / "metrics_raw.jsonl").write_bytes(b"".join(lines)[:-10])
    assert main(["report", str(torn)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"line {len(lines)}: invalid JSON" in err and "twinkle replay" in err
    assert "on_error" not in err
    # a line that is JSON but no record (it failed the report with KeyError 'scope')
    (torn / "metrics_raw.jsonl").write_bytes(b"".join(lines[:2]) + b'{"kind": "timing"}\n')
    with pytest.raises(InvalidArgumentError) as caught:
        load_report(torn)
    assert "metrics_raw.jsonl', its record 3: not a record" in str(caught.value)
    assert f"twinkle replay {torn}/events.jsonl --out DIR" in str(caught.value)
    (cut / "events.jsonl").write_bytes(b"")  # (emptied after the run wrote its summary)
    with pytest.raises(InvalidArgumentError, match="holds no event, yet the run wrote its sum"):
        load_report(cut)
    (cut / "summary.json").unlink()  # (a run just starting)
    with pytest.raises(InvalidArgumentError, match="holds no event yet"):
        load_report(cut)
    (cut / "events.jsonl").unlink()  # (a run whose events observer was blocked)
    (cut / "summary.json").write_bytes((torn / "summary.json").read_bytes())
    with pytest.raises(InvalidArgumentError, match=r"has no events\.jsonl, which a report reads"):
        load_report(cut)


def test_a_log_changed_after_the_run_is_said_beside_the_runs_own_figures(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """Run a's log with one of its optimizer steps written twice (after it finished):
    its summary and records are the run's own, which the log no longer gives again (a
    replay refuses it). The report says so, against the checkpoint's mark of the log."""
    assert load_report(runs[0])["log_changed"] is None
    copy_ = tmp_path / "a"
    shutil.copytree(runs[0], copy_)
    lines = (copy_ / "events.jsonl").read_bytes().splitlines(keepends=True)
    step = next(i for i, x in enumerate(lines) if b'"type":"optimizer_step"' in x)
    (copy_ / "events.jsonl").write_bytes(b"".join([*lines[: step + 1], *lines[step:]]))
    report = load_report(copy_)
    assert report["log_changed"] == (
        "events.jsonl no longer begins with the bytes the checkpoint covers"
    )
    assert report["iterations"] == load_report(runs[0])["iterations"]
    assert (
        "event log           changed since the run wrote it (events.jsonl no longer begins "
        "with the bytes the checkpoint covers): these figures are the run's own"
    ) in format_report(report)


def test_a_run_being_written_whose_log_the_run_refuses_is_named_by_its_line(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """Run a's log without its end (a run stopped, read from its log) and an iteration
    started back in time: the refusal names the line, as replay's does."""
    copy_ = tmp_path / "a"
    shutil.copytree(runs[0], copy_)
    (copy_ / "summary.json").unlink()
    log = copy_ / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)[:-1]
    at = [i for i, x in enumerate(lines) if b'"type":"iteration_started"' in x][2]
    lines[at] = re.sub(rb'"monotonic_ns":[0-9]+', b'"monotonic_ns":5', lines[at], count=1)
    log.write_bytes(b"".join(lines))
    with pytest.raises(TwinkleError, match=rf"events\.jsonl:{at + 1}: event iteration_started"):
        load_report(copy_)


def test_a_replay_of_a_log_changed_after_the_run_says_its_figures_are_the_logs(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A samples line of run a edited after it finished (a line the replay accepts):
    the replay's figures are the edited log's, and it says the log is not the run's."""
    copy_ = tmp_path / "a"
    shutil.copytree(runs[0], copy_)
    log = copy_ / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    at = next(i for i, x in enumerate(lines) if b'"type":"samples"' in x)
    lines[at] = re.sub(rb'"lengths":\[[0-9]+', b'"lengths":[999999', lines[at], count=1)
    log.write_bytes(b"".join(lines))
    assert main(["replay", str(log), "--out", str(tmp_path / "again")]) == 0
    assert (
        f"twinkle: warning: {log} changed since the run wrote it (events.jsonl no longer "
        "begins with the bytes the checkpoint covers): these figures are the log's as it "
        "is now, not the run's own (its summary.json)"
    ) in capsys.readouterr().err
    assert main(["replay", str(runs[0]), "--out", str(tmp_path / "own")]) == 0
    assert "changed since" not in capsys.readouterr().err


def test_a_throughput_tag_whose_samples_never_came_is_named_with_its_fix(
    tmp_path: Path,
) -> None:
    """The configuration counts ``train`` samples the loop never publishes (the
    README's trainer without its train samples): the throughput reads 0 and the
    report says why, with the call that fixes it."""
    config = {
        "phases": {"rollout": ["generate"], "train": ["train.*"]},
        "throughput": {"rollout": {"samples": "rollout", "devices": 1},
                       "train": {"samples": "train", "devices": 1}},
    }  # fmt: skip
    run, clock = manual_session(tmp_path, "untagged", config)
    for it in range(4):
        clock.set(it * 10**9)
        run.bus.iteration_started(it)
        run.bus.samples(iteration=it, phase="rollout", lengths=[8, 9])
    clock.set(4 * 10**9)
    run.finish()
    report = load_report(tmp_path / "untagged")
    assert list(report["missing_sample_tags"]) == ["train"]
    text = format_report(report)
    assert (
        "no train samples    counted by throughput.train but no samples event had "
        "phase='train'; publish bus.samples(phase='train', ...)"
    ) in text
    # A run still being written warns once an iteration was done, not before (watch's
    # first views warned of a run that had not reached its first samples yet).
    live = {**report, "live": {"writer": "running"}}
    assert "no train samples" in "\n".join(throughput_lines(live))
    assert "no train samples" not in "\n".join(throughput_lines({**live, "iterations": []}))


def test_plots_are_valid_non_trivial_pngs(runs: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import struct

    from matplotlib.image import imread

    written = write_plots(load_report(runs[0]), tmp_path / "plots")
    assert [p.name for p in written] == list(PLOTS)
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path.name
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (1000, 450), path.name
        pixels = (imread(path)[..., :3] * 255).round().astype(int)
        colours = {tuple(p) for p in pixels.reshape(-1, 3)}
        # the data are drawn in matplotlib's colour cycle: C0 (#1f77b4) at least
        assert (31, 119, 180) in colours, f"{path.name} shows no data"
    time_png = (imread(tmp_path / "plots" / "time.png")[..., :3] * 255).round().astype(int)
    shown = {tuple(p) for p in time_png.reshape(-1, 3)}
    for colour in [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189)]:
        assert colour in shown  # rollout alone, train alone, both, idle


def test_plots_of_two_runs_overlay_b_on_a(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from twinkle.report._plots import figures

    a, b = (load_report(r) for r in runs)
    drawn = figures(a, other=b, figure=Figure)
    assert list(drawn) == list(PLOTS)
    ax = drawn["throughput.png"].axes[0]
    assert ax.get_title() == "run a (A) vs run b (B): throughput"
    lines = {line.get_label(): line for line in ax.get_lines()}
    for tag, report in (("A", a), ("B", b)):
        line = lines[f"{tag}: iteration (its window)"]
        rows = report["iterations"]
        assert list(line.get_xdata()) == [r["iteration"] for r in rows]
        assert list(line.get_ydata()) == [r["tokens_per_s_per_device"] for r in rows]
        assert line.get_linestyle() == ("-" if tag == "A" else "--")
    bars = drawn["time.png"].axes[0].patches
    assert {p.get_hatch() for p in bars} == {None, "//"}  # B's bars hatched beside A's
    workers = [t.get_text() for t in drawn["memory.png"].axes[0].get_xticklabels()]
    assert workers == [f"A: {w}" for w in a["memory_peak_bytes"]] + [
        f"B: {w}" for w in b["memory_peak_bytes"]
    ]
    # The command draws both: the two runs' files differ from A's alone.
    assert main(["report", str(runs[0]), str(runs[1]), "--plots", str(tmp_path / "ab")]) == 0
    assert main(["report", str(runs[0]), "--plots", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    for name in PLOTS:
        assert (tmp_path / "ab" / name).read_bytes() != (tmp_path / "a" / name).read_bytes()


def test_each_windows_parts_add_up_to_its_wall_clock(runs: tuple[Path, Path]) -> None:
    report = load_report(runs[0])
    assert report["streaming"] == ["rollout", "train"]
    for row in report["iterations"]:
        parts = time_parts(row, ("rollout", "train"))
        assert all(v >= 0 for v in parts.values()), parts
        assert sum(parts.values()) == pytest.approx(row["window_wall_seconds"], abs=1e-9)


def test_the_overlap_is_found_whatever_the_order_of_the_phases(
    tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    """A run whose config names training first: the timing records spell the pair
    train_rollout; the report still finds it."""
    from twinkle.run import RunSession

    config = {
        "phases": {"train": ["train.*"], "rollout": ["generate"]},
        "streaming": {"generation": "rollout", "training": "train"},
    }
    with RunSession(out_dir=tmp_path, run_id="r", config=config, autoload=False) as run:
        for it in range(2):
            run.bus.iteration_started(it)
            with run.recorder.span("generate", iteration=it):
                with run.recorder.span("train.step", iteration=it):
                    pass
            run.bus.scalars(iteration=it, name="grpo", values={"reward_mean": 0.5})
    report = load_report(tmp_path / "r")
    assert report["streaming"] == ["rollout", "train"]
    for row in report["iterations"]:
        assert row["window_overlap_generation_training_seconds"] is not None
        assert time_parts(row, ("rollout", "train"))["rollout and train at once"] >= 0
    assert "rollout&train s" in format_report(report)
    assert write_plots(report, tmp_path / "plots")  # rows with and without every figure


def test_runs_compare_on_the_highest_peak_and_their_named_reward(
    runs: tuple[Path, Path],
) -> None:
    a, b = (load_report(r) for r in runs)
    rows = {r["figure"]: r for r in compare(a, b)}
    peak = max(p["host_peak_rss_bytes"] for p in a["memory_peak_bytes"].values())
    assert rows["host_peak_rss_bytes_max_over_workers"]["a"] == peak
    assert rows["grpo.reward_mean_last"]["ratio"] is not None


def test_without_a_steady_state_on_either_side_streaming_compares_the_whole_loops(
    runs: tuple[Path, Path],
) -> None:
    a, b = copy.deepcopy(load_report(runs[0])), copy.deepcopy(load_report(runs[0]))
    a["seconds"]["generation_hidden_share"] = 0.0
    a["window"]["steady_tokens_per_s_per_device"] = None  # (too few iterations)
    a["window"]["tokens_per_s_per_device"], b["window"]["tokens_per_s_per_device"] = 800.0, 1000.0
    effect = streaming_effect(a, b)
    assert effect is not None
    assert (effect["figure"], effect["throughput_ratio"]) == ("whole loop", 1.25)


def test_every_printed_partition_adds_up_to_its_printed_total(runs: tuple[Path, Path]) -> None:
    """On a real demo run: wall, busy, idle and twinkle's own seconds are each set-up +
    loop + tear-down, in summary.json (to the float) and as printed (to the digit)."""
    run = runs[1]
    seconds = json.loads((run / "summary.json").read_text())["seconds"]
    for total in ("wall", "busy", "idle", "overhead"):
        parts = [seconds[f"{p}_{total}_seconds"] for p in ("setup", "loop", "teardown")]
        assert sum(parts) == pytest.approx(seconds[f"{total}_seconds"], abs=1e-9), total
    assert seconds["busy_seconds"] + seconds["idle_seconds"] == pytest.approx(
        seconds["wall_seconds"], abs=1e-9
    )
    text = format_report(load_report(run))
    shown = [line for line in text.splitlines() if " s = set-up " in line]
    assert len(shown) == 4

    def value(x: str) -> int:  # (milliseconds, exact)
        return round(float(x) * 1000)

    for line in shown:
        total, rest = line.split(" s = set-up ")
        parts = [rest.split(" + loop ")[0], *rest.split(" + loop ")[1].split(" + tear-down ")]
        assert sum(map(value, parts)) == value(total.split()[-1]), line


@pytest.mark.parametrize(
    ("total", "parts", "shown"),
    [
        # 0.0004 + 0.0004 + 0.0004 = 0.0012: floors 0 + 0 + 0, one millisecond left over
        (0.0012, [0.0004, 0.0004, 0.0004], ["0.001", "0.001", "0.000", "0.000"]),
        # 1.2345 + 2.3456 + 0.42 = 4.0001: each rounded alone, 1.235 + 2.346 + 0.420 = 4.001
        (4.0001, [1.2345, 2.3456, 0.42], ["4.000", "1.234", "2.346", "0.420"]),
        (9.702, [1.288, 8.414, 0.0], ["9.702", "1.288", "8.414", "0.000"]),
    ],
)
def test_parts_are_shown_so_they_add_up(total: float, parts: list[float], shown: list[str]) -> None:
    from twinkle.report._text import split_exactly

    assert split_exactly(total, parts) == shown


class _Claims:
    """A plugin whose summary part takes built-in keys' names (and a scalar named
    ``iterations`` that is no count)."""

    @hookimpl
    def twinkle_summary(self) -> dict[str, Any]:
        return {"iterations": "n/a", "window": {"tokens": -1}}


@pytest.mark.parametrize("blocked", [(), ("timing",)])
def test_a_plugins_summary_keys_never_take_twinkles_own(
    tmp_path: Path, blocked: tuple[str, ...]
) -> None:
    """The built-in observers' parts are merged first: their ``iterations`` and
    ``window`` are the summary's, the plugin's are kept as ``claims.<key>``, and the
    report reads the run's figures (with timing blocked, no count is checked)."""
    segment(tmp_path, iterations=3, wall_offset_ns=0, blocked=blocked,
            plugins=(("claims", _Claims()),))  # fmt: skip
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["claims.window"] == {"tokens": -1}
    assert summary["window"]["tokens"] >= 0
    if blocked:  # (no built-in part has it: the plugin's own)
        assert summary["iterations"] == "n/a"
    else:
        assert (summary["iterations"], summary["claims.iterations"]) == (3, "n/a")
    report = load_report(tmp_path / "r")
    assert len(report["iterations"]) == 3  # (rows from the throughput records too)


def test_the_text_names_the_workers_with_the_highest_peaks_of_many() -> None:
    """Ten workers, w0..w9, w<k> peaking at k MiB (host) and w3 at 50 MiB (device): the
    eight highest by their highest peak (w3, then w9 down to w3's rank), one label for
    the block, and how many the JSON holds; three workers are named in their order."""
    mib = 2**20
    peaks = {f"w{k}": {"host_peak_rss_bytes": k * mib} for k in range(10)}
    peaks["w3"]["device_allocated_peak_bytes"] = 50 * mib
    lines = memory_lines({"memory_peak_bytes": peaks})
    assert [line[20:].split(":")[0] for line in lines[:-1]] == [
        "w3", "w9", "w8", "w7", "w6", "w5", "w4", "w2",
    ]  # fmt: skip
    assert lines[0].startswith("peak memory         w3: host_peak_rss 3 MiB")
    assert all(line.startswith(" " * 20) for line in lines[1:])
    assert lines[-1].strip() == (
        "(the 8 highest of 10 workers; every one: report --json, memory_peak_bytes)"
    )
    few = memory_lines({"memory_peak_bytes": {w: peaks[w] for w in ("w2", "w0", "w1")}})
    assert [line[20:].split(":")[0] for line in few] == ["w2", "w0", "w1"]


def test_a_line_of_stragglers_names_eight_workers_at_most() -> None:
    """Of three workers none slow: named; of ten: counted. Ten slow: the first eight
    named, then how many more the JSON holds."""
    ok = {"verdict": "ok"}
    slow = {"verdict": "chronic", "median_ratio_to_peers": 2.0, "slow_iterations": 5,
            "compared_iterations": 6}  # fmt: skip
    few = {"unit": "token", "workers": {f"e{k}": ok for k in range(3)}}
    assert _stragglers("generation", few) == "generation: none of e0, e1, e2"
    many = {"unit": "token", "workers": {f"e{k}": ok for k in range(10)}}
    assert _stragglers("generation", many) == "generation: none of its 10 workers"
    all_slow = {"unit": "token", "workers": {f"e{k}": slow for k in range(10)}}
    line = _stragglers("generation", all_slow)
    assert line.count("chronic (slow in 5 of 6 iterations, typically 2.0x its peers'") == 8
    assert line.startswith("generation: e0 chronic") and "e7 chronic" in line
    assert "e8" not in line and line.endswith(", and 2 more (report --json)")


def test_the_chronic_stragglers_come_first_and_a_one_off_says_only() -> None:
    one_off = {"verdict": "one-off", "median_ratio_to_peers": 1.0, "slow_iterations": 1,
               "compared_iterations": 14}  # fmt: skip
    chronic = {"verdict": "chronic", "median_ratio_to_peers": 7.7, "slow_iterations": 14,
               "compared_iterations": 14}  # fmt: skip
    found = {"unit": "token", "workers": {"e0": one_off, "e1": chronic}}
    assert _stragglers("generation", found) == (
        "generation: e1 chronic (slow in 14 of 14 iterations, typically 7.7x its peers' "
        "seconds per token), e0 one-off (slow in 1 of 14 iterations only, typically 1.0x "
        "its peers' seconds per token)"
    )
    # slow in every iteration compared, but in 2: a one-off, as too few were compared
    few = {**one_off, "slow_iterations": 2, "compared_iterations": 2}
    assert _stragglers("generation", {"unit": "span", "workers": {"rank1": few}}) == (
        "generation: rank1 one-off (slow in 2 of 2 iterations, too few compared to call it "
        "chronic, typically 1.0x its peers' seconds per span)"
    )


def test_a_side_not_compared_says_why_per_iteration_count() -> None:
    one = {"unit": "token", "workers": {}, "abstained": {"fewer than two workers": 1}}
    assert _stragglers("training", one) == (
        "training: not compared (1 iteration: fewer than two workers)"
    )
    two = {"unit": "token", "workers": {}, "abstained": {"fewer than two workers": 2, "x": 3}}
    assert _stragglers("training", two) == (
        "training: not compared (2 iterations: fewer than two workers, 3 iterations: x)"
    )
    assert _stragglers("training", {"workers": {}}) == (
        "training: not compared (no span of its phase names an iteration)"
    )


#: how a run stopped by SIGTERM ends (twinkle.run.finish_on_signals)
SIGTERM_ERROR = "SignalInterrupt: SIGTERM (signal 15): the process was asked to stop"


def ended_in_error(out_dir: Path, run_id: str = "failed") -> Path:
    """A run of three iterations that ended in error (:data:`SIGTERM_ERROR`)."""
    run, clock = manual_session(out_dir, run_id, CONFIG)
    for it in range(3):
        clock.set(it * 10**8)
        run.bus.iteration_started(it)
    clock.set(3 * 10**8)
    run.finish(status="error", error=SIGTERM_ERROR)
    return out_dir / run_id


def test_a_run_that_ended_in_error_shows_its_error_under_its_line(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    report = load_report(ended_in_error(tmp_path))
    assert report["status"] == "error" and report["error"] == SIGTERM_ERROR
    lines = format_report(report).splitlines()
    assert lines[0].startswith("run failed (error): ")
    assert lines[1] == f"error               {SIGTERM_ERROR}"
    ok = load_report(runs[0])  # (a run that ended well: no such line)
    assert ok["error"] is None and "\nerror " not in format_report(ok)


def test_a_ray_workers_error_is_one_line_without_its_colours_ending_in_its_cause() -> None:
    from twinkle.report._format import error_line

    ray = (
        "RayTaskError(OutOfMemoryError): \x1b[36mray::_boom()\x1b[39m (pid=42, ip=1.2.3.4)\n"
        '  File "/w/job.py", line 349, in _boom\n    raise torch.OutOfMemoryError(...)\n\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    assert error_line(ray) == (
        "RayTaskError(OutOfMemoryError): ray::_boom() (pid=42, ip=1.2.3.4) ... "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
        "(its 4 lines: summary.json error)"
    )
    assert error_line(SIGTERM_ERROR) == SIGTERM_ERROR  # (one line: as it is)
    # carriage returns end lines (a captured Windows or progress-bar output), not erase them
    assert error_line("RuntimeError: failed\r\n  File x\r\nValueError: y\r\n") == (
        "RuntimeError: failed ... ValueError: y (its 3 lines: summary.json error)"
    )
    assert error_line("\r\n") == ""


def test_a_partial_iteration_whose_samples_never_came_has_no_tokens_not_0(
    tmp_path: Path,
) -> None:
    """The run that ended in error published no samples: iterations 0 and 1 finished
    with 0 tokens; iteration 2 was cut short, so its tokens are not known (its record
    says 0: the report says -)."""
    report = load_report(ended_in_error(tmp_path))
    cut = report["iterations"][2]  # (--json and the plots: null, a gap, not a dip to 0)
    assert cut["tokens"] is None and cut["tokens_per_s_per_device"] is None
    assert report["iterations"][1]["tokens"] == 0
    text = format_report(report)
    rows = {c[0]: c for c in map(str.split, text.splitlines()) if c[:1] in (["1"], ["2"])}
    assert rows["1"][1:4] == ["-", "0", "0.000"]  # (no flag; limit, tokens, tok/s/dev)
    assert rows["2"][1:6] == ["partial", "-", "-", "-", "-"]
    # no span of either phase ran: said, not a 0 that reads as free
    assert "phase seconds       rollout none ran, train none ran (each phase's" in text
