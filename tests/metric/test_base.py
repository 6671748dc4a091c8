"""The Metric protocol and the rules of the computation layer (no torch, no clocks, no I/O)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import twinkle.metric
from twinkle.metric import LengthHistogram, Metric, ThroughputMetric

COMPUTATION_MODULES = ["base", "_lengths", "histogram", "throughput", "memory"]
SOURCE = Path(twinkle.metric.__file__).parent


class Counting:
    """A minimal third-party metric: the protocol is structural."""

    def __init__(self) -> None:
        self.n = 0

    def accumulate(self, *, n: int) -> None:
        self.n += n

    def calculate(self) -> dict[str, int | float]:
        return {"n": self.n}

    def reset(self) -> None:
        self.n = 0


def test_any_class_with_the_three_verbs_is_a_metric() -> None:
    assert isinstance(Counting(), Metric)
    assert isinstance(ThroughputMetric(), Metric)
    assert not isinstance(LengthHistogram(), Metric)
    assert not isinstance(object(), Metric)


def test_calculate_never_resets_and_reset_is_explicit() -> None:
    metric: Metric = Counting()
    metric.accumulate(n=3)
    assert metric.calculate() == metric.calculate() == {"n": 3}
    metric.reset()
    assert metric.calculate() == {"n": 0}


def test_public_names_are_exported_once_from_the_package() -> None:
    exported = set(twinkle.metric.__all__)
    assert len(exported) == len(twinkle.metric.__all__)
    assert all(hasattr(twinkle.metric, name) for name in exported)
    assert not any("Reporter" in name or "Record" in name for name in exported)


def test_importing_the_package_imports_neither_torch_nor_reporting() -> None:
    code = (
        "import sys, twinkle.metric; "
        "print(sorted(m for m in ('torch', 'twinkle.reporting') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def imported_modules(name: str) -> set[str]:
    tree = ast.parse((SOURCE / f"{name}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_computation_modules_import_only_perf_errors_and_each_other() -> None:
    for name in COMPUTATION_MODULES:
        for module in imported_modules(name):
            if module.startswith("twinkle"):
                assert module in ("twinkle.errors", "twinkle.checks") or module.startswith(
                    (
                        "twinkle.perf",
                        "twinkle.metric.base",
                        "twinkle.metric._lengths",
                        "twinkle.metric.histogram",
                    )
                ), (name, module)


def test_computation_modules_read_no_clock_and_do_no_io() -> None:
    banned = {"time", "datetime", "os", "io", "pathlib", "random", "logging", "threading"}
    for name in COMPUTATION_MODULES:
        assert not imported_modules(name) & banned, name
