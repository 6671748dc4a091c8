"""What every built-in observer shares: it runs under the run's
:class:`~twinkle.observers.ObserverConfig` (``config.phases``, ``throughput``,
``window`` ...), so each refuses, before the run starts, a configuration that does not
parse (``twinkle_check_config``): what a live run accepts is what its replay accepts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.hookspecs import hookimpl
from twinkle.observers._config import ObserverConfig

__all__ = ["BuiltinObserver"]


class BuiltinObserver:
    """Base of twinkle's own observers."""

    __slots__ = ()

    @hookimpl
    def twinkle_check_config(self, config: Mapping[str, Any]) -> None:
        ObserverConfig.parse(config)
