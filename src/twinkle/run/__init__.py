"""The run lifecycle: :class:`Run` (one run's observers and outputs), fed live by a
:class:`RunSession` or from a log by :func:`replay`."""

from twinkle.run._replay import ReplayResult, iter_events, replay
from twinkle.run._run import SUMMARY_FILE, Run, RunState, check_config
from twinkle.run._session import RunSession, new_run_id

__all__ = [
    "SUMMARY_FILE",
    "ReplayResult",
    "Run",
    "RunSession",
    "RunState",
    "check_config",
    "iter_events",
    "new_run_id",
    "replay",
]
