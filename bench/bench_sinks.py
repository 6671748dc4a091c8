"""What the dashboard plugins under ``plugins/`` cost a run: TensorBoard, W&B, MLflow.

Each subject is a live run of the same iterations: per iteration a pure-Python workload
of ~20 ms that holds the GIL (the worst case for a sink working on the reporter's thread,
which needs the GIL too), a generation and a training span, rollout and training
samples, an optimizer step, a memory reading and a scalar.

* ``sinks.<plugin>``: wall seconds per iteration with the plugin's sink, against the
  built-in observers alone, the runs taking turns in one process; the ratio is what the
  sink adds to the training loop. Target ≤ 1.05x.
* ``sinks.start``: wall seconds of ``RunSession(...)`` + ``start()`` with all three
  plugins' sinks, the plugin modules' import included, against the built-in observers
  alone. Each sample is a fresh process (``sys.executable -m bench.bench_sinks``; in
  one process the modules stay imported after the first run), the two kinds taking
  turns; ``WANDB_MODE=offline``, ``MLFLOW_DISABLE_TELEMETRY=true``, no
  ``MLFLOW_TRACKING_URI`` (MLflow's sqlite store in the run directory), a temporary
  ``out_dir``. Target: the plugins add ≤ 0.5 s.
* ``sinks.lag``: in the same processes, how far ``metrics_raw.jsonl`` lags behind the
  training loop: after each iteration's work, the iterations begun whose ``iteration``
  record (the last of an iteration's records) is not in the file yet, the largest over
  the run (median of the samples). By design an iteration's records come ``finalise_lag + 1``
  boundaries after it began and the reporter hands records to the OS every 0.2 s, so
  the built-ins alone lag ``finalise_lag + 1`` iterations plus up to 0.2 s of them; the
  plugins must add nothing (their backends run on threads of their own): target ≤ 1.0x,
  give or take one iteration (where the 0.2 s write falls against the iterations).

The plugins are their own distributions: this runs where they are installed
(``make plugins-venv``; then ``.venv-plugins/bin/python -m bench --only sinks``) and says
so elsewhere.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._harness import Row, has_module, median
from twinkle.observers import ObserverConfig
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG

#: (observer name, module, class) of each plugin's sink
SINKS = [
    ("tensorboard", "twinkle_tensorboard", "TensorBoardSink"),
    ("wandb", "twinkle_wandb", "WandbSink"),
    ("mlflow", "twinkle_mlflow", "MlflowSink"),
]
WORK_S = 0.020
#: the reporter hands records to the OS at least this often (reporting.reporter)
WRITE_INTERVAL_S = 0.2
#: the repository root: the fresh processes import ``bench`` from it
ROOT = Path(__file__).resolve().parent.parent
#: the added seconds of RunSession(...) + start() the three plugins may cost
START_ADDED_TARGET_S = 0.5


def _work(seconds: float) -> None:
    """Pure-Python work holding the GIL for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i * i


def _iteration(run: RunSession, i: int) -> None:
    """One iteration of the training loop every subject runs."""
    run.bus.iteration_started(i)
    with run.recorder.span("generate", iteration=i):
        _work(WORK_S / 2)
    run.bus.samples(iteration=i, phase="rollout", lengths=[64] * 32, groups=4)
    with run.recorder.span("train.step"):
        _work(WORK_S / 2)
    run.bus.samples(iteration=i, phase="train", lengths=[64] * 32)
    run.bus.optimizer_step(iteration=i, step=i + 1, samples=32)
    run.read_memory(iteration=i)
    run.bus.scalars(iteration=i, name="grpo", values={"loss": 1.0 / (i + 1)})


def _run(iterations: int, plugins: list[tuple[str, object]]) -> float:
    """Wall seconds per iteration of a live run with ``plugins`` besides the built-ins."""
    with tempfile.TemporaryDirectory() as out:
        run = RunSession(out_dir=out, config=SCRIPTED_CONFIG, autoload=False, plugins=plugins)
        with run:
            start = time.perf_counter()
            for i in range(iterations):
                _iteration(run, i)
            per_iteration = (time.perf_counter() - start) / iterations
    return per_iteration


