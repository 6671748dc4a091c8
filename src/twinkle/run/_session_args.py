"""The checks of :class:`~twinkle.run.RunSession`'s arguments, made when it is built:
a wrong option must not cost a run."""

from __future__ import annotations

import os
from collections.abc import Mapping

from twinkle.checks import caller_source
from twinkle.errors import InvalidArgumentError

__all__ = ["check_arguments"]


def check_arguments(
    *,
    resume: object,
    out_dir: object,
    clock: object,
    wall_clock: object,
    config: object,
    autoload: object,
    source: object,
    **flags: object,
) -> None:
    """Refuse a :class:`RunSession` argument of the wrong kind, naming it (a switch
    that is not True or False among them: a truthy ``'no'`` would turn it on)."""
    if resume is not None and not isinstance(resume, bool):
        raise InvalidArgumentError(
            f"resume must be True, False or None (continue only a run that did not "
            f"finish ok), got {resume!r:.100}"
        )
    if out_dir is not None and not isinstance(out_dir, str | os.PathLike):
        raise InvalidArgumentError(
            f"out_dir must be a directory path (str or os.PathLike) or None (no files), "
            f"got {out_dir!r:.100}"
        )
    for name, fn in (("clock", clock), ("wall_clock", wall_clock)):
        if not callable(fn):
            raise InvalidArgumentError(
                f"{name} must be a zero-argument callable returning int nanoseconds, "
                f"got {fn!r:.100}"
            )
    if autoload is not None and type(autoload) is not bool:
        raise InvalidArgumentError(
            f"autoload must be True, False or None (the environment decides), got {autoload!r:.100}"
        )
    for name, flag in flags.items():
        if type(flag) is not bool:
            raise InvalidArgumentError(f"{name} must be True or False, got {flag!r:.100}")
    if not isinstance(source, str) or not source:
        raise InvalidArgumentError(
            f"source must be a non-empty str (the name of this process's spans), got "
            f"{source!r:.100}"
        )
    caller_source(source, "source")
    if config is not None and not isinstance(config, Mapping):
        raise InvalidArgumentError(
            f"config must be a mapping of the observers' definitions, got {config!r:.200}"
        )
