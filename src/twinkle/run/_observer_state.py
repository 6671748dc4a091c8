"""The observers' state a checkpoint holds: what each one is taken as and given back
(twinkle's own by their variables, the sinks what they hold back from their files, a
plugin what its ``twinkle_checkpoint_state`` returns), and which runs a checkpoint can
hold at all (:func:`observers_of`). :mod:`twinkle.run._checkpoint` writes and reads it."""

from __future__ import annotations

import hashlib
import inspect
import io
import pickle
import sys
from collections.abc import Callable, Collection
from functools import cache
from pathlib import Path
from typing import Any, Final

from twinkle.errors import PluginError
from twinkle.hookspecs import RunContext
from twinkle.observers import (
    TIMELINE,
    EventLogSink,
    RawRecordsSink,
    TimelineObserver,
    TraceSink,
    WebUISink,
)
from twinkle.run._state_pickle import read_state

__all__ = ["observers_of", "plugins_without_state", "restore_observers", "snapshot_observers"]


def observers_of(pm: Any, *, leaving: Collection[str] = ()) -> list[str] | None:
    """The run's observers, sorted by name, when a checkpoint can hold them all, else
    None: twinkle's own by name, and each plugin that keeps its state through the
    ``twinkle_checkpoint_state`` hook by name and code (:func:`_plugin_code`: a plugin
    changed between the segments makes the checkpoint not fit); a plugin without that
    hook rebuilds its outputs from every event it sees, so the whole log is fed again.
    The names in ``leaving`` (observers the run left out: their state saw no event
    since) are not listed, so that the checkpoint does not fit a run that has them."""
    # (a blocked plugin is listed as None: not the run's)
    named = sorted(
        (item for item in pm.list_name_plugin() if item[1] is not None), key=lambda item: item[0]
    )
    if plugins_without_state(pm):
        return None
    return [
        name if pm.is_builtin(name) else f"{name} ({_plugin_code(plugin)})"
        for name, plugin in named
        if name not in leaving
    ]


def plugins_without_state(pm: Any) -> list[str]:
    """The run's plugins, not twinkle's own, that implement no
    ``twinkle_checkpoint_state`` (a checkpoint cannot hold what they saw), sorted."""
    keeping = _state_hooks(pm, "twinkle_checkpoint_state")
    return sorted(
        name
        for name, plugin in pm.list_name_plugin()
        if plugin is not None and not pm.is_builtin(name) and name not in keeping
    )


def _state_hooks(pm: Any, hook: str, calls: Any = None) -> dict[str, Callable[..., Any]]:
    """Each plugin's implementation of ``hook`` (``twinkle_checkpoint_state`` or
    ``twinkle_restore_state``), by plugin name; as the run's ``calls``
    (:class:`~twinkle.plugins.HookCalls`) make it when given: a plugin's on its own
    thread, within its time, as its other hooks."""
    if calls is not None:
        return {name: function for name, function, _ in calls.plan(hook)}
    return {impl.plugin_name: impl.function for impl in getattr(pm.hook, hook).get_hookimpls()}


def _plugin_code(plugin: object) -> str:
    """A plugin's class as ``module.qualname`` and a digest of its module's source (a
    plugin that is a module: its name and a digest of its source)."""
    if inspect.ismodule(plugin):
        return _code_of(plugin.__name__, "")
    kind = type(plugin)
    return _code_of(kind.__module__, kind.__qualname__)


@cache
def _code_of(module: str, qualname: str) -> str:
    name = f"{module}.{qualname}" if qualname else module
    try:
        source = Path(inspect.getfile(sys.modules[module])).read_bytes()
    except (KeyError, OSError, TypeError):  # (a class made in code, without a file)
        return name
    return f"{name} {hashlib.sha256(source).hexdigest()[:16]}"


#: the sinks whose state is what they hold back from their files
_SINKS = (RawRecordsSink, WebUISink, TraceSink)
#: the key under which a plugin's own state is kept (a plugin's is never a dict of vars)
_PLUGIN_STATE: Final = "twinkle_checkpoint_state"


