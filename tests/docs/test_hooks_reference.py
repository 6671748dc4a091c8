"""docs/hooks.md's reference is what the generator makes of the contract and the event
types (STYLE habit 11: generated, never hand-maintained)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from twinkle import hookspecs
from twinkle.errors import InvalidArgumentError
from twinkle.events import EVENT_TYPES
from twinkle.plugins._reference import BEGIN, END, main, reference, splice

DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
REGENERATE = ".venv/bin/python -m twinkle.plugins._reference docs/hooks.md"


def test_docs_hooks_md_is_what_the_generator_makes() -> None:
    page = DOC.read_text()
    assert splice(page, reference()) == page, (
        f"docs/hooks.md's reference differs from the code: regenerate it with `{REGENERATE}`"
    )


def test_the_reference_has_every_hook_and_every_event_type() -> None:
    headings = set(re.findall(r"^### `([^`]+)`", reference(), re.MULTILINE))
    hooks = {name for name in vars(hookspecs) if name.startswith("twinkle_")}
    assert hooks <= headings
    assert set(EVENT_TYPES) <= headings  # each type by its TYPE
    for kind in EVENT_TYPES.values():
        assert f"received by the hook [`twinkle_{kind.TYPE}`](#twinkle_{kind.TYPE})" in reference()
        assert f"Sent on the signal `twinkle.{kind.TYPE}`" in reference()


def test_main_rewrites_a_stale_page_in_place(tmp_path: Path) -> None:
    page = tmp_path / "hooks.md"
    page.write_text(f"# Hooks\n\nprose\n\n{BEGIN}\nstale\n{END}\nmore prose\n")
    assert main([str(page)]) == 0
    assert page.read_text() == f"# Hooks\n\nprose\n\n{reference()}more prose\n"
    assert main([str(page)]) == 0  # (again: nothing changes)
    assert page.read_text() == f"# Hooks\n\nprose\n\n{reference()}more prose\n"


def test_a_page_without_the_markers_is_refused_saying_what_to_add() -> None:
    with pytest.raises(InvalidArgumentError, match="no generated part: put the lines"):
        splice("# Hooks\n", reference())
