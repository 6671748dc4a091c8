"""``BackendHealth``: what each backend of a run did with its records (``summary.json``
→ ``backends``), for the run's own files and for a plugin's
:class:`~twinkle.reporting.IsolatedBackend` alike."""

from __future__ import annotations

import msgspec

from twinkle.checks import Count, NonEmpty

__all__ = ["BackendHealth"]


class BackendHealth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one backend of a run did with the records handed to it (``summary.json`` →
    ``backends``). ``records`` = ``records_written`` + ``records_failed`` +
    ``records_lost`` once the backend is closed.

    ``backend`` is the backend's own name (its file, store or run); ``isolated`` whether
    it ran on a thread of its own (a plugin's) or was written by the reporter (the run's
    own files); ``records_written`` went into ``write()`` calls that returned,
    ``records_failed`` into calls that raised; ``records_lost`` never reached ``write()``
    (its queue was full, it was cut off, its set-up failed, or on a resume the run's
    history, which a checkpoint stands for, could not be read back for it) or, for the
    run's own files, are still unwritten after a disk fault; ``calls_failed`` counts
    every call that raised; ``slowest_call_seconds`` is its longest call (0.0 when not
    timed); ``cut_off`` says why it was cut off, ``setup_error`` why it could not be
    opened (both None when not)."""

    backend: NonEmpty
    isolated: bool
    records: Count = 0
    records_written: Count = 0
    records_failed: Count = 0
    records_lost: Count = 0
    calls_failed: Count = 0
    slowest_call_seconds: float = 0.0
    cut_off: str | None = None
    setup_error: str | None = None

    @property
    def healthy(self) -> bool:
        """Whether every record handed to it went into a ``write()`` that returned."""
        return self.records_written == self.records and not (self.cut_off or self.setup_error)
