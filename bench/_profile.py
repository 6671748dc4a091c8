"""Where a run's time goes by observer: cProfile's cumulative time of each plugin's hook
functions over the total profiled time (shared by the demo's and the replay's profiles).

cProfile charges every call the same, so call-heavy code reads a bit high; the shares are
scaled by an unprofiled time by their callers. What no hook function covers is the bus,
the dispatcher, validation, draining and the reporter's writing.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

CodeKey = tuple[str, int, str]  # (file, first line, function name), as cProfile keys code


def hook_functions(pm: Any) -> dict[CodeKey, str]:
    """(file, first line, name) of every hook implementation ``pm`` holds -> its plugin."""
    found: dict[CodeKey, str] = {}
    for caller in vars(pm.hook).values():
        get_hookimpls = getattr(caller, "get_hookimpls", None)
        if get_hookimpls is None:
            continue
        for impl in get_hookimpls():
            code = getattr(impl.function, "__code__", None)
            if code is not None:
                found[(code.co_filename, code.co_firstlineno, code.co_name)] = impl.plugin_name
    return found


def plugin_shares(
    profiler: cProfile.Profile, hooks: dict[CodeKey, str]
) -> tuple[dict[str, float], dict[Any, Any]]:
    """Each plugin's share of the profiled time (its hooks' cumulative time over the
    total own time), largest first, and the raw stats."""
    stats: dict[Any, Any] = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values()) or 1.0
    shares: dict[str, float] = {}
    for key, (_, _, _, cumulative, _) in stats.items():
        plugin = hooks.get(key)
        if plugin is not None:
            shares[plugin] = shares.get(plugin, 0.0) + cumulative / total
    return dict(sorted(shares.items(), key=lambda kv: -kv[1])), stats
