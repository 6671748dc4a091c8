"""How far the model's replay of a run's recorded configuration is from the run: the
error every prediction of that run carries, and the bound past which its predictions
are none (docs/metrics.md, "What if: predicting another configuration")."""

from __future__ import annotations

from typing import Any, Final

from twinkle.whatif import Prediction

__all__ = ["REPLAY_ERROR_MAX", "replay_off", "reproduction"]

#: the most the replay of the recorded configuration may be off the run (steady
#: tokens/s/device) for a prediction of it to be one: past it, the model misses how
#: this run's work ran (say, training on a thread of its own beside generation, which
#: the model runs one after the other), and what it says of a change is that miss
REPLAY_ERROR_MAX: Final = 0.25


def reproduction(replay: Prediction) -> dict[str, Any]:
    """Per figure, the model's replay of the recorded configuration (``replay``: a
    prediction with no change) over the run, less 1 (None where either lacks it)."""
    out = {}
    for name in ("steady_tokens_per_s_per_device", "tokens_per_s_per_device", "loop_wall_seconds"):
        a, b = replay.figure(name)
        out[name] = None if not a or b is None else b / a - 1
    return out


def replay_off(replay: Prediction) -> str | None:
    """Why no prediction of this run is one, when the model's replay of it as recorded
    is more than :data:`REPLAY_ERROR_MAX` off (None: it is within)."""
    error = reproduction(replay)["steady_tokens_per_s_per_device"]
    if error is None or abs(error) <= REPLAY_ERROR_MAX:
        return None
    return (
        f"the model replays this run as recorded {abs(error):.0%} off (steady "
        f"tokens/s/device; more than {REPLAY_ERROR_MAX:.0%}): it misses how this run's "
        "work ran (at once or one after another), so what it says of a change is that miss"
    )
