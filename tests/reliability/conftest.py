"""Reliability suite: sizes, the soak switch and the figures it reports.

The default sizes keep the suite fast enough for ``make test``. The soak mode scales
them up: run the ``soak``-marked tests (``pytest -m soak tests/reliability``; they are
deselected by default) or set ``TWINKLE_SOAK=1`` to scale every test of this suite.
Each test records what it wrote and lost in the ``figures`` fixture; the figures are
printed at the end of the run (the soak figures quoted in docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reliability._sizes import DEFAULT, SOAK, Sizes, soak_enabled


def sizes_for(request: pytest.FixtureRequest) -> Sizes:
    soak = soak_enabled() or request.node.get_closest_marker("soak") is not None
    return SOAK if soak else DEFAULT


@pytest.fixture
def sizes(request: pytest.FixtureRequest) -> Sizes:
    """The counts for this test: soak-sized for ``soak`` tests or ``TWINKLE_SOAK=1``."""
    return sizes_for(request)


_FIGURES: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Callable[..., None]]:
    """``figures(written=..., lost=..., ...)`` records this test's counts for the report."""

    def record(**values: Any) -> None:
        _FIGURES.append((request.node.nodeid.split("::")[-1], values))

    yield record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("twinkle reliability figures")
    for name, values in _FIGURES:
        shown = ", ".join(
            f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in values.items()
        )
        terminalreporter.write_line(f"{name}: {shown}")
