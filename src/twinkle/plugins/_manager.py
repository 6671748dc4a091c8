"""The observers' plugin manager: built by :func:`make_plugin_manager`, frozen while a
run uses it.

Built-in observers are registered through the same entry-point group as third-party ones
(``twinkle.observers``). Nothing here runs at import.
"""

from __future__ import annotations

import enum
import functools
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import Distribution, EntryPoint, entry_points
from typing import Any

import pluggy

from twinkle import hookspecs
from twinkle.errors import InvalidArgumentError, PluginError

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "Monitor",
    "ObserverManager",
    "check_blocked",
    "make_plugin_manager",
]

ENTRY_POINT_GROUP = "twinkle.observers"
DISABLE_AUTOLOAD_ENV = "TWINKLE_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_DISTRIBUTION = "twinkle"

#: ``(before, after)`` as :meth:`pluggy.PluginManager.add_hookcall_monitoring` takes them
Monitor = tuple[Callable[..., object], Callable[..., object]]


class ObserverManager(pluggy.PluginManager):
    """A pluggy manager for twinkle's observers that knows when a run uses it.

    Twinkle's dispatcher calls every observer in isolation (one raising observer never
    stops the others), so it plans each hook's implementations once, when the run
    starts. While a run uses the manager its plugin set is therefore fixed: registering
    or unregistering raises :class:`~twinkle.errors.PluginError` saying so (never a
    silent no-op). Hook-call monitoring (:meth:`add_hookcall_monitoring`, and
    :meth:`enable_tracing`, which uses it) sees the dispatcher's calls as well as direct
    ``pm.hook`` calls.
    """

    def __init__(self, project_name: str = hookspecs.PROJECT_NAME) -> None:
        super().__init__(project_name)
        #: the run using this manager (None: free)
        self.in_use_by: str | None = None
        self._monitors: list[Monitor] = []
        #: whether any hook-call monitor is installed (read on every dispatch)
        self.monitored = False
        self._builtin: set[str] = set()

    @property
    def monitors(self) -> tuple[Monitor, ...]:
        """The hook-call monitors, oldest first."""
        return tuple(self._monitors)

    def acquire(self, run_id: str) -> None:
        """Fix the plugin set for run ``run_id`` (one run at a time)."""
        if self.in_use_by is not None:
            raise PluginError(
                f"this plugin manager is in use by run {self.in_use_by!r}; observers keep "
                "per-run state, so give each run its own manager (make_plugin_manager())"
            )
        self.in_use_by = run_id

    def release(self) -> None:
        """The run is over: plugins may be registered again."""
        self.in_use_by = None

    def _check_free(self, doing: str, name: object) -> None:
        if self.in_use_by is not None:
            raise PluginError(
                f"cannot {doing} plugin {name!r}: run {self.in_use_by!r} is running and its "
                "observers are fixed when it starts; register plugins before start() (or "
                "pass plugins=[(name, plugin)] to the run)"
            )

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (refused while a run uses the manager, and for wrappers)."""
        self._check_free("register", name or type(plugin).__name__)
        registered = super().register(plugin, name)
        for caller in self.get_hookcallers(plugin) or ():
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                    super().unregister(plugin)
                    raise PluginError(
                        f"plugin {name or impl.plugin_name!r} declares {caller.name} as a "
                        "wrapper; twinkle calls every observer in isolation, so wrappers are "
                        "not supported: drop wrapper=True/hookwrapper=True"
                    )
        return registered

    def register_builtin(self, plugin: object, name: str) -> None:
        """Register ``plugin`` as one of twinkle's own observers (an entry point of the
        ``twinkle`` distribution): :meth:`is_builtin` says so from now on."""
        if self.register(plugin, name) is not None:  # (None: the name is blocked)
            self._builtin.add(name)

    def is_builtin(self, name: str) -> bool:
        """Whether plugin ``name`` is one of twinkle's own observers, registered from
        twinkle's distribution: its outputs are the run's own, written by the run and
        essential to it. A plugin passed in by name or found under another
        distribution is not, whatever its class."""
        return name in self._builtin and self.get_plugin(name) is not None

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._check_free("unregister", name or type(plugin).__name__)
        removed = super().unregister(plugin, name)
        self._builtin &= {kept for kept, _ in self.list_name_plugin()}
        return removed

    def add_hookcall_monitoring(
        self, before: Callable[..., object], after: Callable[..., object]
    ) -> Callable[[], None]:
        undo_direct = super().add_hookcall_monitoring(before, after)  # type: ignore[arg-type]
        monitor = (before, after)
        self._monitors.append(monitor)
        self.monitored = True

        def undo() -> None:
            undo_direct()
            if monitor in self._monitors:
                self._monitors.remove(monitor)
            self.monitored = bool(self._monitors)

        return undo


def _autoload_disabled_by_env() -> bool:
    value = os.environ.get(DISABLE_AUTOLOAD_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no")


#: each distribution's name, read once per distribution object: reading it parses the
#: distribution's METADATA (~0.5 ms), and the entry points one ``entry_points()`` call
#: returns share their distribution's object (the cache lets go of it with them)
_DIST_NAMES: weakref.WeakKeyDictionary[Distribution, str] = weakref.WeakKeyDictionary()


def _is_builtin(ep: EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return False
    name = _DIST_NAMES.get(dist)
    if name is None:
        name = _DIST_NAMES[dist] = dist.name
    return name == BUILTIN_DISTRIBUTION


def _origin(ep: EntryPoint) -> str:
    """``'name' (distribution 'dist 1.0', module:attr)`` for messages."""
    dist = getattr(ep, "dist", None)
    where = "" if dist is None else f"distribution '{dist.name} {dist.version}', "
    return f"{ep.name!r} ({where}{ep.value})"


def _failed(ep: EntryPoint, doing: str, exc: BaseException) -> PluginError:
    if isinstance(exc, SystemExit):
        why = f"called sys.exit({exc.code!r})"
    else:
        why = f"raised {type(exc).__qualname__}: {exc}"
    return PluginError(
        f"observer plugin {_origin(ep)} {why} while {doing}; fix or uninstall it, or block "
        f"it: --block {ep.name} (blocked=[{ep.name!r}]) or {DISABLE_AUTOLOAD_ENV}=1"
    )


def _instantiate(ep: EntryPoint) -> object:
    # A plugin's import runs foreign code: sys.exit() there must not end the caller's
    # process (or the twinkle command) without saying which plugin did it.
    try:
        target = ep.load()
    except (Exception, SystemExit) as exc:
        raise _failed(ep, "being imported", exc) from exc
    # Observers are stateful per run: a class (or factory) gives a fresh instance each time.
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__path__")):
        try:
            return target()
        except (Exception, SystemExit) as exc:
            raise _failed(ep, "being constructed", exc) from exc
    return target


def _check_names(blocked: object, plugins: object) -> tuple[list[str], list[tuple[str, object]]]:
    """``blocked`` and ``plugins`` as lists, or the mistake named with its fix."""
    if isinstance(blocked, str | bytes) or not isinstance(blocked, Iterable):
        raise InvalidArgumentError(
            f"blocked must be an iterable of plugin names, got {blocked!r}: pass "
            f"blocked=[{blocked!r}]"
            if isinstance(blocked, str)
            else f"blocked must be an iterable of plugin names, got {blocked!r}"
        )
    names = list(blocked)
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgumentError(
                f"blocked must hold plugin names (str), got {name!r} in {names!r}"
            )
    if isinstance(plugins, str | bytes | Mapping) or not isinstance(plugins, Iterable):
        raise InvalidArgumentError(
            f"plugins must be an iterable of (name, plugin) pairs, got {plugins!r:.200}: pass "
            "plugins=[('my_observer', MyObserver())]"
        )
    pairs: list[tuple[str, object]] = []
    for i, pair in enumerate(plugins):
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise InvalidArgumentError(
                f"plugins[{i}] = {pair!r:.200} is not a (name, plugin) pair: pass "
                "plugins=[('my_observer', MyObserver())]"
            )
        pairs.append((pair[0], pair[1]))
    return names, pairs


def _check_known(blocked: list[str], known: set[str]) -> None:
    unknown = [name for name in blocked if name not in known]
    if unknown:
        raise InvalidArgumentError(
            f"blocked (--block) names no plugin: {', '.join(map(repr, unknown))}; check the "
            f"spelling: the known plugins are {', '.join(map(repr, sorted(known)))}"
        )


def check_blocked(blocked: Iterable[str], plugins: Iterable[tuple[str, object]] = ()) -> None:
    """Refuse, as :func:`make_plugin_manager` would, a ``blocked`` that is not a list of
    names or names no plugin of the entry-point group (nor of ``plugins``), without
    importing any plugin: a command checks its ``--block`` options before it starts."""
    names, pairs = _check_names(blocked, plugins)
    eps = entry_points(group=ENTRY_POINT_GROUP)
    _check_known(names, {ep.name for ep in eps} | {name for name, _ in pairs})


def _check_shadowing(eps: list[EntryPoint]) -> None:
    """No third-party entry point may take a built-in observer's name, or another
    distribution's: which one would run would depend on the order of discovery."""
    owner: dict[str, EntryPoint] = {}
    for ep in sorted(eps, key=lambda e: not _is_builtin(e)):  # built-ins claim first
        first = owner.setdefault(ep.name, ep)
        if first is ep:
            continue
        kind = "twinkle's built-in observer" if _is_builtin(first) else "observer plugin"
        raise PluginError(
            f"observer plugin {_origin(ep)} has the name of {kind} {_origin(first)} in "
            f"entry-point group {ENTRY_POINT_GROUP!r}; plugin names must be unique: rename "
            f"the entry point, uninstall one of them, or block the name (--block {ep.name})"
        )


