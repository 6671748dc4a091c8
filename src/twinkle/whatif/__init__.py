"""``twinkle whatif``: predict what another configuration of a recorded streaming RL run
would do (more or fewer engines or trainer ranks, a faster phase or worker, another
staleness bound or buffer) by re-simulating the run's loop from its own spans
(docs/metrics.md, "What if: predicting another configuration").

The predicted run is a run: its event log (what the simulated loop would have logged)
replayed through the built-in observers into a directory, so its figures are the same
observers' as the recorded run's, and ``twinkle report`` reads it as any run.

>>> from twinkle.whatif import Changes, predict
>>> p = predict("runs/abc", Changes(engines=4))          # doctest: +SKIP
>>> p.figure("steady_tokens_per_s_per_device")           # doctest: +SKIP
(5210.4, 9876.1)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.report import compare, load_report
from twinkle.reporting import real_path
from twinkle.whatif._predict import (
    added_on_shared_devices,
    contended_devices,
    predicted_events,
    write_prediction,
)
from twinkle.whatif._recorded import Recorded, read_recorded
from twinkle.whatif._schedule import Plan, simulate
from twinkle.whatif._work import Changes, plan_for, recorded_ranks

__all__ = ["ASSUMPTIONS", "Changes", "Prediction", "predict"]

#: what every prediction assumes (the model's limits), in the words the report prints
ASSUMPTIONS = (
    "each worker has its own device: work on one never slows another (shared CPU cores, "
    "a shared network or host memory are outside the model)",
    "each span takes its recorded time, over its speed factor; the host's gaps between "
    "spans are kept as recorded",
    "another number of engines shares each iteration's generation tokens equally; an "
    "engine's generation time is a + b * tokens, fitted to the recorded engines' spans "
    "(a new engine runs at the typical engine's speed)",
    "another number of trainer ranks splits the training phase's time evenly (its "
    "all-reduce does not grow)",
    "the schedule is the streaming driver's: iteration i generated with version i - lag, "
    "a bounded buffer, each version published once the rollouts still needing the "
    "previous one are in, one publication at a time",
)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A prediction: the recorded run's report, the predicted run's (the same figures,
    read from the predicted run's files), where those files are, the changes and the
    effective settings (engines, ranks, lag, buffer)."""

    recorded: dict[str, Any]
    predicted: dict[str, Any]
    out_dir: Path
    changes: Changes
    settings: dict[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        """Figure by figure: recorded (``a``), predicted (``b``), predicted / recorded."""
        return compare(self.recorded, self.predicted)

    def figure(self, name: str) -> tuple[Any, Any]:
        """One figure, recorded and predicted (None where a run lacks it)."""
        for row in self.rows():
            if row["figure"] == name:
                return row["a"], row["b"]
        return None, None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded_run": self.recorded.get("run_dir"),
            "predicted_run": str(self.out_dir),
            "changes": _changes_dict(self.changes),
            "settings": self.settings,
            "assumptions": list(ASSUMPTIONS),
            "compare": self.rows(),
            "iterations": _per_iteration(self.recorded, self.predicted),
            "verdict": {
                "recorded": _verdict(self.recorded),
                "predicted": _verdict(self.predicted),
            },
            "critical_path_shares": {
                "recorded": _path(self.recorded),
                "predicted": _path(self.predicted),
            },
        }


def _changes_dict(changes: Changes) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: value
        for name in ("engines", "ranks", "lag", "buffer")
        if (value := getattr(changes, name)) is not None
    }
    if changes.speed:
        out["speed"] = dict(changes.speed)
    return out


def _verdict(report: dict[str, Any]) -> Any:
    limits = report.get("limits") or {}
    return limits.get("verdict")


def _path(report: dict[str, Any]) -> Any:
    """The steady state's critical path: each part's share of it."""
    return (report.get("limits") or {}).get("path_shares")


