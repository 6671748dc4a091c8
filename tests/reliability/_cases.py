"""The row of every bad-input table: a call, the error it must raise, and a regex that
names the culprit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Path], object]
    error: type[Exception]
    match: str  # must name the culprit
