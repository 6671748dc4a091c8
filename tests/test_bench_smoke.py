"""The benchmarks' smoke mode runs end to end and prints the one ratio table.

Nothing here asserts a timing target (the figures of a smoke run mean nothing and timing
tests are flaky by nature): the targets live in the table that ``python -m bench``
prints. This keeps every bench module importable and runnable as the code changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One benchmark label each module's rows carry (the table's first column).
EXPECTED = {
    "bench.bench_perf": ["perf.span", "perf.span profile", "perf.memory"],
    "bench.bench_metric": ["metric", "metric profile"],
    "bench.bench_reporting": ["reporting", "reporting (disk)"],
    "bench.bench_events": ["events.publish", "events.plugin", "events.replay"],
    "bench.bench_demo": ["demo", "demo.scaling", "demo.observers profile"],
    "bench.bench_engines": ["engines"],
    "bench.bench_trl": ["trl.grpo"],
    "bench.bench_remote": ["remote.span", "remote.iteration"],
    "bench.bench_sinks": ["sinks.tensorboard", "sinks.wandb", "sinks.mlflow"],
    "bench.bench_scale": [
        "scale.driver",
        "scale.bytes",
        "scale.trace",
        "scale.resume",
        "scale.replay",
        "scale.replay floor",
        "scale.report",
    ],
    "bench.bench_whatif": ["whatif.sim"],
}


@pytest.fixture(scope="module")
def smoke_output() -> str:
    env = {**os.environ, "TWINKLE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"python -m bench --smoke failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_module_is_in_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.__main__ import MODULES

    assert sorted(MODULES) == sorted(EXPECTED)


def test_smoke_run_prints_the_machine_and_one_table(smoke_output: str) -> None:
    lines = smoke_output.splitlines()
    assert lines[0].startswith("machine: ")
    assert "nproc" in lines[0]
    assert lines[1].startswith("python ")
    header = [i for i, line in enumerate(lines) if line.startswith("| benchmark |")]
    assert len(header) == 1, "exactly one table"
    rows = [line for line in lines[header[0] + 2 :] if line.startswith("| ")]
    assert rows, "the table has rows"
    columns = lines[header[0]].count("|")
    assert all(row.count("|") - row.count("\\|") == columns for row in rows)


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_each_module_prints_its_rows(smoke_output: str, module: str) -> None:
    labels = {
        line.split("|")[1].strip() for line in smoke_output.splitlines() if line.startswith("| ")
    }
    for label in EXPECTED[module]:
        assert label in labels, f"{module} printed no {label!r} row"


def test_table_rows_render_without_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench._harness import Row, format_table, missing_peer

    table = format_table(
        [
            Row("perf.span", "floor", 100.0, "ns", 1.0),
            Row("metric", "x", 2.5e-13, "max rel. diff", target="equal", met=True),
            missing_peer("metric", "peer: Lightning", "lightning-fabric"),
        ]
    )
    assert "| 100.0 ns | 1.00x |" in table
    assert "2.5e-13 max rel. diff" in table
    assert "| n/a |" in table and "peer not installed" in table
