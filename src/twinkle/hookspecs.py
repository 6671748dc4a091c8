"""The observer contract: one typed ``twinkle_*`` hook per event, plus the run's frame.

This module *is* the contract. Hooks only ever gain arguments, never lose them; an
implementation may accept any subset of a hook's arguments (pluggy passes only the ones
it names). Every hook runs on the thread that dispatches the event, one observer at a
time, in pluggy's order (last registered first, ``tryfirst``/``trylast`` respected).

A raising implementation never stops the others or the run: the dispatcher logs it with
the plugin's name, counts it (``summary.json`` → ``observer_failures``) and goes on.

Observers are deterministic functions of the events they receive: they read no clock,
environment or device. Replaying a run's ``events.jsonl`` through the same observers
reproduces every record they produced.

Event hooks may return a list of :class:`~twinkle.reporting.MetricRecord`
(``seq`` is assigned by the run's reporter) or ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast, final

import pluggy

from twinkle.errors import PluginError
from twinkle.events import (
    OVERHEAD_SPAN,
    BackendsClosed,
    Event,
    IterationStarted,
    MemoryReadings,
    OptimizerStep,
    RunFinished,
    RunResumed,
    RunStarted,
    SamplesObserved,
    ScalarsObserved,
    Snapshot,
    SpanBatch,
    WeightsPublished,
)
from twinkle.reporting import Backend, MetricRecord

__all__ = [
    "OVERHEAD_SPAN",
    "PROJECT_NAME",
    "RunContext",
    "Stash",
    "StashKey",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "twinkle"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Records = Sequence[MetricRecord] | None


_T = TypeVar("_T")


@final
class StashKey(Generic[_T]):
    """A typed key of a :class:`Stash`: made once, by the observer that owns the value."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StashKey({self.name!r})"


@final
class Stash:
    """Per-run state that observers share (e.g. the run's timeline), owned by the run:
    it lives and dies with the run's :class:`RunContext`, never in module globals.
    (The idea of pytest's ``Stash``; pytest's own is internal to pytest.)"""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[_T], value: _T) -> None:
        if key in self._values:
            raise PluginError(f"{key!r} is already set for this run; one owner per key")
        self._values[key] = value

    def __getitem__(self, key: StashKey[_T]) -> _T:
        try:
            return cast(_T, self._values[key])
        except KeyError:
            raise KeyError(key) from None

    def get(self, key: StashKey[_T]) -> _T | None:
        """The value of ``key``, or None when no observer set it."""
        return cast("_T | None", self._values.get(key))

    def __contains__(self, key: object) -> bool:
        return key in self._values


@dataclass(frozen=True, slots=True)
class RunContext:
    """What an observer may know about the run's frame (never a clock).

    ``out_dir`` is the run directory (``runs/<run_id>/``) where sinks write, or ``None``
    when nothing is to be written; ``config`` is the caller's observer configuration
    (the same dict :class:`~twinkle.events.RunStarted` will carry; for a resumed run,
    the newest segment's, which its :class:`~twinkle.events.RunResumed` carries: a
    resume may change only ``total_steps`` and ``x_`` keys); ``replay`` is true
    when events come from a log; ``stash`` holds what observers share for this run.

    ``resumed_events`` is the number of events a resumed live run (a second session on
    the same run directory: a restarted job) found in its ``events.jsonl``: the
    observers see those events again first, so that every output covers every segment,
    and the event log must not write them a second time. 0 otherwise (and in a replay).

    ``segment`` is the segment this session begins: 0 for a new run (and in a replay),
    n for its n-th resume. The logged events fed again may hold the ``run_resumed`` of
    earlier segments: the new segment begins at the ``run_resumed`` whose ``segment`` is
    this one.

    ``checkpoint`` is set when a resume starts from the checkpoint an earlier segment
    left (only when every observer is twinkle's own): its first ``checkpoint.events``
    logged events are not fed again (twinkle's observers get their state back, its sinks
    continue their files), only the rest of the ``resumed_events``. None otherwise.
    """

    run_id: str
    out_dir: Path | None
    config: Mapping[str, Any] = field(default_factory=dict)
    replay: bool = False
    stash: Stash = field(default_factory=Stash, compare=False, repr=False)
    resumed_events: int = 0
    segment: int = 0
    checkpoint: Any = field(default=None, compare=False, repr=False)


