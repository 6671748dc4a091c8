"""``import twinkle``: the public names, each the object of its home module, loaded on
first use, listed in docs/plugins.md."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import twinkle

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "src" / "twinkle" / "__init__.py"
DOC = ROOT / "docs" / "plugins.md"


def type_checking_imports() -> dict[str, str]:
    """Name -> module of the ``if TYPE_CHECKING:`` imports (what type checkers see)."""
    tree = ast.parse(INIT.read_text())
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    return {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }


def documented() -> dict[str, str]:
    """Name -> module of the table under '## What `import twinkle` gives'."""
    section = DOC.read_text().split("## What `import twinkle` gives", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", section, re.MULTILINE))


def imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_all_is_sorted_without_repeats() -> None:
    assert twinkle.__all__ == sorted(set(twinkle.__all__))


def test_every_public_name_is_the_object_of_its_home_module() -> None:
    homes = type_checking_imports()
    assert set(homes) == set(twinkle.__all__)
    for name in twinkle.__all__:
        assert getattr(twinkle, name) is getattr(importlib.import_module(homes[name]), name), name


def test_the_lazy_table_and_the_type_checkers_imports_agree() -> None:
    assert twinkle._HOMES == type_checking_imports()


def test_the_docs_list_every_public_name_with_its_module() -> None:
    assert documented() == type_checking_imports(), (
        "docs/plugins.md's table under '## What `import twinkle` gives' must list exactly "
        "twinkle.__all__, each with the module it comes from"
    )


def test_no_public_name_hides_a_submodule() -> None:
    package = INIT.parent
    taken = [n for n in twinkle.__all__ if (package / n).is_dir() or (package / f"{n}.py").exists()]
    assert taken == []


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'twinkle' has no attribute 'nope'"):
        _ = twinkle.nope
    assert set(twinkle.__all__) <= set(dir(twinkle))


def test_import_twinkle_imports_nothing_more() -> None:
    loaded = imported_by("import twinkle")
    assert {m for m in loaded if m.startswith("twinkle.")} == set()
    assert {"pluggy", "torch", "msgspec", "blinker"}.isdisjoint(loaded)


def test_a_name_loads_only_its_own_module() -> None:
    events = imported_by("import twinkle; twinkle.SamplesObserved")
    assert "twinkle.events" in events
    assert {"twinkle.run", "twinkle.hookspecs", "pluggy", "torch"}.isdisjoint(events)
    contract = imported_by("import twinkle; twinkle.hookimpl")
    assert "twinkle.hookspecs" in contract
    assert {"twinkle.run", "twinkle.observers", "twinkle.plugins", "torch"}.isdisjoint(contract)
