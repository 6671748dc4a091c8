"""``twinkle whatif``: the command's outputs, its errors, and the simulator's own check
on a real run of the demo's simulated-device mode."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from _whatif_run import CONFIG, recorded_events
from twinkle.cli import main
from twinkle.demo import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.errors import InvalidArgumentError, ReplayError
from twinkle.run import replay
from twinkle.testing import scripted_run
from twinkle.whatif import Changes, predict
from twinkle.whatif._predict import not_predicted
from twinkle.whatif._recorded import read_recorded


def test_the_table_shows_both_runs_the_verdicts_and_the_assumptions(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["whatif", str(run), "--engines", "2"]) == 0
    out = capsys.readouterr().out
    assert "what if: engines 2, trainer ranks 1, lag 1" in out
    assert "steady_tokens_per_s_per_device" in out and "limited by: recorded" in out
    assert "critical path, predicted: " in out
    assert "the model replays the recorded configuration within 0.0%" in out
    assert "assumes:" in out and "each worker has its own device" in out


def test_json_and_the_plot_and_the_kept_prediction(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot, out_dir = tmp_path / "w.png", tmp_path / "predicted"
    args = ["whatif", str(run), "--no-overlap", "--speed", "train=2", "--json"]
    assert main([*args, "--plot", str(plot), "--out", str(out_dir)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changes"] == {"lag": 0, "speed": {"train": 2.0}}
    assert data["settings"]["lag"] == 0
    shares = data["critical_path_shares"]["predicted"]
    assert sum(shares.values()) == pytest.approx(1)
    assert data["reproduction"]["steady_tokens_per_s_per_device"] == pytest.approx(0, abs=1e-9)
    assert [r["iteration"] for r in data["iterations"]] == [0, 1, 2]
    assert all(r["recorded_seconds"] and r["predicted_seconds"] for r in data["iterations"])
    assert plot.stat().st_size > 0
    assert (out_dir / "events.jsonl").is_file() and (out_dir / "summary.json").is_file()
    assert data["predicted_run"] == str(out_dir)
    assert main(["report", str(run), str(out_dir)]) == 0  # a predicted run is a run
    capsys.readouterr()
    assert main(args) == 0  # without --out: its files are gone, so no path to them
    assert json.loads(capsys.readouterr().out)["predicted_run"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "train"], "--speed 'train': write PHASE=K or WORKER=K"),
        (
            ["--speed", "train=0"],
            r"--speed train=\.\.\.: the factor must be a number in \[0\.001, 1000\]",
        ),
        (
            ["--speed", "rollout=1e-10"],
            r"the factor must be a number in \[0\.001, 1000\] \(.*\), got 1e-10",
        ),
        (["--speed", "trian=2"], "'trian' is no phase or worker of the run; name one of rollout"),
        (["--engines", "0"], r"--engines must be an integer in \[1, 1024\], got 0"),
        (["--engines", "200000"], r"--engines must be an integer in \[1, 1024\], got 200000"),
        (["--buffer", "10000000"], r"--buffer must be an integer in \[1, 65536\]"),
        (["--lag", "9"], r"--lag must be an integer in \[0, 8\], got 9"),
        (["--no-overlap", "--lag", "2"], "--no-overlap is lag 0; drop --lag 2"),
    ],
)
def test_bad_changes_name_the_option(
    run: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: int | str | None
    try:
        code = main(["whatif", str(run), *args])
    except SystemExit as exc:  # (argparse's own refusal)
        code = exc.code
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_run_without_a_streaming_loop_is_refused_by_name(tmp_path: Path) -> None:
    log = scripted_run(tmp_path)
    with pytest.raises(ReplayError, match=r"has no config\.streaming"):
        predict(log.parent)


def test_changes_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"--ranks must be an integer in \[1, 1024\]"):
        Changes(ranks=0)
    with pytest.raises(InvalidArgumentError, match=r"--engines must be .*, got True"):
        Changes(engines=True)
    assert Changes().none and not Changes(speed={"train": 2}).none


def test_the_sim_demo_is_reproduced_within_five_percent(tmp_path: Path) -> None:
    """The simulator's own check on a real run: the recorded configuration replayed
    gives the run's steady-state throughput and loop time within 5 %."""
    cfg = DemoConfig(iterations=6, sim_device=True, engines=2)
    run_demo(cfg, out_dir=tmp_path, run_id="sim")
    p = predict(tmp_path / "sim", Changes(), tmp_path / "p")
    for name in ("steady_tokens_per_s_per_device", "loop_wall_seconds"):
        recorded, predicted = p.figure(name)
        assert predicted == pytest.approx(recorded, rel=0.05), name


