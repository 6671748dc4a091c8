"""One vocabulary (issue 27, item 9): every column of the report's table (which the demo
prints too) is named in docs/metrics.md "Report columns" and in the report's legend."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from twinkle.demo.config import DemoConfig
from twinkle.demo.runner import run_demo
from twinkle.report import format_report, load_report
from twinkle.report._text import LEGEND_TITLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _documented() -> set[str]:
    text = DOC.read_text()
    section = text[text.index("## Report columns") :]
    section = section[: section.index("\n## ", 1)]
    names: set[str] = set()
    for line in section.splitlines():
        cell = re.match(r"\| (`[^|]+`) \|", line)
        if cell:
            names.update(re.findall(r"`([^`]+)`", cell.group(1)))
    return names


def _generic(column: str, phases: list[str], pair: list[str]) -> str:
    if column == "{}&{} s".format(*pair):
        return "<gen>&<train> s"
    for phase in phases:
        column = re.sub(rf"(^| ){re.escape(phase)} ", r"\1<phase> ", column)
    return column


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("columns")
    cfg = DemoConfig(iterations=3, prompts_per_iteration=2, completions_per_prompt=2, micro_batch=4)
    run_demo(cfg, out_dir=out, run_id="c", autoload=False)
    return load_report(out / "c")


def _columns(text: str, report: dict[str, Any]) -> set[str]:
    header = next(line for line in text.splitlines() if line.startswith("iter"))
    columns = re.split(r"\s{2,}", header.strip())
    return {_generic(c, report["phases"], report["streaming"]) for c in columns}


def _explained(text: str) -> set[str]:
    """The columns the text's legend names."""
    legend = text.split(LEGEND_TITLE + "\n", 1)[1].split("\n\n", 1)[0]
    explained: set[str] = set()
    for line in legend.splitlines():
        name = line.strip().split("  ")[0]
        words, unit = (name[: -len(" s")], " s") if name.endswith(" s") else (name, "")
        if "/" in words and unit:  # "wall/busy/idle s": three columns
            explained.update(f"{w}{unit}" for w in words.split("/"))
        else:
            explained.add(name)
    return explained


def test_every_column_is_documented_and_in_the_legend(report: dict[str, Any]) -> None:
    text = format_report(report)
    generic = _columns(text, report)
    documented = _documented()
    assert generic - documented == set(), generic - documented
    # the legend names every column but iter, tokens and reward (they say what they
    # are), and no column the table lacks (this run: one segment, no peak, so no MFU)
    assert _explained(text) == generic - {"iter", "tokens", "reward"}
    assert "seg" not in _explained(text)
    assert "<phase> MFU %" not in _explained(text)


def test_the_legend_follows_the_columns_a_run_has(report: dict[str, Any]) -> None:
    """Two segments and a peak: the seg and MFU columns appear, and the legend with them."""
    phases = {p: {"figure": "mfu"} for p in report["throughput_phases"]}
    segments = [
        {"segment": k, "first_iteration": k, "last_iteration": k, "status": "ok"} for k in (0, 1)
    ]
    richer = {**report, "segments": segments, "mfu": {"peak_flops_per_s": 1e12, "phases": phases}}
    text = format_report(richer)
    generic = _columns(text, richer)
    assert {"seg", "<phase> MFU %"} <= generic
    assert _explained(text) == generic - {"iter", "tokens", "reward"}
    assert generic - _documented() == set(), generic - _documented()
