"""The ``summary.json`` table of docs/metrics.md lists exactly the keys a run writes
(STYLE habit 11: a table of output keys is checked, never hand-maintained alone)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from twinkle.observers import mfu_config
from twinkle.perf import ManualClock
from twinkle.run import RunSession

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
CONFIG = {
    "phases": {"rollout": ["generate"]},
    "throughput": {"rollout": {"samples": "rollout", "devices": 1}},
    "window": {"samples": "rollout", "devices": 1},
    "mfu": mfu_config(
        {
            "model_type": "llama",
            "hidden_size": 8,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "intermediate_size": 16,
            "vocab_size": 10,
        },
        dtype="bfloat16",
        device="NVIDIA H100 80GB HBM3",
        generation="rollout",
    ),
    "compare": {"scalars": "grpo", "seconds": {"generate": "generate_s"}},
}


def documented_keys() -> set[str]:
    """Every `key` named in the first cell of the table under '## `summary.json`'."""
    text = DOC.read_text()
    section = text.split("## `summary.json`", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def test_the_summary_table_lists_every_key_a_run_writes(tmp_path: Path) -> None:
    clock = ManualClock(10**9)
    with RunSession(
        out_dir=tmp_path, run_id="doc", config=CONFIG, autoload=False, clock=clock
    ) as run:
        run.bus.iteration_started(0)
        with run.recorder.span("generate", iteration=0):
            clock.advance(1_000)
        run.bus.samples(iteration=0, phase="rollout", lengths=[3])
        run.read_memory(iteration=0)
        run.bus.scalars(iteration=0, name="grpo", values={"loss": 0.5})
    written = set(orjson.loads((tmp_path / "doc" / "summary.json").read_bytes()))
    assert written == documented_keys()
