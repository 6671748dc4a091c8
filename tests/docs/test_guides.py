"""The guides' code runs: docs/plugins.md's plugin is imported and installed under its
entry point, its example run; every example of docs/testing.md is a test, run here
against that plugin (so neither page can drift from the code)."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from twinkle.plugins import ENTRY_POINT_GROUP
from twinkle.run import RunSession

DOCS = Path(__file__).resolve().parents[2] / "docs"
PLUGIN = "my_tokens"


def code_blocks(page: str, language: str) -> list[tuple[int, str]]:
    """Each ```language block of docs/``page`` with the line its code starts on."""
    text = (DOCS / page).read_text()
    return [
        (text.count("\n", 0, m.start(1)) + 1, m.group(1))
        for m in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    ]


def run_block(page: str, line: int, code: str, namespace: dict[str, object]) -> None:
    """Execute a block so that a traceback names the page and its line."""
    exec(compile("\n" * (line - 1) + code, str(DOCS / page), "exec"), namespace)


def plugin_source() -> str:
    (code,) = [c for _, c in code_blocks("plugins.md", "python") if c.startswith(f"# {PLUGIN}.py")]
    return code


def pyproject() -> dict[str, Any]:
    (toml,) = [tomllib.loads(c) for _, c in code_blocks("plugins.md", "toml")]
    return toml


def entry_points() -> dict[str, str]:
    return dict(pyproject()["project"]["entry-points"][ENTRY_POINT_GROUP])


@pytest.fixture
def plugin_on_path(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """docs/plugins.md's module, importable here and in a child process."""
    site = tmp_path_factory.mktemp("site")
    (site / f"{PLUGIN}.py").write_text(plugin_source())
    monkeypatch.syspath_prepend(str(site))
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    yield site
    sys.modules.pop(PLUGIN, None)


def test_the_plugin_is_what_its_distribution_installs() -> None:
    assert pyproject()["tool"]["setuptools"]["py-modules"] == [PLUGIN]
    assert entry_points() == {"tokens_per_phase": f"{PLUGIN}:TokensPerPhase"}


def test_the_plugin_pages_example_run_counts_its_tokens(
    plugin_on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # (the example writes into ./runs)
    examples = [(n, c) for n, c in code_blocks("plugins.md", "python") if c != plugin_source()]
    assert len(examples) == 1
    namespace: dict[str, object] = {}
    run_block("plugins.md", *examples[0], namespace)
    run = namespace["run"]
    assert isinstance(run, RunSession) and run.summary is not None
    assert run.summary["tokens_per_phase"] == {"rollout": 21}  # what its comment says


def test_a_run_loads_the_installed_plugin_by_its_entry_point(
    plugin_on_path: Path, tmp_path: Path
) -> None:
    info = plugin_on_path / "my_tokens-0.1.0.dist-info"  # what pip install writes
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tokens\nVersion: 0.1.0\n")
    lines = [f"{name} = {value}" for name, value in entry_points().items()]
    (info / "entry_points.txt").write_text("\n".join([f"[{ENTRY_POINT_GROUP}]", *lines, ""]))
    importlib.invalidate_caches()
    with RunSession(out_dir=tmp_path, run_id="installed", autoload=True) as run:
        run.bus.iteration_started(0)
        run.bus.samples(iteration=0, phase="rollout", lengths=[2, 3])
    assert type(run.pm.get_plugin("tokens_per_phase")).__name__ == "TokensPerPhase"
    summary = json.loads((tmp_path / "installed" / "summary.json").read_text())
    assert summary["tokens_per_phase"] == {"rollout": 5}


def guide_tests() -> list[str]:
    """The test functions docs/testing.md's examples define, in page order."""
    return [
        node.name
        for _, code in code_blocks("testing.md", "python")
        for node in ast.parse(code).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


def test_every_example_of_the_testing_guide_is_a_test() -> None:
    for line, code in code_blocks("testing.md", "python"):
        defined = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
        assert any(n.name.startswith("test_") for n in defined), f"docs/testing.md:{line}"
    assert len(set(guide_tests())) == len(guide_tests())


@pytest.mark.parametrize("name", guide_tests())
def test_the_testing_guides_example(name: str, plugin_on_path: Path, tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "test_my_tokens"}
    for line, code in code_blocks("testing.md", "python"):  # (one module, as on the page)
        run_block("testing.md", line, code, namespace)
    test = namespace[name]
    assert callable(test)
    test(tmp_path)


def test_the_testing_guides_warning_filters_are_the_ones_the_tests_use() -> None:
    """The guide's ``filterwarnings`` is the mlflow plugin's own, and twinkle's own tests
    fail on a warning too."""
    ((_, block),) = code_blocks("testing.md", "toml")
    shown = tomllib.loads(block)["tool"]["pytest"]["ini_options"]["filterwarnings"]
    root = DOCS.parent
    used = tomllib.loads((root / "plugins" / "twinkle-mlflow" / "pyproject.toml").read_text())
    assert shown == used["tool"]["pytest"]["ini_options"]["filterwarnings"]
    own = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert own["filterwarnings"][0] == "error"
