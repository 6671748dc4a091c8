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
from twinkle.report._text import LEGEND

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


def test_every_column_is_documented_and_in_the_legend(report: dict[str, Any]) -> None:
    text = format_report(report)
    header = next(line for line in text.splitlines() if line.startswith("iter"))
    columns = re.split(r"\s{2,}", header.strip())
    generic = {_generic(c, report["phases"], report["streaming"]) for c in columns}
    documented = _documented()
    assert generic - documented == set(), generic - documented
    # the legend names every column but iter, tokens and reward (they say what they are)
    explained: set[str] = set()
    for line in LEGEND[1:]:
        name = line.strip().split("  ")[0]
        words, unit = (name[: -len(" s")], " s") if name.endswith(" s") else (name, "")
        if "/" in words and unit:  # "wall/busy/idle s": three columns
            explained.update(f"{w}{unit}" for w in words.split("/"))
        explained.add(name)
    assert generic - {"iter", "tokens", "reward"} <= explained
