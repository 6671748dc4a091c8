"""The exception hierarchy: every error twinkle raises derives from :class:`TwinkleError`.

Messages say what is wrong, which argument/key/plugin holds the bad value (``{value!r}``)
and how to fix it. Callers match on the class, never on the message.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TwinkleError",
    "ConfigError",
    "InvalidArgumentError",
    "RecordError",
    "ReporterError",
    "WriteError",
    "ReplayError",
    "PluginError",
    "DriverError",
    "EngineStartError",
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


class RecordError(InvalidArgumentError):
    """A metric record or event cannot be built or serialised as strict JSON."""


class ReporterError(TwinkleError):
    """A reporter or backend cannot be opened or used (path, state)."""


class WriteError(ReporterError, OSError):
    """Writing to disk failed; records not yet written stay in memory and can be flushed.

    ``record``: when raised by ``MetricsReporter.report``, the record that call accepted
    (stamped with its ``seq`` and kept, like the others); otherwise None.
    """

    record: Any = None


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
