"""What the dashboard plugins under ``plugins/`` cost a run: TensorBoard, W&B, MLflow.

Each subject is a live run of the same iterations, taking turns in one process: per
iteration a pure-Python workload of ~20 ms that holds the GIL (the worst case for a sink
working on the reporter's thread, which needs the GIL too), a generation and a training
span, rollout and training samples, an optimizer step, a memory reading and a scalar.

* ``sinks.<plugin>``: wall seconds per iteration with the plugin's sink, against the
  built-in observers alone; the ratio is what the sink adds to the training loop.
  Target ≤ 1.05x.

The plugins are their own distributions: this runs where they are installed
(``make plugins-venv``; then ``.venv-plugins/bin/python -m bench --only sinks``) and says
so elsewhere.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from collections.abc import Callable

from bench._harness import Row, has_module
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG

#: (observer name, module, class) of each plugin's sink
SINKS = [
    ("tensorboard", "twinkle_tensorboard", "TensorBoardSink"),
    ("wandb", "twinkle_wandb", "WandbSink"),
    ("mlflow", "twinkle_mlflow", "MlflowSink"),
]
WORK_S = 0.020


def _work(seconds: float) -> None:
    """Pure-Python work holding the GIL for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i * i


def _run(iterations: int, plugins: list[tuple[str, object]]) -> float:
    """Wall seconds per iteration of a live run with ``plugins`` besides the built-ins."""
    with tempfile.TemporaryDirectory() as out:
        run = RunSession(out_dir=out, config=SCRIPTED_CONFIG, autoload=False, plugins=plugins)
        with run:
            start = time.perf_counter()
            for i in range(iterations):
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
            per_iteration = (time.perf_counter() - start) / iterations
    return per_iteration


def run(smoke: bool = False) -> list[Row]:
    iterations, repeats = (3, 1) if smoke else (40, 3)
    rows: list[Row] = []
    for name, module, cls in SINKS:
        if not has_module(module):
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
    return rows
