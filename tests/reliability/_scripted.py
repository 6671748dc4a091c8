"""A deterministic recorded run (manual clock) using every event type: the valid log the
crash, bad-input and fuzz tests cut and corrupt."""

from __future__ import annotations

from pathlib import Path

from twinkle import testing
from twinkle.testing import SCRIPTED_CONFIG

#: the built-in observers, by name (as make_plugin_manager() registers them)
BUILTINS = frozenset(
    {
        "events",
        "memory",
        "metrics_raw",
        "scalars",
        "throughput",
        "timeline",
        "timing",
        "trace",
        "webui",
    }
)

CONFIG = SCRIPTED_CONFIG


def scripted_run(out_dir: Path, run_id: str = "cut", iterations: int = 4) -> Path:
    """Run ``iterations`` scripted iterations into ``out_dir``; returns the event log."""
    return testing.scripted_run(
        out_dir, run_id, iterations, autoload=False, background_writer=False
    )
