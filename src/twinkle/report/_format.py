"""How the report writes a figure (the text report, its limits block and the HTML page
alike)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["NAMED_WORKERS", "num"]

#: the workers a line of the text report names at most (the JSON report has every one)
NAMED_WORKERS = 8


def num(value: Any, digits: int = 3) -> str:
    """A figure as the report shows it: ints and values from 1000 with thousands
    separators, others with ``digits`` decimals, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"
