"""``twinkle watch``'s view in a terminal: fitted to the terminal's size each time rich
draws it.

rich does the measuring: each part is rendered to the console's lines at its width and
the lines counted. The text (the run and who writes it, what limits it, the steady
state and the whole loop, peak memory) is always shown, the per-iteration table gets
the rows left over. The first of these that leaves the table 3 rows (or all it has)
is drawn, else the last:

1. every text line, wrapped at the terminal's width (a word wider than it folded);
2. what limits the run cut to its headline (its title, the verdict, the windows
   counted, the critical path) and a line saying how many more ``twinkle report``
   shows, wrapped;
3. that, each line shortened to one row ending in ``…`` but the headline figures:
   the verdict, the steady state and the whole loop, still wrapped.

The table shows its newest rows, under a line saying how many older ones are not
shown (``twinkle report`` has them all); with no row left, it is one line saying so.
A table wider than the terminal is cropped, each line ending in ``…``, under a line
saying how wide it is. Its columns are not dropped: the ones on the left (iteration,
flag, verdict, tokens, tokens/s/device) are read first, and a narrower column set
would be a second table to keep in step with the report's.

The bottom row is left free: the cursor rests there once the watch ends, so the view's
first line is not scrolled away. A terminal too small for even the shortest text shows
what fits, rich's ``...`` at the bottom saying it was cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, final

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.text import Text

from twinkle.checks import printable
from twinkle.report._limits_text import HEADLINE_LINES, limits_lines
from twinkle.report._text import head_lines, iteration_table, memory_lines, throughput_lines

__all__ = ["LiveView"]

#: the table's rows a shorter text is tried for (fewer if it has fewer)
_MIN_ROWS = 3

#: a line of segments, as :meth:`rich.console.Console.render_lines` gives them
_Line = list[Segment]
#: lines of text, each with whether it wraps (else it is shortened to one row)
_Text = list[tuple[str, bool]]


@final
class LiveView:
    """The report's figures so far (``report``, :func:`twinkle.report.live_report`'s),
    drawn to fit the console they are drawn on; ``trailer``: lines shown last."""

    __slots__ = ("_table", "_tries")

    def __init__(self, report: Mapping[str, Any], *, trailer: Iterable[str] = ()) -> None:
        head, limits = head_lines(report), limits_lines(report)
        rates, rest = throughput_lines(report), [*memory_lines(report), *trailer]
        brief = limits[:HEADLINE_LINES]
        if len(limits) > len(brief):
            more = len(limits) - len(brief)
            brief.append(f"  ({more} more line{'s' * (more > 1)}: twinkle report shows them)")
        # (shortened, the headline figures still wrap: the verdict, limits' second line)
        shortened = [*_each(head, ""), *_each(brief[:1]), *_each(brief[1:2], wrap=True)]
        self._tries = [
            (_each([*head, "", *limits, ""], wrap=True), _each(["", *rates, *rest], wrap=True)),
            (_each([*head, "", *brief, ""], wrap=True), _each(["", *rates, *rest], wrap=True)),
            (
                [*shortened, *_each(brief[2:], "")],
                [*_each([""]), *_each(rates, wrap=True), *_each(rest)],
            ),
        ]
        self._table = iteration_table(report)  # (its cells escaped already)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        options = options.update(height=None)  # (each part as tall as it is)
        height = options.size.height - 1
        wanted = min(_MIN_ROWS, len(self._table) - 2)
        for head_text, foot_text in self._tries:
            head, foot = _draw(console, options, head_text), _draw(console, options, foot_text)
            table, shown = self._fitted_table(console, options, height - len(head) - len(foot))
            if shown >= wanted:
                break
        for line in [*head, *table, *foot]:
            yield from line
            yield Segment.line()

    def _fitted_table(
        self, console: Console, options: ConsoleOptions, room: int
    ) -> tuple[list[_Line], int]:
        """The table in ``room`` lines (or the one saying why it is not there): its
        header, its newest rows and what was left out; and how many rows it shows."""
        header, rows = self._table[:2], self._table[2:]
        width = max(map(cell_len, self._table))
        notes: list[str] = []
        if width > options.max_width:
            notes.append(
                f"(the table is {width} columns wide, cropped at {options.max_width}: "
                "twinkle report shows it whole)"
            )
        shown = len(rows)
        if rows and room - 2 - _height(console, options, notes) < shown:
            # (the note measured with the most digits it may hold: it never outgrows its room)
            worst = [_older(shown, shown), *notes]
            shown = max(0, room - 2 - _height(console, options, worst))
            if not shown:
                why = f"(no room for the table's {len(rows)} iterations: twinkle report has them)"
                return _render(console, options, why), 0
            notes.insert(0, _older(shown, len(rows)))
        kept = "\n".join([*header, *rows[len(rows) - shown :]])
        lines = _render(console, options, "\n".join(notes)) if notes else []
        return lines + _render(console, options, kept, wrap=False), shown


def _older(shown: int, total: int) -> str:
    return (
        f"(the newest {shown} of {total} iterations: {total - shown} older not shown; "
        "twinkle report has all of them)"
    )


def _render(
    console: Console, options: ConsoleOptions, text: str, *, wrap: bool = True
) -> list[_Line]:
    """``text``'s lines as drawn at the console's width: wrapped (a word longer than
    the width folded), or each cut to one row ending in ``…``."""
    shown = Text(text, overflow="fold") if wrap else Text(text, no_wrap=True, overflow="ellipsis")
    return console.render_lines(shown, options, pad=False)


def _each(lines: Iterable[str], *more: str, wrap: bool = False) -> _Text:
    """``lines`` and ``more``, escaped as the report's text is, each told ``wrap``."""
    return [(printable(line), wrap) for line in [*lines, *more]]


def _draw(console: Console, options: ConsoleOptions, text: _Text) -> list[_Line]:
    """``text``'s lines as drawn at the console's width (:func:`_render`)."""
    return [line for part, wrap in text for line in _render(console, options, part, wrap=wrap)]


def _height(console: Console, options: ConsoleOptions, lines: list[str]) -> int:
    return len(_render(console, options, "\n".join(lines))) if lines else 0