@hookspec
def twinkle_check_config(config: Mapping[str, Any]) -> None:
    """Before a run starts, and when a resuming session's configuration is compared
    with the one its log holds: raise :class:`~twinkle.errors.ConfigError`, naming the
    key and the fix, when this observer cannot run under ``config``. The run then does
    not start, whichever plugin raised (a replay refuses the same configuration, so a
    live run never writes a log its replay refuses). Called outside the dispatcher:
    keep it a pure check of ``config``, quick, raising nothing else.

    :param config: the run's configuration as the event log carries it (a live run's
        configuration holding NaN or an infinity is refused before this hook, naming the
        key: the log, JSON, would hold null).
    """


@hookspec
def twinkle_reserved_scalar_names(config: Mapping[str, Any]) -> Iterable[str] | None:
    """Names the caller's scalars (``bus.scalars(name=...)``) may not take under
    ``config``: an observer whose records take a scalar's name as their kind returns
    the kinds the run's other records have, so that one is never taken for the other.
    Called once, when the session is made; keep it a pure function of ``config``.

    :param config: as for :func:`twinkle_check_config`.
    """


@hookspec
def twinkle_configure(context: RunContext) -> None:
    """Once per run, after every plugin is registered (the set is fixed from now until
    the run closes) and before the first event. Raising a
    :class:`~twinkle.errors.TwinkleError` here (the observer cannot run as configured)
    fails the run's start with that error when the observer is one of twinkle's own or
    a plugin the run requires (``RunSession(required_plugins=...)``, ``--require-plugin
    NAME``); any other plugin is left out of the run instead — none of its hooks is
    called again — and named, with the error, on stderr, in ``run_started`` and in
    ``summary.json`` (``plugins_left_out``). Any other exception is logged and counted.

    :param context: the run's id, output directory, configuration (as the event log
        carries it), whether this is a replay, and the run's stash (state observers
        share for this run, e.g. the timeline).
    """


@hookspec
def twinkle_make_backends(context: RunContext) -> Sequence[Backend] | None:
    """Once per run, after :func:`twinkle_configure`: record backends this plugin provides.
    Keep it quick (the run's start waits for it): do slow set-up (imports, connecting to
    a server, creating a store) in the backend's optional ``open()`` method, which a
    plugin's backend gets called on its own thread, before its first ``write``. Raising
    a :class:`~twinkle.errors.TwinkleError` here leaves the plugin out of the run, every
    hook of it, as for :func:`twinkle_configure` (fatal only for twinkle's own and a
    required plugin). An ``open()`` that raises (anything) or runs past the backend
    bound leaves only that backend out: its records are counted lost, its other hooks
    still run, and ``plugins_left_out`` names it (a required plugin's start fails).

    The run's single :class:`~twinkle.reporting.MetricsReporter` fans every record
    out to all backends returned here (it assigns ``seq`` and isolates failing backends).
    A plugin's backend is called on a thread of its own
    (:class:`~twinkle.reporting.IsolatedBackend`): the run's own files never wait for
    it, and a call that does not return within ``backend_timeout_s`` cuts it off. What
    each backend did with its records is in ``summary.json`` (``backends``).

    :param context: as for :func:`twinkle_configure`.
    """


@hookspec
def twinkle_run_started(event: RunStarted) -> Records:
    """The run began; first event of every run.

    :param event: run id, start times, the run process's clock anchor and the caller's
        observer configuration (``event.config``: phases, sample tags, denominators).
    """


@hookspec
def twinkle_run_resumed(event: RunResumed) -> Records:
    """The run goes on in a new process (a restarted job): a new segment begins, after
    the ``run_finished`` that ended the previous one. The observers keep what they
    accumulated (the run's figures cover every segment) and take the events that
    follow as more of the same run; the time between the segments is in no window.

    :param event: the segment number (1 for the first resume), its start times and the
        new process's clock anchor (its clock continues the run's timeline).
    """


@hookspec
def twinkle_iteration_started(event: IterationStarted) -> Records:
    """The driver began iteration ``event.iteration``. Every span that closed before it
    has already arrived in :func:`twinkle_spans`, so the previous iteration is complete.

    :param event: the iteration number and its start time (``event.monotonic_ns``).
    """


@hookspec
def twinkle_weights_published(event: WeightsPublished) -> Records:
    """Every engine acknowledged loading weight ``event.version`` (the real completion).

    :param event: version, publishing start/end ns, one acknowledgement per engine.
    """


@hookspec
def twinkle_snapshot(event: Snapshot) -> Records:
    """The driver published its state.

    :param event: ``event.state`` is a plain dict (counts, version, waits).
    """


@hookspec
def twinkle_spans(event: SpanBatch) -> Records:
    """A batch of finished spans arrived from one recorder.

    :param event: ``event.spans`` (name, start/end ns, thread, pid, attrs, error) on the
        clock of the process that ``event.anchor`` describes; a worker's batch also
        carries ``event.sent_anchor`` (its clocks read as it sent them: placing the
        batch with :func:`twinkle.observers.placement.place_batch` checks it for clock
        skew against the batch's arrival, ``event.monotonic_ns``).
    """


