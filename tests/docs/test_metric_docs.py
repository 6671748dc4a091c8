"""The key tables of docs/metrics.md are checked against real records (STYLE habit 11)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from observers.test_scripted_run import scripted_run
from twinkle.perf import ManualClock
from twinkle.perf.stats import MemoryReading
from twinkle.run import RunSession

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

FIELDS = [
    "device_allocated",
    "device_allocated_peak",
    "device_reserved",
    "device_reserved_peak",
    "host_rss",
    "host_peak_rss",
]


VIEWS = {"window", "attributed", "run"}


def doc_tables() -> dict[str, set[str]]:
    """``{heading: {keys}}`` from the '### kind ...' tables; a heading is the kind, or
    ``kind/scope`` when the heading names a scope other than ``iteration``. A table with
    a ``view`` column must give every key a view of :data:`VIEWS`."""
    tables: dict[str, set[str]] = {}
    current: str | None = None
    view_column: int | None = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"### kind `([^`]+)`(?:, scope `([^`]+)`)?", line)
        if heading:
            kind, scope = heading.group(1), heading.group(2) or "iteration"
            current = kind if scope == "iteration" else f"{kind}/{scope}"
            tables[current] = set()
            view_column = None
        elif line.startswith("## "):
            current = None
        elif current is not None and line.startswith("| key |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            view_column = cells.index("view") if "view" in cells else None
        elif current is not None:
            row = re.match(r"\| `([^`]+)` \|", line)
            if row:
                tables[current].add(row.group(1))
                if view_column is not None:
                    cells = [c.strip() for c in line.strip("|").split("|")]
                    assert cells[view_column] in VIEWS, (current, row.group(1), cells)
    return tables


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_bytes().splitlines()]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("doc")
    run = scripted_run(out / "a")
    clock = ManualClock(0)
    with RunSession(out_dir=out / "b", run_id="mem", clock=clock, autoload=False) as other:
        reading = MemoryReading("w0", 0, 1, "h", "cuda:0", 1, 2, 3, 4, 5, 6)
        other.bus.iteration_started(0)
        other.bus.memory([reading], iteration=0)
        other.bus.scalars(iteration=0, name="grpo", values={"reward_mean": 0.5})
    assert run.out_dir is not None and other.out_dir is not None
    return _records(run.out_dir) + _records(other.out_dir)


def _keys(records: list[dict[str, Any]], kind: str, scope: str) -> set[str]:
    found = [r for r in records if r["kind"] == kind and r["scope"] == scope]
    assert found, (kind, scope)
    return set().union(*(r["values"] for r in found))


def _generic(keys: set[str], phases: list[str]) -> set[str]:
    """Phase names as ``<phase>``, phase pairs as ``<p>_<q>``."""
    out = set()
    for key in keys:
        generic = re.sub(r"overlap_([a-z]+)_([a-z]+)_", "overlap_<p>_<q>_", key)
        generic = re.sub(
            r"path_(training|generation|publish|other|overhead|idle)_", "path_<kind>_", generic
        )
        for phase in phases:
            generic = re.sub(rf"(^|_){phase}_", r"\1<phase>_", generic)
        out.add(generic)
    return out


def test_timing_table_matches_records(records: list[dict[str, Any]]) -> None:
    tables = doc_tables()
    phases = ["rollout", "train"]
    assert tables["timing"] == _generic(_keys(records, "timing", "iteration"), phases)
    assert tables["timing/run"] == _generic(_keys(records, "timing", "run"), phases)


def test_phase_table_matches_records(records: list[dict[str, Any]]) -> None:
    assert doc_tables()["<phase>"] == _keys(records, "rollout", "iteration")
    assert _keys(records, "rollout", "window") == doc_tables()["<phase>/window"]


def test_iteration_and_run_tables_match_records(records: list[dict[str, Any]]) -> None:
    tables = doc_tables()
    assert tables["iteration"] == _keys(records, "iteration", "iteration")
    assert tables["run/run"] == _keys(records, "run", "run")


def test_memory_table_matches_records(records: list[dict[str, Any]]) -> None:
    documented = {key.replace("F_", f"{f}_", 1) for key in doc_tables()["memory"] for f in FIELDS}
    assert documented == _keys(records, "memory", "iteration")


def test_waits_table_matches_records(records: list[dict[str, Any]]) -> None:
    # (the scripted run has no wait.* span: tests/observers/test_workers.py has them)
    assert doc_tables()["waits"] - {"<wait>_seconds"} == _keys(records, "waits", "iteration")


def test_scalars_records_carry_the_callers_values(records: list[dict[str, Any]]) -> None:
    assert _keys(records, "grpo", "iteration") == {"reward_mean"}


def test_the_vllm_engine_record_keys_are_the_ones_the_demo_writes() -> None:
    from twinkle.demo.vllm import ENGINE_COUNTERS, ENGINE_GAUGES

    written = set(ENGINE_COUNTERS) | set(ENGINE_GAUGES) | {"tokens", "gauge_samples"}
    assert doc_tables()["vllm.<engine>"] == written
