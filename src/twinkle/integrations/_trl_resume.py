"""Where a resumed ``train()`` starts against where the run's last one stopped: TRL's
``global_step`` at the run's last step, from each segment's ``<scalars>.start`` record,
and the warning when the new start is behind it (steps done again)."""

from __future__ import annotations

import logging
from typing import Any

from twinkle.integrations._figures import last_logged

__all__ = ["START", "last_global_step", "warn_redone"]

log = logging.getLogger("twinkle.integrations.trl")

#: the suffix of the scalars each segment records at its first step: TRL's
#: ``global_step`` at the ``train()`` start and the run's optimizer steps before it
START = ".start"


def last_global_step(pm: Any, scalars: str, steps: int) -> int:
    """TRL's ``global_step`` after the run's last optimizer step, ``steps`` the run's
    count of them: the newest segment's start (its record's ``global_step``) plus the
    steps the run counted since (its record's ``steps_before``). A run without such a
    record (none trained yet, or one recorded before the records were) began at TRL's
    step 0 with no step before."""
    start = last_logged(pm, scalars + START, "global_step") or 0
    before = last_logged(pm, scalars + START, "steps_before") or 0
    return start + (steps - before)


def warn_redone(run_id: str, scalars: str, steps: int, last: int, start_step: int) -> None:
    """Say that this train() starts behind TRL's step ``last`` at the run's last step
    (TRL resumed from an older checkpoint, or from none): the steps after its start are
    done again, and the run counts them again (``scalars``: the logged figures' name)."""
    log.warning(
        "twinkle: run %r recorded %d optimizer step(s), the last at TRL's global_step %d, "
        "and this train() starts at global_step %d (its checkpoint's, or 0 without one): "
        "the steps after it are done again, and twinkle counts every optimizer update it "
        "sees (its step is TRL's global_step + %d from here; each %r scalar record "
        "holds TRL's global_step; each segment's counts are compared with TRL's own). "
        "Resuming from the newest checkpoint redoes the least",
        run_id,
        steps,
        last,
        start_step,
        steps - start_step,
        scalars,
    )
