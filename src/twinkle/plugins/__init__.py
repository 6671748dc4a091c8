"""The observer runtime: the plugin manager (:func:`make_plugin_manager`) and the calls
of its hooks (:class:`HookCalls`, :class:`Dispatcher`). The contract itself is
:mod:`twinkle.hookspecs`.
"""

from twinkle.plugins._dispatch import (
    HOOK_FOR_EVENT,
    Dispatcher,
    hook_name,
    merge_summary,
)
from twinkle.plugins._hookcalls import (
    DEFAULT_SLOW_CALL_S,
    REPORTER_FAILURES,
    HookCalls,
    check_slow_call_s,
)
from twinkle.plugins._manager import (
    BUILTIN_DISTRIBUTION,
    DISABLE_AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    Monitor,
    ObserverManager,
    PluginInfo,
    PluginStatus,
    check_blocked,
    describe_plugins,
    loaded_plugins,
    make_plugin_manager,
)

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "DEFAULT_SLOW_CALL_S",
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "HOOK_FOR_EVENT",
    "REPORTER_FAILURES",
    "Dispatcher",
    "HookCalls",
    "Monitor",
    "ObserverManager",
    "PluginInfo",
    "PluginStatus",
    "check_blocked",
    "check_slow_call_s",
    "describe_plugins",
    "hook_name",
    "loaded_plugins",
    "make_plugin_manager",
    "merge_summary",
]