def make_plugin_manager(
    *,
    autoload: bool | None = None,
    builtins: bool = True,
    blocked: Iterable[str] = (),
    plugins: Iterable[tuple[str, object]] = (),
) -> ObserverManager:
    """Build a plugin manager with the observers of group ``twinkle.observers``.

    :param autoload: load third-party entry points; ``None`` means yes unless the
        environment variable ``TWINKLE_DISABLE_PLUGIN_AUTOLOAD`` is set (read now, not at
        import). Built-in observers are loaded either way unless ``builtins`` is false.
    :param builtins: load twinkle's own observers (timing, memory, throughput, sinks).
    :param blocked: plugin (entry point) names never to register; each must name an
        entry point of the group or one of ``plugins`` (a typo is an
        :class:`~twinkle.errors.InvalidArgumentError` listing the known names).
    :param plugins: extra ``(name, plugin)`` pairs to register directly.

    A third-party entry point with a built-in observer's name (or another distribution's)
    is a :class:`~twinkle.errors.PluginError` naming both, unless the name is blocked; so
    is a plugin that raises or calls ``sys.exit`` while it is imported or constructed
    (named by its entry point and distribution).
    """
    names, pairs = _check_names(blocked, plugins)
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    _check_known(names, {ep.name for ep in eps} | {name for name, _ in pairs})
    pm = ObserverManager()
    pm.add_hookspecs(hookspecs)
    for name in names:
        pm.set_blocked(name)
    if autoload is None:
        autoload = not _autoload_disabled_by_env()
    if autoload:
        _check_shadowing([ep for ep in eps if not pm.is_blocked(ep.name)])
    found_builtin = False
    for ep in eps:
        builtin = _is_builtin(ep)
        found_builtin |= builtin
        if (builtin and not builtins) or (not builtin and not autoload):
            continue
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        _register(pm, _instantiate(ep), ep.name, builtin=builtin)
    if builtins and not found_builtin:
        raise PluginError(
            "twinkle's built-in observers were not found in entry-point group "
            f"{ENTRY_POINT_GROUP!r}: twinkle is not installed as a distribution; install it "
            "(pip install -e .) rather than putting src/ on sys.path"
        )
    for name, plugin in pairs:
        if not pm.is_blocked(name):
            _register(pm, plugin, name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return pm


class PluginStatus(enum.Enum):
    """What a run would do with an installed observer plugin."""

    LOADS = "loads"
    BLOCKED = "blocked"
    AUTOLOAD_OFF = "not loaded: autoload is off"
    FAILS = "fails"


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One entry point of group ``twinkle.observers``, as :func:`describe_plugins` found
    it: its ``name``, the ``distribution`` providing it (``"name version"``), its
    ``value`` (``module:attr``), whether it is one of twinkle's own, what a run would do
    with it, and the ``error`` that makes it fail."""

    name: str
    distribution: str | None
    value: str
    builtin: bool
    status: PluginStatus
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "value": self.value,
            "builtin": self.builtin,
            "status": self.status.value,
            "error": self.error,
        }


def describe_plugins(
    *, autoload: bool | None = None, blocked: Iterable[str] = ()
) -> list[PluginInfo]:
    """Every installed observer plugin and what a run with these options would do with
    it: each one that would load is imported, built and checked against the hook
    contract on its own (a failing one is described, not raised)."""
    names, _ = _check_names(blocked, ())
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    _check_known(names, {ep.name for ep in eps})
    if autoload is None:
        autoload = not _autoload_disabled_by_env()
    shadowing = _shadowed([ep for ep in eps if ep.name not in names]) if autoload else {}
    out: list[PluginInfo] = []
    for ep in eps:
        builtin = _is_builtin(ep)
        dist = getattr(ep, "dist", None)
        described = functools.partial(
            PluginInfo,
            ep.name,
            None if dist is None else f"{dist.name} {dist.version}",
            ep.value,
            builtin,
        )
        if ep.name in names:
            out.append(described(PluginStatus.BLOCKED))
        elif not builtin and not autoload:
            out.append(described(PluginStatus.AUTOLOAD_OFF))
        elif ep.name in shadowing:
            out.append(described(PluginStatus.FAILS, shadowing[ep.name]))
        else:
            error = _check_alone(ep)
            status = PluginStatus.LOADS if error is None else PluginStatus.FAILS
            out.append(described(status, error))
    return out


def _shadowed(eps: list[EntryPoint]) -> dict[str, str]:
    """The names two entry points share (a run that autoloads them refuses to start),
    with the run's error."""
    out: dict[str, str] = {}
    for name in {ep.name for ep in eps}:
        same = [ep for ep in eps if ep.name == name]
        if len(same) > 1:
            try:
                _check_shadowing(same)
            except PluginError as exc:
                out[name] = str(exc)
    return out


def _check_alone(ep: EntryPoint) -> str | None:
    """What keeps ``ep`` from loading into a run (imported, built and registered into a
    manager of its own), or None."""
    scratch = ObserverManager()
    scratch.add_hookspecs(hookspecs)
    try:
        _register(scratch, _instantiate(ep), ep.name)
    except PluginError as exc:
        return str(exc)
    try:
        scratch.check_pending()
    except pluggy.PluginValidationError as exc:
        return f"plugin {ep.name!r} implements an unknown hook: {exc}"
    return None


def loaded_plugins(pm: pluggy.PluginManager) -> tuple[str, ...]:
    """The names of the observer plugins ``pm`` holds, sorted (blocked names are not)."""
    return tuple(sorted(name for name, plugin in pm.list_name_plugin() if plugin is not None))


def _register(pm: ObserverManager, plugin: object, name: str, *, builtin: bool = False) -> None:
    try:
        if builtin:
            pm.register_builtin(plugin, name)
        else:
            pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} does not fit the hook contract: {exc}") from exc
    except ValueError as exc:
        raise PluginError(f"plugin {name!r} cannot be registered: {exc}") from exc