class _Tail:
    """The highest iterations in a growing ``metrics_raw.jsonl``, reading only new lines."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: Any = None
        self._rest = b""
        self.finalised = -1  # highest iteration whose `iteration` record is in the file
        self.any = -1  # highest iteration of any per-iteration record in the file

    def read(self) -> None:
        if self._file is None:
            try:
                self._file = open(self._path, "rb")  # noqa: SIM115 (kept open: a tail)
            except FileNotFoundError:
                return
        data = self._file.read()
        if not data:
            return
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            record = json.loads(line)
            if record.get("scope") != "iteration":
                continue
            iteration = record["iteration"]
            self.any = max(self.any, iteration)
            if record["kind"] == "iteration":
                self.finalised = max(self.finalised, iteration)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _sample(with_plugins: bool, iterations: int, out_dir: str) -> dict[str, Any]:
    """One fresh process's run (see :func:`_fresh`): the start, the lag, the finish."""
    started = time.perf_counter()
    plugins: list[tuple[str, object]] = []
    if with_plugins:  # (imported here: the plugin modules' import is part of the start)
        for name, module, cls in SINKS:
            plugins.append((name, getattr(importlib.import_module(module), cls)()))
    run = RunSession(out_dir=out_dir, config=SCRIPTED_CONFIG, autoload=False, plugins=plugins)
    run.start()
    start_s = time.perf_counter() - started
    assert run.out_dir is not None
    tail = _Tail(run.out_dir / "metrics_raw.jsonl")
    lag = lag_any = 0
    lag_s = 0.0  # how long ago the oldest iteration not in the file began
    began: list[float] = []
    try:
        loop = time.perf_counter()
        for i in range(iterations):
            began.append(time.perf_counter())
            _iteration(run, i)
            tail.read()
            lag = max(lag, i - tail.finalised)
            lag_any = max(lag_any, i - tail.any)
            if tail.finalised < i:
                lag_s = max(lag_s, time.perf_counter() - began[tail.finalised + 1])
        loop_s = time.perf_counter() - loop
    finally:
        tail.close()
        finishing = time.perf_counter()
        run.finish()
        finish_s = time.perf_counter() - finishing
    assert run.summary is not None
    backends = {
        name: {k: b.get(k) for k in ("slowest_call_seconds", "setup_error", "cut_off")}
        for name, b in run.summary["backends"].items()
        if b.get("isolated")
    }
    return {
        "start_s": start_s,
        "lag": lag,
        "lag_any": lag_any,
        "lag_s": lag_s,
        "iteration_s": loop_s / iterations,
        "finish_s": finish_s,
        "finalise_lag": ObserverConfig.parse(run.config).finalise_lag,
        "backends": backends,
    }


