"""A run's record backends: twinkle's own first, then each plugin's behind a thread of
its own, the reporter that writes to them, and the plugins the run cannot go without."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pluggy

from twinkle.errors import InvalidArgumentError, PluginError
from twinkle.plugins import ObserverManager
from twinkle.reporting import Backend, IsolatedBackend, MetricsReporter

__all__ = ["make_reporter", "plugin_backends", "required_plugins_of", "wait_required"]


def plugin_backends(
    pm: ObserverManager, made: list[tuple[str, Backend]], timeout_s: float
) -> tuple[list[str], list[Backend]]:
    """The run's backends, named after their plugins: twinkle's own (the run's files,
    written by the reporter) first, then every plugin's behind a thread of its own
    (:class:`~twinkle.reporting.IsolatedBackend`, each call bounded by ``timeout_s``),
    which the others never wait for."""
    own = [pm.is_builtin(plugin) for plugin, _ in made]
    names: list[str] = []
    backends: list[Backend] = []
    for is_own in (True, False):
        for (plugin, backend), mine in zip(made, own, strict=True):
            if mine is not is_own:
                continue
            name = plugin if plugin not in names else f"{plugin}#{len(names)}"
            names.append(name)
            backends.append(
                backend if is_own else IsolatedBackend(backend, name=name, timeout_s=timeout_s)
            )
    return names, backends


def make_reporter(
    names: list[str], backends: list[Backend], run_id: str, background: bool
) -> MetricsReporter:
    """The run's reporter of ``backends``; when it cannot be made (its record file
    unreadable), the plugins' backends, already started, are given up on."""
    try:
        return MetricsReporter(backends, run_id=run_id, background=background, names=names)
    except BaseException as exc:
        for backend in backends:
            if isinstance(backend, IsolatedBackend):
                backend.cut_off(f"the run's start failed ({type(exc).__name__})")
        raise


def wait_required(backends: list[Backend], required: frozenset[str], timeout_s: float) -> None:
    """A required plugin's backends are open before the run goes on (else the start
    fails, naming why)."""
    # Side by side: the start waits at most one bound, however many are required.
    deadline = time.monotonic() + timeout_s
    for backend in backends:
        if not isinstance(backend, IsolatedBackend):
            continue  # (the run's own)
        plugin = backend.name.split("#")[0]
        if plugin not in required:
            continue
        why = backend.wait_open(max(0.0, deadline - time.monotonic()))
        if why is not None:
            raise PluginError(
                f"required plugin {backend.name!r} could not open its backend: {why}; "
                f"fix what it says, or stop requiring it (required_plugins, "
                f"--require-plugin {plugin}) to run without it"
            )


def required_plugins_of(names: Iterable[str], pm: pluggy.PluginManager) -> frozenset[str]:
    """The required plugin names, each checked to be a plugin of the run."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise InvalidArgumentError(
            f"required_plugins must be a list of plugin names, got {names!r:.100}"
            + (f"; pass [{names!r}]" if isinstance(names, str) else "")
        )
    required = frozenset(names)
    missing = sorted(n for n in required if not isinstance(n, str) or pm.get_plugin(n) is None)
    if missing:
        loaded = sorted(name for name, _ in pm.list_name_plugin())
        raise PluginError(
            f"required plugin(s) {', '.join(map(repr, missing))} not loaded by this run "
            f"(it loads {', '.join(loaded) or 'none'}): install them (twinkle plugins lists "
            "what is installed), unblock them, or stop requiring them"
        )
    return required
