"""The run lifecycle: :class:`Run` (one run's observers and outputs), fed live by a
:class:`RunSession` or from a log by :func:`replay`."""

from twinkle.run._checkpoint import CHECKPOINT_FILE, log_unlike_checkpoint
from twinkle.run._config import check_config
from twinkle.run._follow import Follower, Snapshot, Writer, writer_of
from twinkle.run._replay import ReplayResult, iter_events, replay, started_config
from twinkle.run._run import Run, RunState
from twinkle.run._session import Resumed, RunSession, new_run_id
from twinkle.run._signals import SignalGuard, SignalInterrupt, finish_on_signals
from twinkle.run._summary import SUMMARY_FILE

__all__ = [
    "CHECKPOINT_FILE",
    "Follower",
    "SUMMARY_FILE",
    "ReplayResult",
    "Resumed",
    "Run",
    "RunSession",
    "RunState",
    "Writer",
    "SignalGuard",
    "SignalInterrupt",
    "Snapshot",
    "check_config",
    "finish_on_signals",
    "iter_events",
    "log_unlike_checkpoint",
    "new_run_id",
    "replay",
    "started_config",
    "writer_of",
]
