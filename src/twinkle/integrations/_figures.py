"""A trainer's logged dict as twinkle scalars: its numbers only, each key able to name a
figure (:func:`logged_figures`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from twinkle.checks import as_int, key_problem, plain_number
from twinkle.plugins import ObserverManager

__all__ = ["last_logged", "logged_figures", "scalars_name"]

log = logging.getLogger("twinkle.integrations")


def scalars_name(logs: Mapping[str, Any], library: str) -> str:
    """The scalars' name of a transformers-style log of ``library``: ``<library>.eval``
    for an evaluation's (``eval_*`` keys), ``<library>.train`` for the training's totals
    (``train_runtime``), else ``<library>``."""
    if any(str(key).startswith("eval_") for key in logs):
        return f"{library}.eval"
    return f"{library}.train" if "train_runtime" in logs else library


def logged_figures(
    logs: Mapping[str, Any], *, left_out: set[str], run_id: str, library: str
) -> dict[str, int | float]:
    """The numbers of ``logs`` (numpy and torch ones as plain numbers; None, which a
    trainer logs for a figure with no valid value, as NaN), without the keys that
    cannot name a figure (the bus would refuse the whole log, raising into the trainer's
    logging): each such key is named once, remembered in ``left_out``."""
    values: dict[str, int | float] = {}
    for key, raw in logs.items():
        value = plain_number(raw)
        if value is None:
            value = math.nan
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[str(key)] = value
    for key in [k for k in values if key_problem(k) is not None]:
        del values[key]
        if key not in left_out:
            left_out.add(key)
            log.warning(
                "run %r: %s logged %r, whose key %s; that figure is left out",
                run_id,
                library,
                key,
                key_problem(key),
            )
    return values


def last_logged(pm: Any, name: str, key: str) -> int | None:
    """The last whole number the run holds for ``key`` of the scalars named ``name``
    (a framework's ``global_step``, say), as twinkle's own scalars observer keeps it:
    the log's events fed again on a resume. None when none was logged, or without
    that observer (blocked)."""
    if not isinstance(pm, ObserverManager) or not pm.is_builtin("scalars"):
        return None
    last = getattr(pm.get_plugin("scalars"), "last", {}).get(name, {}).get(key)
    value = None if last is None else last[1]
    return as_int(value)
