"""``RunTotals``: per-batch counts, calibrated against producers' terminal totals.

Producers that report per batch (samples generated, tokens, optimizer updates) may
also know exact totals at the end (an engine's own counter, a dataset size). The run
summary uses :meth:`RunTotals.calibrate`: the terminal total is the final figure, the
accumulated one is kept beside it, and their difference is recorded, never hidden.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Mapping

from twinkle.checks import plain_number
from twinkle.errors import InvalidArgumentError

__all__ = ["RunTotals"]

Number = int | float


def _check_key(key: object, where: str) -> str:
    if type(key) is not str or not key:
        raise InvalidArgumentError(f"{where} key must be a non-empty str, got {key!r}")
    return key


def _check_amount(key: str, amount: object, where: str) -> Number:
    if type(amount) is int:
        return amount
    amount = plain_number(amount)  # numpy or torch: its plain number
    if type(amount) is float or (isinstance(amount, numbers.Real) and not isinstance(amount, bool)):
        value: Number = int(amount) if isinstance(amount, numbers.Integral) else float(amount)
        if isinstance(value, int) or math.isfinite(value):
            return value
    raise InvalidArgumentError(
        f"{where}[{key!r}] = {amount!r} must be a finite int or float (not bool); "
        "a total that is unknown is left out"
    )


class RunTotals:
    """Accumulates named totals (thread-safe) and calibrates them against terminal ones.

    ``int`` amounts stay exact ``int``; any ``float`` amount makes that key a float.
    Results depend only on the amounts and their order.
    """

    __slots__ = ("_lock", "_totals")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, Number] = {}

    def add(self, key: str, amount: int | float) -> None:
        """Add ``amount`` (finite int or float; negative allowed for corrections)."""
        _check_key(key, "RunTotals.add")
        value = _check_amount(key, amount, "amount")
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + value

    def totals(self) -> dict[str, int | float]:
        """The accumulated totals, keys sorted."""
        with self._lock:
            return {k: self._totals[k] for k in sorted(self._totals)}

    def get(self, key: str) -> int | float:
        """The accumulated total of ``key`` (0 if nothing was added)."""
        with self._lock:
            return self._totals.get(key, 0)

    def calibrate(
        self, terminal: Mapping[str, int | float] | None = None
    ) -> dict[str, dict[str, int | float | None]]:
        """Per key (accumulated or terminal, sorted): ``accumulated``, ``terminal``,
        ``final`` and ``discrepancy``.

        ``final`` is the terminal total when one is given, else the accumulated one;
        ``discrepancy`` is ``terminal - accumulated`` (0 when they agree), or ``None``
        when there is no terminal total to compare with (``terminal`` is then ``None``
        too). A key only in ``terminal`` has ``accumulated`` 0. Does not change the
        totals.
        """
        if terminal is None:
            terminal = {}
        if not isinstance(terminal, Mapping):
            raise InvalidArgumentError(
                f"terminal must be a mapping of key to total, got {terminal!r}"
            )
        checked = {
            _check_key(k, "terminal"): _check_amount(k, v, "terminal") for k, v in terminal.items()
        }
        accumulated = self.totals()
        out: dict[str, dict[str, int | float | None]] = {}
        for key in sorted(accumulated.keys() | checked.keys()):
            acc = accumulated.get(key, 0)
            term = checked.get(key)
            out[key] = {
                "accumulated": acc,
                "terminal": term,
                "final": acc if term is None else term,
                "discrepancy": None if term is None else term - acc,
            }
        return out

    def __repr__(self) -> str:
        return f"RunTotals({self.totals()!r})"
