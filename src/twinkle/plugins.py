"""Plugin manager factory and the dispatcher that bridges the signals to the hooks.

Built-in observers are registered through the same entry-point group as third-party ones
(``twinkle.observers``). Nothing here runs at import: managers are built by
:func:`make_plugin_manager`, one per run.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from twinkle import hookspecs
from twinkle.errors import PluginError, WriteError
from twinkle.events import (
    SIGNALS,
    Event,
    EventBus,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
)
from twinkle.hookspecs import OVERHEAD_SPAN
from twinkle.reporting import MetricRecord

__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "HOOK_FOR_EVENT",
    "OVERHEAD_SPAN",
    "BUILTIN_DISTRIBUTION",
    "REPORTER_FAILURES",
    "Dispatcher",
    "make_plugin_manager",
]

log = logging.getLogger("twinkle.plugins")

ENTRY_POINT_GROUP = "twinkle.observers"
DISABLE_AUTOLOAD_ENV = "TWINKLE_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_DISTRIBUTION = "twinkle"
#: key of :attr:`Dispatcher.failures` (``summary.json`` → ``observer_failures``) counting
#: records the run's reporter could not write at once (a disk fault; they are kept)
REPORTER_FAILURES = "twinkle.reporter"

HOOK_FOR_EVENT: dict[type[Event], str] = {
    RunStarted: "twinkle_run_started",
    IterationStarted: "twinkle_iteration_started",
    WeightsPublished: "twinkle_weights_published",
    Snapshot: "twinkle_snapshot",
    RunFinished: "twinkle_run_finished",
    SpanBatch: "twinkle_spans",
    MemoryReadings: "twinkle_memory",
    SamplesObserved: "twinkle_samples",
    OptimizerStep: "twinkle_optimizer_step",
    ScalarsObserved: "twinkle_scalars",
}


def _autoload_disabled_by_env() -> bool:
    value = os.environ.get(DISABLE_AUTOLOAD_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def _is_builtin(ep: EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and dist.name == BUILTIN_DISTRIBUTION


def _instantiate(ep: EntryPoint) -> object:
    try:
        target = ep.load()
    except Exception as exc:
        raise PluginError(
            f"observer plugin {ep.name!r} ({ep.value}) failed to import: {exc!r}; fix or "
            f"uninstall it, or block it with blocked=[{ep.name!r}] / "
            f"{DISABLE_AUTOLOAD_ENV}=1"
        ) from exc
    # Observers are stateful per run: a class (or factory) gives a fresh instance each time.
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__path__")):
        try:
            return target()
        except Exception as exc:
            raise PluginError(
                f"observer plugin {ep.name!r} ({ep.value}) could not be constructed: {exc!r}"
            ) from exc
    return target


def make_plugin_manager(
    *,
    autoload: bool | None = None,
    builtins: bool = True,
    blocked: Iterable[str] = (),
    plugins: Iterable[tuple[str, object]] = (),
) -> pluggy.PluginManager:
    """Build a plugin manager with the observers of group ``twinkle.observers``.

    :param autoload: load third-party entry points; ``None`` means yes unless the
        environment variable ``TWINKLE_DISABLE_PLUGIN_AUTOLOAD`` is set (read now, not at
        import). Built-in observers are loaded either way unless ``builtins`` is false.
    :param builtins: load twinkle's own observers (timing, memory, throughput, sinks).
    :param blocked: plugin (entry point) names never to register.
    :param plugins: extra ``(name, plugin)`` pairs to register directly.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in blocked:
        pm.set_blocked(name)
    if autoload is None:
        autoload = not _autoload_disabled_by_env()
    found_builtin = False
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        builtin = _is_builtin(ep)
        found_builtin |= builtin
        if (builtin and not builtins) or (not builtin and not autoload):
            continue
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        _register(pm, _instantiate(ep), ep.name)
    if builtins and not found_builtin:
        raise PluginError(
            "twinkle's built-in observers were not found in entry-point group "
            f"{ENTRY_POINT_GROUP!r}: twinkle is not installed as a distribution; install it "
            "(pip install -e .) rather than putting src/ on sys.path"
        )
    for name, plugin in plugins:
        if not pm.is_blocked(name):
            _register(pm, plugin, name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return pm


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} does not fit the hook contract: {exc}") from exc
    except ValueError as exc:
        raise PluginError(f"plugin {name!r} cannot be registered: {exc}") from exc
    for caller in pm.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                pm.unregister(plugin)
                raise PluginError(
                    f"plugin {name!r} declares {caller.name} as a wrapper; twinkle calls "
                    "every observer in isolation, so wrappers are not supported: drop "
                    "wrapper=True/hookwrapper=True"
                )