@hookspec
def twinkle_memory(event: MemoryReadings) -> Records:
    """Raw per-worker memory readings arrived.

    :param event: ``event.readings`` in integer bytes, ``event.iteration`` they belong to.
    """


@hookspec
def twinkle_samples(event: SamplesObserved) -> Records:
    """The caller observed samples with per-sample token lengths, tagged with a phase.

    :param event: iteration, phase tag, token length of every sample, group count.
    """


@hookspec
def twinkle_optimizer_step(event: OptimizerStep) -> Records:
    """The trainer took an optimizer step.

    :param event: iteration, optimizer steps so far (1-based), samples in the step.
    """


@hookspec
def twinkle_scalars(event: ScalarsObserved) -> Records:
    """The caller published named per-iteration figures (reward, loss, ...).

    :param event: iteration, the figures' group name and their values.
    """


@hookspec
def twinkle_run_finished(event: RunFinished) -> Records:
    """The run ended; last event of every run. Emit the final and run-scope records.

    :param event: status, terminal totals from the producers, dropped-record count.
    """


@hookspec
def twinkle_backends_closed(event: BackendsClosed) -> Records:
    """The segment's record backends are closed (after :func:`twinkle_run_finished`):
    what each did with the records handed to it. The run puts it in ``summary.json``
    (``backends``); records returned here reach only the run's own files.

    :param event: ``event.backends``: a :class:`~twinkle.reporting.BackendHealth` per
        backend, by the name of the plugin that made it.
    """


@hookspec
def twinkle_event(event: Event) -> None:
    """Every event, after its typed hook has run for every observer (event-log sinks).

    :param event: any event value; ``type(event).TYPE`` names its kind.
    """


@hookspec
def twinkle_record(record: MetricRecord) -> None:
    """Every record any observer produced, after the reporter stamped its ``seq``.

    :param record: the stamped record.
    """


@hookspec
def twinkle_summary(event: RunFinished) -> dict[str, Any] | None:
    """After :func:`twinkle_run_finished`: this observer's part of ``summary.json``.

    Keys of all parts are merged into one object, twinkle's own observers' parts first
    (their keys are the ones readers such as ``twinkle report`` read); a key two plugins
    both return is kept under ``"<plugin>.<key>"`` for the later one.

    :param event: the run's final event.
    """


@hookspec
def twinkle_checkpoint_state() -> object:
    """What this observer keeps from the events it saw, for the run's checkpoint; None
    when it keeps nothing (its hooks act on the events as they come, its backends on
    the records). A plugin that implements this hook lets a restarted run resume from
    the checkpoint (docs/metrics.md, "Resuming from a checkpoint"): the observers then
    see only the events after it, :func:`twinkle_restore_state` gets this value back
    before the first of them, and the plugin's backends get the records the checkpoint
    stands for, read back from ``metrics_raw.jsonl`` in order, before any other. A
    plugin without it makes every resume feed the run's whole log again (hours at the
    end of a long run on many GPUs). Called on the thread that takes the checkpoint,
    while no event is dispatched; the value must be plain data (None, bool, int, float,
    str, bytes, and lists, tuples, dicts and sets of them), and what it holds must not
    be changed by the plugin afterwards. A value that is not (a class of the plugin's
    own: a checkpoint makes no class but twinkle's), or one returned by a plugin
    without :func:`twinkle_restore_state`, or one this hook raises, is named in a
    warning when the checkpoint is taken, and that checkpoint is not: the next resume
    starts from an earlier one, or from the whole log. A plugin the run left out is
    not asked. The checkpoint fits a later segment only with the plugin's class's
    module unchanged (its source is digested, not the modules it imports): keep a
    version number in a state whose meaning lives elsewhere.
    """


@hookspec
def twinkle_restore_state(state: object) -> None:
    """A resume from the run's checkpoint: ``state`` is what this observer's
    :func:`twinkle_checkpoint_state` returned when the checkpoint was taken (a copy),
    given back after :func:`twinkle_configure` and before
    :func:`twinkle_make_backends` and the first event. Not called for None.

    :param state: the observer's state, as it returned it.
    """


@hookspec
def twinkle_unconfigure(context: RunContext) -> None:
    """Once per run, last: flush and close whatever the plugin opened, except its
    backends (the run's reporter closes those, each on its own thread and bounded).

    :param context: as for :func:`twinkle_configure`.
    """
