"""The torch demo's figures recomputed from ``events.jsonl`` alone (:mod:`_recompute`):
for a streaming (default) and a ``--no-overlap`` demo, generation hidden behind training
is > 0 with overlap and ~0 without.
"""

from __future__ import annotations

from pathlib import Path

from _recompute import check_run
from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo

CFG = DemoConfig(iterations=6, prompts_per_iteration=4, completions_per_prompt=4, micro_batch=8)


def test_streaming_demo_recomputes_and_hides_generation(tmp_path: Path) -> None:
    result = run_demo(CFG, out_dir=tmp_path, run_id="overlap")
    assert result.run_dir is not None
    run = check_run(result.run_dir)
    assert run["generation_hidden_seconds"] > 0
    assert result.summary["seconds"] == run  # the summary shows the run record


def test_no_overlap_demo_recomputes_and_hides_almost_nothing(tmp_path: Path) -> None:
    cfg = DemoConfig(**{**CFG.to_dict(), "overlap": False})
    result = run_demo(cfg, out_dir=tmp_path, run_id="serial")
    assert result.run_dir is not None
    run = check_run(result.run_dir)
    assert run["generation_hidden_share"] < 0.02
