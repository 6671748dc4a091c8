"""How the report writes a figure (the text report, its limits block and the HTML page
alike), and the run's text as the HTML page's plots show it."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["NAMED_WORKERS", "error_line", "highest_peaks", "num", "plotly_text"]

#: the workers a line of the text report names at most (the JSON report has every one)
NAMED_WORKERS = 8
#: quotes as the numeric references plotly.js decodes (it knows no ``&quot;``)
_QUOTES = str.maketrans({'"': "&#34;", "'": "&#39;"})


def error_line(error: str) -> str:
    """The error a run ended in, on one line: its terminal colours dropped (Ray's
    worker errors carry them; rich reads them) and, of an error of several lines (a
    worker's traceback), the first and the last, where the cause is; the whole is in
    ``summary.json``."""
    from rich.text import Text

    # (rich reads a carriage return as going back over the line: each one a line's end)
    plain = Text.from_ansi(error.replace("\r\n", "\n").replace("\r", "\n")).plain
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    if len(lines) < 2:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]} (its {len(lines)} lines: summary.json error)"


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


def highest_peaks(peaks: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The workers of ``peaks`` (``memory_peak_bytes``), the highest peak (any field)
    first, of equal peaks by name: what a view too small for every worker shows."""
    return sorted(peaks, key=lambda w: (-max(peaks[w].values(), default=0), w))


def plotly_text(text: object) -> str:
    """``text`` (a run's name of a worker, thread, phase, span...) for a plotly figure,
    shown as written: plotly.js draws a subset of HTML in trace names, tick labels and
    hover text (``<a href>`` a live link, ``<b>``, ``<br>``...), and decodes ``&amp;``,
    ``&lt;``, ``&gt;`` and numeric references in them, after telling the tags apart."""
    return html.escape(str(text), quote=False).translate(_QUOTES)
