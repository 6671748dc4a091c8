"""The import-layer check (SPEC §1) holds for the tree and catches an upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT), str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")
def test_layers_are_kept(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")
@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("perf/clock.py", "twinkle.metric"),
        ("perf/timer.py", "twinkle.events"),
        ("metric/throughput.py", "twinkle.reporting"),
        ("events/_types.py", "twinkle.plugins"),
        # the top-level package: its TYPE_CHECKING imports reach twinkle.run
        ("perf/clock.py", "twinkle"),
    ],
)
def test_an_upward_import_breaks_the_check(tree: Path, module: str, upward: str) -> None:
    path = tree / "src" / "twinkle" / module
    path.write_text(path.read_text() + f"\nimport {upward}  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