def _fresh(with_plugins: bool, iterations: int) -> dict[str, Any]:
    """:func:`_sample` in a fresh interpreter (``sys.executable``), nothing imported yet."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        env = dict(
            os.environ,
            WANDB_MODE="offline",
            MLFLOW_DISABLE_TELEMETRY="true",
            TMPDIR=tmp,  # (what W&B leaves in the temporary directory goes with it)
        )
        env.pop("MLFLOW_TRACKING_URI", None)
        mode = "with" if with_plugins else "without"
        args = [mode, str(iterations), str(result), str(Path(tmp) / "runs")]
        proc = subprocess.run(
            [sys.executable, "-m", "bench.bench_sinks", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(
                f"bench.bench_sinks {' '.join(args[:2])} exited {proc.returncode}: "
                f"{proc.stderr[-2000:]}"
            )
        sample: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    return sample


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1e3:.0f}" for v in values)


def _start_and_lag(iterations: int, repeats: int) -> list[Row]:
    """``sinks.start`` and ``sinks.lag``: fresh processes with and without the plugins."""
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(repeats):
        for with_plugins in (False, True):
            runs[with_plugins].append(_fresh(with_plugins, iterations))
    start = {k: [s["start_s"] for s in v] for k, v in runs.items()}
    best = {k: min(v) for k, v in start.items()}
    added = best[True] - best[False]
    ratio = best[True] / best[False]
    # what the plugins' set-up took on their own threads, off the start
    slowest = {
        name: max(s["backends"][name]["slowest_call_seconds"] or 0.0 for s in runs[True])
        for name, _, _ in SINKS
    }
    troubles = sorted(
        {
            f"{name}: {b['setup_error'] or 'cut off ' + str(b['cut_off'])}"
            for s in runs[True]
            for name, b in s["backends"].items()
            if b["setup_error"] or b["cut_off"]
        }
    )
    trouble = f"; backends in trouble: {'; '.join(troubles)}" if troubles else ""
    finish = {k: [s["finish_s"] for s in v] for k, v in runs.items()}
    rows = [
        Row(
            "sinks.start",
            "RunSession(...) + start() with the tensorboard, wandb and mlflow sinks",
            best[True] * 1e3,
            "ms",
            ratio=ratio,
            baseline=f"built-in observers alone ({best[False] * 1e3:.1f} ms)",
            target=f"<= +{START_ADDED_TARGET_S} s",
            met=added <= START_ADDED_TARGET_S,
            note=f"+{added * 1e3:.1f} ms; a fresh process per sample, the plugin modules' "
            f"import included, best of {repeats}; all: {_ms(start[True])} ms with, "
            f"{_ms(start[False])} ms without; the plugins' slowest call on their "
            f"own threads (open(): imports, store, service), at most: "
            + ", ".join(f"{n} {s:.1f} s" for n, s in slowest.items())
            + f"; finish() then took {_seconds(finish[True])} s with, "
            f"{_seconds(finish[False])} s without{trouble}",
        )
    ]
    lags = {k: [s["lag"] for s in v] for k, v in runs.items()}
    lag = {k: median(v) for k, v in lags.items()}
    lag_any = {k: median([s["lag_any"] for s in v]) for k, v in runs.items()}
    per_iteration = {k: median([s["iteration_s"] for s in v]) for k, v in runs.items()}
    lag_s = {k: median([s["lag_s"] for s in v]) for k, v in runs.items()}
    floor = runs[False][0]["finalise_lag"] + 1
    rows.append(
        Row(
            "sinks.lag",
            "metrics_raw.jsonl behind the loop, max over the run, with the three sinks",
            lag[True],
            "iterations",
            ratio=lag[True] / lag[False],
            baseline=f"built-in observers alone ({lag[False]:g} iterations)",
            target="<= 1.0x (+1 iteration)",
            met=lag[True] <= lag[False] + 1,
            note=f"{iterations} iterations of {WORK_S * 1e3:.0f} ms GIL-bound work, a fresh "
            f"process per sample (the plugins setting up during the run), median of "
            f"{repeats}; all: {', '.join(map(str, lags[True]))} with, "
            f"{', '.join(map(str, lags[False]))} without; by design "
            f"finalise_lag + 1 = {floor} plus the iterations of one "
            f"{WRITE_INTERVAL_S:g} s write (the loop took "
            f"{per_iteration[True] * 1e3:.1f} ms per iteration with, "
            f"{per_iteration[False] * 1e3:.1f} ms without); in time, the oldest iteration "
            f"not in the file began {lag_s[True] * 1e3:.0f} ms before with, "
            f"{lag_s[False] * 1e3:.0f} ms without (medians); any record of an iteration: "
            f"{lag_any[True]:g} with, {lag_any[False]:g} without",
        )
    )
    return rows


def run(smoke: bool = False) -> list[Row]:
    iterations, repeats = (3, 1) if smoke else (40, 3)
    rows: list[Row] = []
    missing = False
    for name, module, cls in SINKS:
        if not has_module(module):
            missing = True
            rows.append(
                Row(
                    f"sinks.{name}",
                    f"a run with plugins/{module.replace('_', '-')}",
                    float("nan"),
                    "",
                    note="plugin not installed: make plugins-venv, then "
                    ".venv-plugins/bin/python -m bench --only sinks",
                )
            )
            continue
        sink: Callable[[], object] = getattr(importlib.import_module(module), cls)
        _run(2, [(name, sink())])  # (imports and first-use costs out of the figures)
        best = {"with": float("inf"), "without": float("inf")}
        for _ in range(repeats):
            best["without"] = min(best["without"], _run(iterations, []))
            best["with"] = min(best["with"], _run(iterations, [(name, sink())]))
        ratio = best["with"] / best["without"]
        rows.append(
            Row(
                f"sinks.{name}",
                f"wall per iteration with the {name} sink",
                best["with"] * 1e3,
                "ms",
                ratio=ratio,
                baseline=f"built-in observers alone ({best['without'] * 1e3:.1f} ms)",
                target="<= 1.05x",
                met=ratio <= 1.05,
                note=f"{iterations} iterations of {WORK_S * 1e3:.0f} ms GIL-bound work, "
                f"best of {repeats}; the run's start and finish excluded",
            )
        )
    if missing:
        for benchmark, subject in (
            ("sinks.start", "RunSession(...) + start() with the three plugins' sinks"),
            ("sinks.lag", "metrics_raw.jsonl behind the loop with the three sinks"),
        ):
            rows.append(
                Row(
                    benchmark,
                    subject,
                    float("nan"),
                    "",
                    note="plugins not installed: make plugins-venv, then "
                    ".venv-plugins/bin/python -m bench --only sinks",
                )
            )
        return rows
    rows.extend(_start_and_lag(*((5, 1) if smoke else (300, 3))))
    return rows


if __name__ == "__main__":
    # python -m bench.bench_sinks with|without ITERATIONS RESULT_JSON OUT_DIR: one sample
    # of sinks.start and sinks.lag in this fresh process (run by _fresh)
    _mode, _iterations, _result, _out = sys.argv[1:]
    Path(_result).write_text(
        json.dumps(_sample(_mode == "with", int(_iterations), _out)), encoding="utf-8"
    )