class Dispatcher:
    """Calls each observer's hook for every event, each in isolation, one event at a time.

    Events published concurrently from several threads, or from inside a hook, are queued
    and dispatched in order by whichever thread is already dispatching, so observers never
    run concurrently and never re-enter. A hook must therefore not *wait* for another
    thread that publishes: that thread waits for this dispatch to finish. The time spent
    is twinkle's own: the :class:`~twinkle.events.EventBus` that publishes records it
    (with the building of the event) as ``twinkle.observe`` spans.

    ``report`` stamps the records the observers return (the run's reporter) before they
    go to :func:`~twinkle.hookspecs.twinkle_record`. A hook result that is not a list of
    records, and a record the reporter refuses, count as that observer's failures; a
    disk fault the reporter reports (``WriteError``: the record is kept) counts under
    :data:`REPORTER_FAILURES` and never stops the run.
    """

    def __init__(
        self,
        pm: pluggy.PluginManager,
        *,
        report: Callable[[MetricRecord], MetricRecord] | None = None,
    ) -> None:
        self.pm = pm
        #: stamps the observers' records (the run's reporter); may be set after
        #: construction, once the plugins have provided the reporter's backends
        self.report = report
        self._pending: deque[Event] = deque()
        self._lock = threading.Lock()
        self._receivers: list[tuple[Any, Any]] = []
        #: failures per plugin name (logged as they happen)
        self.failures: Counter[str] = Counter()
        self.events_dispatched = 0
        self._owner: int | None = None
        self._plans: dict[str, list[tuple[str, Callable[..., Any], tuple[str, ...]]]] = {}

    # -- wiring -----------------------------------------------------------------------

    def connect(self, bus: EventBus) -> None:
        """Receive every event ``bus`` publishes."""
        for signal in SIGNALS.values():
            signal.connect(self._receive, sender=bus, weak=False)
            self._receivers.append((signal, bus))

    def disconnect(self) -> None:
        """Stop receiving events."""
        for signal, bus in self._receivers:
            signal.disconnect(self._receive, sender=bus)
        self._receivers.clear()

    def _receive(self, sender: object, *, event: Event) -> None:
        self.submit(event)

    # -- dispatching ------------------------------------------------------------------

    def submit(self, event: Event) -> None:
        """Queue ``event`` and dispatch everything queued, in order.

        From inside a hook (re-entrant publish) the event is only queued: the outer
        dispatch picks it up after the current event. Another thread waits for the
        dispatching thread, then dispatches whatever is still queued.
        """
        self._pending.append(event)
        if self._owner == threading.get_ident():
            return
        with self._lock:
            self._owner = threading.get_ident()
            try:
                while self._pending:
                    self._dispatch(self._pending.popleft())
            finally:
                self._owner = None

    def _dispatch(self, event: Event) -> None:
        self.events_dispatched += 1
        for name, result in self.call_named(HOOK_FOR_EVENT[type(event)], event=event):
            try:
                records = list(result)
            except TypeError:
                self._count(name, "returned %r, not a list of records", result)
                continue
            for record in records:
                stamped = self._stamp(name, record)
                if stamped is not None:
                    self.call("twinkle_record", record=stamped)
        self.call("twinkle_event", event=event)

    def _stamp(self, plugin: str, record: Any) -> MetricRecord | None:
        """The reporter's stamped record, or None when the observer's record is refused."""
        if self.report is None:
            return record if isinstance(record, MetricRecord) else None
        try:
            return self.report(record)
        except WriteError as exc:
            # A disk fault: the record was accepted and is kept in memory (the reporter
            # writes it once the fault is gone). Counted, never fatal to the run.
            self._count(REPORTER_FAILURES, "cannot write records: %s", exc)
            return exc.record if isinstance(exc.record, MetricRecord) else None
        except Exception as exc:  # the observer's record is bad (other run, not a record)
            self._count(plugin, "returned a record the reporter refused: %s", exc)
            return None

    def _count(self, name: str, message: str, *args: object) -> None:
        self.failures[name] += 1
        n = self.failures[name]
        if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th... so a lasting fault does not flood
            log.error(f"observer %r {message} (failure %d)", name, *args, n)

    def call(self, hook_name: str, **kwargs: Any) -> list[Any]:
        """Call ``hook_name`` on every observer in isolation; the non-None results.

        A raising observer is logged with its name, counted in :attr:`failures` and
        skipped; every other observer still runs.
        """
        return [result for _, result in self._calls(hook_name, kwargs)]

    def call_named(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Like :meth:`call`, with each result paired with its plugin's name."""
        return list(self._calls(hook_name, kwargs))

    def refresh(self) -> None:
        """Forget the cached hook implementations (after registering plugins late)."""
        self._plans.clear()

    def _plan(self, hook_name: str) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        # The implementations of a hook, in pluggy's call order, looked up once: the
        # plugin set is fixed for a run (call refresh() after registering late).
        plan = self._plans.get(hook_name)
        if plan is None:
            caller = getattr(self.pm.hook, hook_name)
            plan = [
                (impl.plugin_name, impl.function, tuple(impl.argnames))
                for impl in reversed(caller.get_hookimpls())
            ]
            self._plans[hook_name] = plan
        return plan

    def _calls(self, hook_name: str, kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        for name, function, argnames in self._plan(hook_name):
            try:
                result = function(*[kwargs[a] for a in argnames])
            except Exception:
                self.failures[name] += 1
                log.exception("observer %r failed in %s; skipped", name, hook_name)
                continue
            if result is not None:
                yield name, result


def merge_summary(parts: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge observers' summary parts; a key already taken is kept as ``plugin.key``."""
    merged: dict[str, Any] = {}
    for plugin, part in parts:
        for key, value in part.items():
            merged[f"{plugin}.{key}" if key in merged else key] = value
    return merged