def _per_iteration(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    rows_b = {row["iteration"]: row for row in b["iterations"]}
    out = []
    for row in a["iterations"]:
        other = rows_b.get(row["iteration"], {})
        out.append(
            {
                "iteration": row["iteration"],
                "recorded_seconds": row.get("window_wall_seconds"),
                "predicted_seconds": other.get("window_wall_seconds"),
                "recorded_tokens_per_s_per_device": row.get("tokens_per_s_per_device"),
                "predicted_tokens_per_s_per_device": other.get("tokens_per_s_per_device"),
            }
        )
    return out


def _settings(recorded: Recorded, plan: Plan, changes: Changes) -> dict[str, Any]:
    """The predicted run's engines, ranks, lag and buffer (recorded where unchanged),
    the workers it adds on a device another worker uses (``shared``: the model's
    assumption of a device of their own does not hold for them) and the devices several
    recorded workers shared when it changes how much of their work runs at once
    (``contended``: what sharing cost is in the recorded times, which it keeps), or
    when it changes a speed (``speed_shared``: the others keep their recorded times,
    where a real speed-up there changes what they get)."""
    was = recorded_ranks(recorded)
    ranks = changes.ranks or was
    concurrency_changed = (
        plan.lag != recorded.lag
        or changes.buffer not in (None, recorded.buffer_size)
        or len(plan.engines) < len(recorded.engines)
        or ranks < was
    )
    return {
        "engines": len(plan.engines),
        "ranks": ranks,
        "lag": plan.lag,
        "buffer": plan.buffer,
        "shared": added_on_shared_devices(recorded, plan, changes.ranks),
        "contended": contended_devices(recorded, concurrency_changed),
        "speed_shared": contended_devices(recorded, bool(changes.speed)),
    }


def _out_dir(out_dir: str | os.PathLike[str] | None, recorded: Recorded) -> Path:
    """Where the predicted run goes: ``out_dir`` (new or empty, not the run's own
    directory), else a new temporary directory."""
    if out_dir is None:
        return Path(tempfile.mkdtemp(prefix="twinkle-whatif-"))
    out = Path(out_dir)
    if out.is_symlink():  # (its files would land wherever the link points)
        raise InvalidArgumentError(
            f"--out {str(out)!r} is a symbolic link (to {os.readlink(out)!r}): give the "
            "directory's real path, or a new one (nothing was written)"
        )
    if real_path(out) == real_path(recorded.path.parent):
        raise InvalidArgumentError(
            f"--out {str(out)!r} is the recorded run's own directory: give a new directory"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(
            f"--out {str(out)!r} exists and is not an empty directory: give a new or empty one "
            "(nothing was written)"
        )
    return out


def predict(
    run: str | os.PathLike[str] | Recorded,
    changes: Changes | None = None,
    out_dir: str | os.PathLike[str] | None = None,
) -> Prediction:
    """Predict the run in ``run`` (its directory, or the run already read by
    :func:`~twinkle.whatif._recorded.read_recorded`) under ``changes`` (None: as
    recorded, the simulator's own check). The predicted run is written to ``out_dir``
    (new or empty; a new temporary directory when None, which the caller removes)."""
    changes = changes or Changes()
    recorded = run if isinstance(run, Recorded) else read_recorded(run)
    plan = plan_for(recorded, changes)
    out = _out_dir(out_dir, recorded)
    try:
        timeline = simulate(plan, recorded)
        events = predicted_events(recorded, plan, timeline, _changes_dict(changes))
        write_prediction(events, out, force=True)  # (new or empty: checked above)
        return Prediction(
            recorded=load_report(recorded.path.parent),
            predicted=load_report(out),
            out_dir=out,
            changes=changes,
            settings=_settings(recorded, plan, changes),
        )
    except BaseException:
        if out_dir is None:  # (a temporary directory of its own: a failure leaves none)
            shutil.rmtree(out, ignore_errors=True)
        raise
