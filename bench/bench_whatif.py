"""How wrong ``twinkle whatif`` is: record a run X, predict configuration Y from it, run
Y, and compare the prediction with the run figure by figure (issue 33).

Two test beds:

* ``whatif.sim``: the demo on simulated devices (``--sim-device``): generation and
  training take device time (a sleep) instead of the host's CPU, so two cores run four
  engines side by side as four GPUs would. X is 2 engines, lag 1; each Y changes one or
  two settings. This is the model's own ground: independent devices.
* ``whatif.replay``: torch demo runs (the default, no overlap, 4 engines, and each
  scenario knob's bottleneck) each predicted as recorded: the simulator's own check.
* ``whatif.torch``: the real torch demo. Every worker shares this host's 2 cores, which
  the model does not know about (it assumes independent devices): the error here is
  what sharing costs, reported as it is.

Each row: the predicted figure (``value``), the run's (``vs``) and their ratio; the
steady-state throughput's row carries the goal (within 5 %). ``--smoke`` runs 4
iterations of two configurations.
"""

from __future__ import annotations

import dataclasses
import glob
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._harness import Row
from twinkle.report import load_report
from twinkle.whatif import Changes, Prediction, predict

#: (name, the demo's options for Y, the changes that predict Y from X)
SIM_CASES: tuple[tuple[str, list[str], Changes], ...] = (
    ("as recorded", [], Changes()),
    ("engines 1", ["--engines", "1"], Changes(engines=1)),
    ("engines 4", ["--engines", "4"], Changes(engines=4)),
    ("lag 0 (no overlap)", ["--no-overlap"], Changes(lag=0)),
    ("lag 2", ["--lag", "2"], Changes(lag=2)),
    ("trainer 2x slower", ["--slow-training", "2"], Changes(speed={"train": 0.5})),
    ("engines 4, lag 2", ["--engines", "4", "--lag", "2"], Changes(engines=4, lag=2)),
    ("engines 1, no overlap", ["--engines", "1", "--no-overlap"], Changes(engines=1, lag=0)),
)
TORCH_CASES = SIM_CASES[:4] + SIM_CASES[5:6]
#: runs of the torch demo each replayed as recorded (the simulator's own check): the
#: default, no overlap, 4 engines and the scenario knobs' bottlenecks
REPLAYED: tuple[tuple[str, list[str]], ...] = (
    ("default", []),
    ("no overlap", ["--no-overlap"]),
    ("engines 4", ["--engines", "4"]),
    ("generation-bound", ["--slow-generation", "6"]),
    ("training-bound", ["--slow-training", "5"]),
    ("publish-bound", ["--slow-publish", "300"]),
    ("straggler", ["--slow-engine", "engine1:8"]),
)

#: (figure, unit) compared; the first carries the goal
FIGURES = (
    ("steady_tokens_per_s_per_device", "tok/s/dev"),
    ("tokens_per_s_per_device", "tok/s/dev"),
    ("loop_wall_seconds", "s"),
    ("rollout_seconds", "s"),
    ("train_seconds", "s"),
)
GOAL = 0.05


def _demo(out: Path, options: list[str], iterations: int) -> Path:
    twinkle = str(Path(sys.executable).parent / "twinkle")
    cmd = [twinkle, "demo", "--out", str(out), "--iterations"]
    subprocess.run([*cmd, str(iterations), *options], check=True, capture_output=True)
    (run,) = glob.glob(str(out / "*"))
    return Path(run)


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "steady_tokens_per_s_per_device": report["window"].get("steady_tokens_per_s_per_device"),
        "tokens_per_s_per_device": report["window"].get("tokens_per_s_per_device"),
        "loop_wall_seconds": report["seconds"]["parts"]["wall"]["loop"],
        **{f"{k}_seconds": v for k, v in report["seconds"]["phases"].items()},
    }


def _rows(bed: str, case: str, prediction: Prediction, actual: dict[str, Any]) -> list[Row]:
    predicted, real = _figures(prediction.predicted), _figures(actual)
    rows = []
    for k, (name, unit) in enumerate(FIGURES):
        p, a = predicted.get(name), real.get(name)
        if p is None or not a:
            continue
        error = p / a - 1
        goal = k == 0 and bed in ("sim", "replay")
        rows.append(
            Row(
                f"whatif.{bed}",
                f"{case}: {name}",
                p,
                unit,
                ratio=p / a,
                baseline=f"run: {a:,.4g}",
                target=f"within {GOAL:.0%}" if goal else "",
                met=abs(error) <= GOAL if goal else None,
                note=f"error {error:+.1%}",
            )
        )
    return rows


def _bed(bed: str, cases: tuple[tuple[str, list[str], Changes], ...], base: list[str], n: int):
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        root = Path(tmp)
        recorded = _demo(root / "x", base, n)
        for k, (case, options, changes) in enumerate(cases):
            prediction = predict(recorded, changes, root / f"p{k}")
            actual = load_report(
                recorded if not options else _demo(root / f"y{k}", [*base, *options], n)
            )
            rows += _rows(bed, case, prediction, actual)
            shutil.rmtree(prediction.out_dir, ignore_errors=True)
    return rows


def _replays(n: int) -> list[Row]:
    """Each of :data:`REPLAYED` recorded, then predicted as recorded: the steady-state
    throughput's error (the goal) and the verdict kept."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        for k, (case, options) in enumerate(REPLAYED):
            recorded = _demo(Path(tmp) / f"x{k}", options, n)
            p = predict(recorded, Changes(), Path(tmp) / f"p{k}")
            (row,) = _rows("replay", case, p, p.recorded)[:1]
            verdicts = (p.recorded["limits"]["verdict"], p.predicted["limits"]["verdict"])
            rows.append(
                dataclasses.replace(row, note=f"{row.note}; verdict {' -> '.join(verdicts)}")
            )
    return rows


def run(smoke: bool = False) -> list[Row]:
    n = 4 if smoke else 16
    sim = SIM_CASES[:2] if smoke else SIM_CASES
    rows = _bed("sim", sim, ["--sim-device"], n)
    if not smoke:
        rows += _replays(12)
        rows += _bed("torch", TORCH_CASES, [], 12)
    return rows