def snapshot_observers(
    pm: Any, *, leaving: Collection[str] = (), calls: Any = None
) -> dict[str, Any]:
    """Each observer's state (the sinks': what they hold back from their files; the
    event log's none: its file is all of it; a plugin's: what its
    ``twinkle_checkpoint_state`` returns; a plugin without that hook has none here,
    and :func:`observers_of` says the checkpoint does not fit such a run). The plugins
    in ``leaving`` (left out of the run: none of their hooks is called again) have none
    either: the checkpoint does not list them. ``calls``: the run's hook calls, which
    call the plugins' hooks (:func:`_state_hooks`)."""
    states: dict[str, Any] = {}
    keeping = _state_hooks(pm, "twinkle_checkpoint_state", calls)
    restoring = _state_hooks(pm, "twinkle_restore_state", calls)
    for name, plugin in pm.list_name_plugin():
        if plugin is None or name in leaving:  # blocked, or left out
            continue
        if not pm.is_builtin(name):
            if name in keeping:
                states[name] = {
                    _PLUGIN_STATE: _kept(name, _call_kept(name, keeping[name]), name in restoring)
                }
        elif isinstance(plugin, _SINKS):
            states[name] = plugin.checkpoint_state()
        elif not isinstance(plugin, EventLogSink):
            states[name] = dict(vars(plugin))
    return states


def _call_kept(name: str, hook: Callable[[], object]) -> object:
    """What plugin ``name``'s ``twinkle_checkpoint_state`` returns; what it raises, as
    a :class:`~twinkle.errors.PluginError` naming it (no checkpoint is taken)."""
    try:
        return hook()
    except Exception as exc:  # (a plugin's fault is the plugin's)
        raise PluginError(
            f"plugin {name!r}: its twinkle_checkpoint_state raised {type(exc).__name__}: {exc}"
        ) from exc


def _kept(name: str, state: object, restorable: bool) -> object:
    """The state plugin ``name``'s ``twinkle_checkpoint_state`` returned, when a
    checkpoint can give it back (read back as a resume reads it: plain Python values and
    twinkle's only), else a :class:`~twinkle.errors.PluginError` naming the plugin and
    the fix (this checkpoint is not taken: a resume starts from an earlier one, or
    feeds the whole log)."""
    if state is None:
        return None
    why = None
    if not restorable:
        why = "it implements no twinkle_restore_state to take it back: add one"
    else:
        try:
            read_state(io.BytesIO(pickle.dumps(state, pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:  # (whatever pickling raises)
            why = (
                f"a checkpoint cannot hold it ({type(exc).__name__}: {exc}): return plain "
                "Python values (dict, list, str, int, float...), e.g. dataclasses.asdict()"
            )
    if why is None:
        return state
    raise PluginError(f"plugin {name!r} returned a state from twinkle_checkpoint_state, and {why}")


def restore_observers(
    pm: Any,
    states: dict[str, Any],
    context: RunContext,
    *,
    leaving: Collection[str] = (),
    calls: Any = None,
) -> dict[str, Exception]:
    """Give each configured observer its state back (the trace its file's first part,
    a plugin what it kept; not one in ``leaving``, left out of the run at its
    configure). The run's timeline (in its stash, shared by the observers) is the one
    configure made, given the checkpoint's state: every observer's reference to the
    checkpoint's is turned into one to it. Returns the plugins whose
    ``twinkle_restore_state`` raised, with what it raised (the run leaves them out)."""
    live = context.stash[TIMELINE]
    saved = next(
        (state["timeline"] for name, state in states.items()
         if isinstance(pm.get_plugin(name), TimelineObserver)),
        None,
    )  # fmt: skip
    if saved is not None:
        vars(live).update(vars(saved))
    restoring = _state_hooks(pm, "twinkle_restore_state", calls)
    failed: dict[str, Exception] = {}
    for name, saved_state in states.items():
        plugin = pm.get_plugin(name)
        if _PLUGIN_STATE in saved_state:
            kept = saved_state[_PLUGIN_STATE]
            if kept is not None and name in restoring and name not in leaving:
                try:
                    restoring[name](kept)
                except Exception as exc:  # (a plugin's fault is the plugin's)
                    failed[name] = exc
            continue
        state = {k: live if saved is not None and v is saved else v for k, v in saved_state.items()}
        if isinstance(plugin, _SINKS):
            plugin.restore(state)
        else:
            vars(plugin).update(state)
    return failed