def test_the_report_ends_with_what_would_help(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run), "--whatif", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["what_would_help"]
    assert [r["change"] for r in rows] == [
        "+1 engine",
        "+1 trainer rank",
        "2x faster generation",
        "2x faster training",
        "lag +1",
    ]
    by = {r["change"]: r for r in rows}
    assert by["+1 engine"]["settings"]["engines"] == 2 and by["+1 engine"]["speedup"] > 1
    assert by["lag +1"]["settings"]["lag"] == 2
    assert main(["report", str(run), "--whatif"]) == 0
    assert "what would help (predicted by twinkle whatif" in capsys.readouterr().out


def test_a_worker_added_on_a_shared_device_is_not_predicted(
    shared_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trainer and engine on one device: an added engine or rank would share it, where
    the model gives each its own compute. ``--whatif`` gives those rows no ratio, and
    says why; ``twinkle whatif`` names the worker; the other changes are predicted."""
    assert main(["report", str(shared_run), "--whatif", "--json"]) == 0
    rows = {r["change"]: r for r in json.loads(capsys.readouterr().out)["what_would_help"]}
    for change in ("+1 engine", "+1 trainer rank"):
        assert rows[change]["speedup"] is None and rows[change]["per_device"] is None
        (worker,) = rows[change]["settings"]["shared"]  # (the one added)
        assert rows[change]["not_predicted"].startswith(f"{worker} would share a device")
    assert rows["+1 trainer rank"]["settings"]["shared"] == ["rank1"]
    assert rows["2x faster training"]["speedup"] is not None  # (no worker added)
    assert rows["2x faster training"]["not_predicted"] is None
    assert main(["report", str(shared_run), "--whatif"]) == 0
    assert "-           -  (not predicted: rank1 would share a device" in capsys.readouterr().out
    assert main(["whatif", str(shared_run), "--ranks", "2"]) == 0
    assert "not a prediction: rank1 would share a device" in capsys.readouterr().out


def test_another_lag_or_fewer_workers_on_a_shared_device_is_not_predicted(
    shared_run: Path, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trainer and engine on one device: their recorded times hold what running at once
    cost them, so a change of how much runs at once (the lag, the buffer) is no
    prediction there; on devices of their own (``run``) it is one."""
    for argv in (["--no-overlap"], ["--lag", "2"], ["--buffer", "3"]):
        assert main(["whatif", str(shared_run), *argv, "--json"]) == 0
        settings = json.loads(capsys.readouterr().out)["settings"]
        assert settings["contended"] == ["host-cpu"], argv
        assert main(["whatif", str(run), *argv, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["settings"]["contended"] == [], argv
    assert main(["whatif", str(shared_run), "--speed", "train=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["contended"] == []
    assert main(["whatif", str(shared_run), "--no-overlap"]) == 0
    out = capsys.readouterr().out
    assert "not a prediction: the recorded workers shared host-cpu" in out
    assert "that error does not bound this change" in out
    assert main(["report", str(shared_run), "--whatif", "--json"]) == 0
    rows = {r["change"]: r for r in json.loads(capsys.readouterr().out)["what_would_help"]}
    assert rows["lag +1"]["speedup"] is None
    assert rows["lag +1"]["not_predicted"].startswith("the recorded workers shared host-cpu")


def test_fewer_ranks_on_a_shared_device_is_not_predicted_and_a_speed_has_a_caveat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two training workers and the engine on one device: one rank fewer leaves the
    other more of it (no prediction); a speed factor is predicted, with its caveat."""
    config = dict(CONFIG)
    worker = {"device_type": "cpu", "devices": ["host-cpu"]}
    config["placement"] = {
        "trainer": {**worker, "phases": ["train"]},
        "trainer2": {**worker, "phases": ["train"]},
        "e0": {**worker, "phases": ["rollout", "publish"]},
    }
    events = recorded_events()
    events[0] = msgspec.structs.replace(events[0], config=config)
    replay(events, tmp_path / "two", autoload=False)
    run = str(tmp_path / "two")
    assert main(["whatif", run, "--ranks", "1", "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["ranks"], settings["contended"]) == (1, ["host-cpu"])
    assert main(["whatif", run, "--ranks", "2", "--json"]) == 0  # (as recorded)
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["contended"], settings["speed_shared"]) == ([], [])
    assert main(["whatif", run, "--speed", "train=2"]) == 0
    out = capsys.readouterr().out
    assert "read with care: the recorded workers shared host-cpu: a --speed factor" in out
    assert "not a prediction" not in out and "that error does not bound this change" in out
    # one rank's speed: the model runs the ranks as one trainer
    assert main(["whatif", run, "--speed", "trainer2=2"]) == 2
    assert (
        "'trainer2' is one of the trainer's ranks (trainer, trainer2), which the model runs "
        "as one trainer, in step: one rank's speed is no change it can make; name 'trainer' "
        "(every rank) or the training phase 'train'" in capsys.readouterr().err
    )


def test_a_run_it_cannot_predict_keeps_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scripted_run(tmp_path)
    assert main(["report", str(log.parent), "--whatif"]) == 0
    out = capsys.readouterr().out
    assert "tok/s/dev" in out
    assert "what would help: not predicted:" in out and "config.streaming" in out


def test_out_must_be_new_or_empty_and_not_the_run(run: Path, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="exists and is not an empty directory"):
        predict(run, Changes(lag=0), tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(InvalidArgumentError, match="is the recorded run's own directory"):
        predict(run, Changes(lag=0), run)


def test_devices_that_cannot_be_counted_again_are_refused(bare_run: Path) -> None:
    """Without a placement naming the engine (or a trainer worker), another number of
    engines (ranks) would divide by the recorded devices: refused, by name."""
    with pytest.raises(InvalidArgumentError, match=r"does not name engine\(s\) e0"):
        predict(bare_run, Changes(engines=2))
    with pytest.raises(InvalidArgumentError, match="names no worker of the training phase"):
        predict(bare_run, Changes(ranks=2))
    assert predict(bare_run, Changes(lag=0)).settings["lag"] == 0


def test_whatif_takes_one_run(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run), str(run), "--whatif"]) == 2
    assert "--whatif predicts what would help one run" in capsys.readouterr().err


def test_the_plot_is_a_png_and_replaces_no_other_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot writes the .png it names, says where, and refuses any other path: one
    without .png (matplotlib wrote DIR.png beside a directory, and failed on .html), a
    link, or a file that is no PNG (a run's events.jsonl)."""
    plot = tmp_path / "w.png"
    assert main(["whatif", str(run), "--plot", str(plot)]) == 0
    assert capsys.readouterr().err == f"wrote {plot}\n"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["whatif", str(run), "--plot", str(plot)]) == 0  # (an earlier plot: replaced)
    notes = tmp_path / "notes.png"
    notes.write_text("not a plot")
    for bad, why in [
        (tmp_path / "w.html", "give the path of a .png file to write"),
        (run / "events.jsonl", "give the path of a .png file to write"),
        (notes, "holds something other than what --plot writes"),
    ]:
        before = bad.read_bytes() if bad.exists() else None
        assert main(["whatif", str(run), "--plot", str(bad)]) == 2
        assert why in capsys.readouterr().err
        assert (bad.read_bytes() if bad.exists() else None) == before
    link = tmp_path / "link.png"
    link.symlink_to(plot)
    assert main(["whatif", str(run), "--plot", str(link)]) == 2
    assert "is a symbolic link, a directory or not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("fails", ["prediction", "check"])
def test_a_whatif_that_fails_leaves_no_temporary_run(
    run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fails: str,
) -> None:
    """Each failed or interrupted whatif left a /tmp/twinkle-whatif-* run behind."""
    import tempfile

    import twinkle.whatif as whatif

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    real, calls = getattr(whatif, "simulate"), []  # (not exported: predict's)

    def simulate(*args: object) -> object:
        calls.append(1)
        if fails == "prediction" or len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(whatif, "simulate", simulate)
    assert main(["whatif", str(run), "--engines", "2"]) == 130
    assert list(temp.iterdir()) == []


def test_a_run_that_did_not_finish_is_predicted_saying_so(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed run (its log without its end, no summary): predicted as far as it went,
    with a line saying so (it was predicted without a word)."""
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    lines = (run / "events.jsonl").read_bytes().splitlines(keepends=True)
    (stopped / "events.jsonl").write_bytes(b"".join(lines[:-2]))  # (no run_finished)
    assert main(["whatif", str(stopped), "--engines", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        "the recorded run is stopped, not finished ok: this predicts its iterations so far, "
        "and its end as it is"
    )
    assert main(["whatif", str(run), "--engines", "2"]) == 0
    assert "not finished ok" not in capsys.readouterr().out


def test_a_run_the_model_does_not_replay_gets_no_prediction(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay of the recorded configuration 67% off the run (the model runs one
    after another what the run ran at once): no change of it is predicted, in the
    command (text and JSON) and in the report's rows."""
    from twinkle.whatif import _reproduce

    real = _reproduce.reproduction
    replayed = predict(read_recorded(str(run)), Changes())
    assert real(replayed)["steady_tokens_per_s_per_device"] == pytest.approx(0, abs=1e-9)
    shutil.rmtree(replayed.out_dir, ignore_errors=True)
    monkeypatch.setattr(
        _reproduce, "reproduction", lambda p: {**real(p), "steady_tokens_per_s_per_device": 0.67}
    )
    assert main(["whatif", str(run), "--engines", "2"]) == 0
    out = capsys.readouterr().out
    assert "not a prediction: the model replays this run as recorded 67% off" in out
    assert "that error does not bound this change (above)" in out
    assert main(["whatif", str(run), "--engines", "2", "--json"]) == 0
    assert "67% off" in json.loads(capsys.readouterr().out)["not_predicted"]
    assert main(["report", str(run), "--whatif", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["what_would_help"]
    assert rows and all(r["speedup"] is None and "67% off" in r["not_predicted"] for r in rows)


@pytest.mark.parametrize(("off", "why"), [(0.25, False), (-0.25, False), (0.26, True)])
def test_the_replay_error_bound(off: float, why: bool) -> None:
    from twinkle.whatif._reproduce import replay_off

    class Replayed:
        def figure(self, name: str) -> tuple[float, float]:
            return 100.0, 100.0 * (1 + off)

    assert (replay_off(Replayed()) is not None) is why  # type: ignore[arg-type]


def test_both_reasons_for_no_prediction_are_given() -> None:
    """A change that adds a worker on a recorded device and runs more at once on a
    device the recorded workers shared: neither reason hides the other."""
    why = not_predicted({"shared": ["engine2"], "contended": ["cpu:0"]})
    assert why is not None
    first, second = why.split("; and ")
    assert first.startswith("engine2 would share a device with the recorded workers")
    assert second.startswith("the recorded workers shared cpu:0 (their placement)")
    assert not_predicted({"shared": [], "contended": []}) is None
