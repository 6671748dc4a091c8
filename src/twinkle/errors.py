"""The exception hierarchy: every error twinkle raises derives from :class:`TwinkleError`.

Messages say what is wrong, which argument/key/plugin holds the bad value (``{value!r}``)
and how to fix it. Callers match on the class, never on the message.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "TwinkleError",
    "ConfigError",
    "ResumeConfigError",
    "InvalidArgumentError",
    "RecordError",
    "ReporterError",
    "WriteError",
    "ReplayError",
    "PluginError",
    "DriverError",
    "EngineStartError",
    "FinishedRunError",
    "WorkerError",
    "LockTimeoutError",
    "RunDirInUseError",
]


class TwinkleError(Exception):
    """Root of every error raised by twinkle."""


class InvalidArgumentError(TwinkleError, ValueError):
    """A public function got an argument it cannot use (names the argument and the fix)."""


class ConfigError(TwinkleError, ValueError):
    """A configuration value (observer set-up, CLI option, environment) is unusable."""


class ResumeConfigError(ConfigError):
    """A run cannot resume with the configuration given: the keys in ``keys`` differ
    between ``logged`` (the run's, as its log carries it) and ``given`` (the resuming
    session's). A resume may change only ``total_steps`` and the caller's ``x_`` keys.

    The message is ``problem`` then ``fix``. A caller that builds the configuration for
    its user (``TwinkleCallback``, ``twinkle demo``) re-raises the error with the fix in
    its user's terms: :meth:`with_fix`.
    """

    def __init__(
        self,
        problem: str,
        fix: str,
        *,
        run_id: str,
        keys: tuple[str, ...],
        logged: dict[str, Any],
        given: dict[str, Any],
    ) -> None:
        super().__init__(f"{problem}: {fix}")
        self.problem = problem
        self.fix = fix
        self.run_id = run_id
        self.keys = keys
        self.logged = logged
        self.given = given

    def with_fix(self, fix: str) -> ResumeConfigError:
        """The same error, saying ``fix`` as what to do about it."""
        return ResumeConfigError(self.problem, fix, **self._details())

    def _details(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "keys": self.keys,
            "logged": self.logged,
            "given": self.given,
        }

    def __reduce__(self) -> tuple[Any, ...]:  # (picklable: its arguments are not .args)
        return (functools.partial(ResumeConfigError, **self._details()), (self.problem, self.fix))


class FinishedRunError(ConfigError):
    """A session was asked to continue a run whose last segment finished ``ok``, without
    saying so (``resume=True``): running the same command twice must not silently make
    one longer run. The message is ``problem`` then ``fix``; a caller that starts
    sessions for its user (``TwinkleCallback``, ``twinkle demo``) re-raises it with the
    fix in its user's terms (:meth:`with_fix`)."""

    def __init__(self, problem: str, fix: str, *, run_id: str) -> None:
        super().__init__(f"{problem}: {fix}")
        self.problem = problem
        self.fix = fix
        self.run_id = run_id

    def with_fix(self, fix: str) -> FinishedRunError:
        """The same error, saying ``fix`` as what to do about it."""
        return FinishedRunError(self.problem, fix, run_id=self.run_id)

    def __reduce__(self) -> tuple[Any, ...]:  # (picklable: its arguments are not .args)
        return (functools.partial(FinishedRunError, run_id=self.run_id), (self.problem, self.fix))


class RecordError(InvalidArgumentError):
    """A metric record or event cannot be built or serialised as strict JSON."""


class ReporterError(TwinkleError):
    """A reporter or backend cannot be opened or used (path, state)."""


class WriteError(ReporterError, OSError):
    """Writing to disk failed; records not yet written stay in memory and can be flushed.

    ``record``: when raised by ``MetricsReporter.report``, the record that call accepted
    (stamped with its ``seq`` and kept, like the others); otherwise None. ``lost_lines``:
    when raised by a writer's close, the lines it never wrote (0: they were written, the
    sync failed).
    """

    record: Any = None
    lost_lines: int = 0


class ReplayError(TwinkleError):
    """An event log cannot be replayed (names the file, line number and the reason)."""


class PluginError(TwinkleError):
    """A plugin cannot be loaded or does not fit the hook contract."""


class DriverError(TwinkleError):
    """The streaming driver was misused or one of its workers failed (cause chained)."""


class WorkerError(TwinkleError):
    """A remote worker (a Ray actor, a ``torch.distributed`` rank) raised or died (names
    the worker; its own error chained)."""


class EngineStartError(TwinkleError):
    """An inference engine failed to start (names the engine; cause chained)."""


class LockTimeoutError(TwinkleError, TimeoutError):
    """A file lock could not be acquired in time (names the lock file and the holder)."""


class RunDirInUseError(TwinkleError):
    """A run directory is written by another live process (names its pid and host)."""
