"""Calling the observers' hooks, each implementation in isolation.

:class:`HookCalls` plans each hook's implementations once, from a manager whose plugin
set is fixed for the run (:class:`~twinkle.plugins.ObserverManager`), so it is complete
when built, then calls them: an observer that raises is logged, counted and skipped, and
one that is slow is counted and logged. :class:`~twinkle.plugins.Dispatcher` calls them
with the events of a run.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final

import pluggy

from twinkle.checks import check_seconds
from twinkle.errors import InvalidArgumentError, PluginError, TwinkleError, WriteError
from twinkle.plugins._isolation import HookRunner, HookTimeout
from twinkle.plugins._manager import ObserverManager

__all__ = [
    "DEFAULT_SLOW_CALL_S",
    "REPORTER_FAILURES",
    "HookCalls",
    "check_slow_call_s",
]

log = logging.getLogger("twinkle.plugins")

#: default of ``HookCalls(slow_call_s=...)``: an observer call taking longer is slow
DEFAULT_SLOW_CALL_S: Final = 1.0


def check_slow_call_s(slow_call_s: object) -> float | None:
    """``slow_call_s`` (as a float) if it is a finite number of seconds >= 0 or None
    (observer calls not timed), else an :class:`InvalidArgumentError` saying so (the
    session checks its option when it is made, not when the run starts)."""
    return check_seconds(
        "slow_call_s",
        slow_call_s,
        none_ok=True,
        means="the time an observer call may take before it is counted slow",
        none_means="to not time observer calls",
    )


#: the hooks of a plugin's set-up: one the run requires failing them fails its start
_SET_UP: Final = frozenset(("twinkle_configure", "twinkle_make_backends"))

#: key of :attr:`HookCalls.failures` (``summary.json`` → ``observer_failures``) counting
#: records the run's reporter could not write at once (a disk fault; they are kept)
REPORTER_FAILURES = "twinkle.reporter"


class _Never(Exception):
    """Raised by nothing: the default of the failures a hook call lets through."""


# (plugin name, function, argument names) of one hook implementation
_Impl = tuple[str, Callable[..., Any], tuple[str, ...]]


class HookCalls:
    """Calls hooks on every observer of ``pm``, each in isolation.

    The implementations of every hook are looked up once, here, in pluggy's call order
    (last registered first, ``tryfirst``/``trylast`` respected): ``pm`` must keep its
    plugin set while this object is used (an :class:`ObserverManager` in use by a run
    refuses changes). Hook-call monitors of ``pm`` see each hook call (its
    implementations, its arguments, and a :class:`pluggy.Result` of the list of results).

    Failure policy: an observer raising is logged with its name, counted in
    :attr:`failures` and skipped; every other observer still runs. That holds for any
    ``BaseException`` on any thread but the main one — ``SystemExit`` and
    ``KeyboardInterrupt`` included: an observer must not end the dispatch thread nor a
    publisher's. On the main thread ``KeyboardInterrupt`` and ``SystemExit`` are counted,
    then re-raised: Python runs signal handlers (the user's Ctrl-C, a SIGTERM handler
    calling ``sys.exit``) on the main thread, in whatever frame it is running — often an
    observer — and swallowing them would keep a preempted job training.

    Hung observers: with ``hook_timeout_s``, each hook of a plugin that is not twinkle's
    own runs on that plugin's thread, waited for at most that long
    (:class:`~twinkle.plugins._isolation.HookRunner`): a call past it cuts the plugin off
    (counted as a failure, logged with the fix, none of its hooks called again), and the
    run goes on. A ``SystemExit`` or ``KeyboardInterrupt`` it raises there is its
    failure, on any thread.

    Slow observers: each observer call is timed with ``clock`` (integer ns); one taking
    longer than ``slow_call_s`` seconds (default :data:`DEFAULT_SLOW_CALL_S`) is counted
    in :attr:`slow` and logged with the hook and its duration (the 1st, 2nd, 4th...
    time per observer). It is not interrupted: a hook runs to its end. ``None`` turns
    the timing off. The cost is one clock read per observer call (the end of one call
    is the start of the next), none with ``None``.
    """

    __slots__ = (
        "_clock",
        "_plans",
        "_pm",
        "_required",
        "_runners",
        "_slow_ns",
        "failures",
        "left_out",
        "slow",
        "slow_call_s",
    )

    def __init__(
        self,
        pm: ObserverManager,
        *,
        slow_call_s: float | None = DEFAULT_SLOW_CALL_S,
        clock: Callable[[], int] = time.perf_counter_ns,
        required: Iterable[str] = (),
        hook_timeout_s: float | None = None,
    ) -> None:
        check_slow_call_s(slow_call_s)
        if not callable(clock):
            raise InvalidArgumentError(
                f"clock={clock!r} must be a callable returning integer nanoseconds"
            )
        self._pm = pm
        self._runners: dict[str, HookRunner] = {}
        self._plans: dict[str, list[_Impl]] = {
            name: [
                self._planned(name, impl, hook_timeout_s)
                for impl in reversed(caller.get_hookimpls())
            ]
            for name, caller in vars(pm.hook).items()
            if isinstance(caller, pluggy.HookCaller)
        }
        self.slow_call_s = slow_call_s
        self._slow_ns = None if slow_call_s is None else round(slow_call_s * 1e9)
        self._clock = clock
        #: failures per plugin name (logged as they happen)
        self.failures: Counter[str] = Counter()
        #: observer calls over ``slow_call_s`` per plugin name (logged as they happen)
        self.slow: Counter[str] = Counter()
        self._required = frozenset(required)
        #: plugins left out of the run because they could not set up, with why
        self.left_out: dict[str, str] = {}

    def _planned(self, hook: str, impl: pluggy.HookImpl, timeout_s: float | None) -> _Impl:
        """A hook implementation as the calls make it: on its plugin's own thread,
        unless it is twinkle's own (a built-in observer, or a plugin of twinkle's code
        such as a follower's record keeper) or no time limit is set."""
        name, function = impl.plugin_name, impl.function
        if timeout_s is not None and not self._twinkles(name):
            runner = self._runners.get(name)
            if runner is None:
                runner = self._runners[name] = HookRunner(name, timeout_s)
            function = functools.partial(runner.call, hook, function)
        return name, function, tuple(impl.argnames)

    def _twinkles(self, name: str) -> bool:
        """Whether plugin ``name`` is twinkle's own code: a built-in observer, or an
        object of a class of twinkle's package."""
        if self._pm.is_builtin(name):
            return True
        module = getattr(type(self._pm.get_plugin(name)), "__module__", "")
        return module == "twinkle" or module.startswith("twinkle.")

    def close(self) -> None:
        """Let the plugins' hook threads end (the run made its last hook call)."""
        for runner in self._runners.values():
            runner.close()

    def call(self, hook: str, **kwargs: Any) -> list[Any]:
        """Call ``hook`` on every observer; the non-None results."""
        return [result for _, result in self._calls(hook, kwargs)]

    @property
    def monitored(self) -> bool:
        """Whether hook-call monitors are installed (they see every hook call)."""
        return self._pm.monitored

    def plan(self, hook: str) -> list[_Impl]:
        """The implementations of ``hook``, in call order (empty: nobody implements it)."""
        return self._plans.get(hook, [])

    def configure(self, context: object) -> None:
        """Call ``twinkle_configure``: like :meth:`call`, except that an observer raising
        :class:`~twinkle.errors.TwinkleError` (it cannot run as configured: a missing
        dependency, a bad setting) fails the run's start with that error when it is
        essential (:meth:`essential`); any other such plugin is left out
        (:meth:`leave_out`)."""
        self._calls("twinkle_configure", {"context": context}, TwinkleError)

    def make_backends(self, context: object) -> list[tuple[str, Any]]:
        """Call ``twinkle_make_backends``: the backends every observer provides, each
        with its plugin's name; a :class:`~twinkle.errors.TwinkleError` (a backend's file
        cannot be opened) is handled as in :meth:`configure`."""
        calls = self._calls("twinkle_make_backends", {"context": context}, TwinkleError)
        return [(name, backend) for name, result in calls for backend in result]

    def builtin(self, name: str) -> bool:
        """Whether plugin ``name`` is one of twinkle's own observers."""
        return self._pm.is_builtin(name)

    def essential(self, name: str) -> bool:
        """Whether the run cannot go on without plugin ``name``: one of twinkle's own
        observers (its outputs are the run's), or one the caller requires."""
        return name in self._required or self._pm.is_builtin(name)

    def leave_out(self, name: str, why: str) -> None:
        """Call none of plugin ``name``'s hooks from now on; ``why`` is kept in
        :attr:`left_out` and logged (a plugin that could not set up: the run goes on
        without it)."""
        if name in self.left_out:
            return
        self._drop(name, why)
        log.error(
            "plugin %r left out of the run: %s (the run goes on without it; to stop "
            "instead, require it: RunSession(required_plugins=[%r]), TwinkleCallback(..., "
            "required_plugins=[%r]) or twinkle demo --require-plugin %s)",
            name,
            why,
            name,
            name,
            name,
        )

    def _drop(self, name: str, why: str) -> None:
        self.left_out[name] = why
        # New lists: a hook call iterating the old plan goes on undisturbed.
        self._plans = {
            hook: [impl for impl in plan if impl[0] != name] for hook, plan in self._plans.items()
        }

    def _cut_off(self, name: str, hook: str, exc: HookTimeout) -> None:
        """Plugin ``name``'s call did not return (``exc`` says which): call none of its
        hooks again, the run going on without it, counted and logged with the fix; in
        its set-up (``hook``), a plugin the run requires fails the start instead."""
        why = f"{exc} (backend_timeout_s): cut off"
        if hook in _SET_UP and self.essential(name):
            raise PluginError(
                f"plugin {name!r}, which the run requires: {why}; the run cannot start "
                "without it: fix the plugin, or do not require it"
            )
        self.failures[name] += 1
        self._drop(name, why)
        log.error(
            "observer %r: %s; none of its hooks is called again and the run goes on "
            "without it (its call left running on its own thread counts for nothing). "
            "Fix the plugin, or leave it out: RunSession(blocked=[%r]), twinkle demo "
            "--block %s",
            name,
            why,
            name,
            name,
        )

    def call_named(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Like :meth:`call`, with each result paired with its plugin's name."""
        return self._calls(hook, kwargs)

    def implementers(self, hook: str) -> list[str]:
        """The plugins implementing ``hook``, in call order."""
        return [name for name, _, _ in self._plans.get(hook, ())]

    def count(self, name: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Count a failure of ``name``; log the 1st, 2nd, 4th, 8th... (a lasting fault
        does not flood the log), with the traceback being handled when ``exc_info``."""
        self.failures[name] += 1
        n = self.failures[name]
        if n & (n - 1) == 0:
            log.error(f"observer %r {message} (failure %d)", name, *args, n, exc_info=exc_info)

    def _calls(
        self, hook: str, kwargs: dict[str, Any], fatal: type[Exception] = _Never
    ) -> list[tuple[str, Any]]:
        if self._pm.monitored:
            return self._monitored(hook, kwargs, fatal)
        plan = self._plans.get(hook)
        return self._plain(hook, plan, kwargs, fatal) if plan else []

    def count_slow(self, name: str, hook: str, duration_ns: int) -> None:
        """Count a call of ``name`` over the budget; logged like :meth:`count`."""
        self.slow[name] += 1
        n = self.slow[name]
        if n & (n - 1) == 0:
            log.warning(
                "observer %r took %.3f s in %s, over slow_call_s=%s (slow call %d)",
                name,
                duration_ns / 1e9,
                hook,
                self.slow_call_s,
                n,
            )

    def _plain(
        self, hook: str, plan: list[_Impl], kwargs: dict[str, Any], fatal: type[Exception]
    ) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        budget = self._slow_ns
        if budget is None:
            for name, function, argnames in plan:
                try:
                    result = function(*[kwargs[a] for a in argnames])
                except fatal as exc:
                    self._set_up_failed(name, hook, exc)
                    continue
                except BaseException as exc:
                    self._failed(name, hook, exc)
                    continue
                if result is not None:
                    out.append((name, result))
            return out
        clock = self._clock
        # One clock read per call: the end of one observer's call starts the next one's
        # (what lies between is this loop's own sub-microsecond work).
        start = clock()
        for name, function, argnames in plan:
            try:
                result = function(*[kwargs[a] for a in argnames])
            except fatal as exc:
                self._set_up_failed(name, hook, exc)
                start = clock()
                continue
            except BaseException as exc:
                took = clock() - start
                if took > budget:
                    self.count_slow(name, hook, took)
                self._failed(name, hook, exc)
                start = clock()  # the logging is nobody's call
                continue
            end = clock()
            if end - start > budget:
                self.count_slow(name, hook, end - start)
                end = clock()
            start = end
            if result is not None:
                out.append((name, result))
        return out

    def _set_up_failed(self, name: str, hook: str, exc: BaseException) -> None:
        """A plugin could not set up: the run's failure when it is essential, else the
        plugin is left out."""
        if self.essential(name):
            raise exc
        self.leave_out(name, f"{hook} raised {type(exc).__name__}: {exc}")

    def _failed(self, name: str, hook: str, exc: BaseException) -> None:
        """Count an observer's exception; re-raise the main thread's KeyboardInterrupt
        and SystemExit (a signal handler's, most likely)."""
        if isinstance(exc, HookTimeout):
            self._cut_off(name, hook, exc)
            return
        if isinstance(exc, KeyboardInterrupt | SystemExit) and threading.current_thread() is (
            threading.main_thread()
        ):
            kind = type(exc).__name__
            self.count(name, "was interrupted in %s (%s); re-raised", hook, kind)
            raise exc
        if isinstance(exc, WriteError):  # a disk fault: its message says it all
            self.count(name, "cannot write in %s: %s", hook, exc)
            return
        self.count(name, "failed in %s; skipped", hook, exc_info=True)

    def _monitored(
        self, hook: str, kwargs: dict[str, Any], fatal: type[Exception]
    ) -> list[tuple[str, Any]]:
        monitors = self._pm.monitors
        impls = list(reversed(getattr(self._pm.hook, hook).get_hookimpls()))
        for before, _after in monitors:
            before(hook, impls, kwargs)
        results = self._plain(hook, self._plans.get(hook, []), kwargs, fatal)
        outcome: pluggy.Result[list[Any]] = pluggy.Result([r for _, r in results], None)
        for _before, after in reversed(monitors):
            after(outcome, hook, impls, kwargs)
        return results
