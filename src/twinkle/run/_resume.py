"""A live run's directory, and resuming the run its log holds.

:class:`RunDirectory` is what a :class:`~twinkle.run.RunSession` holds of
``<out_dir>/<run_id>/``: the lock (one live writer), the clock that continues the
logged run's timeline, the scan of the log (checked before anything is opened or
written: the lifecycle and order checks the resumed run will apply, so feeding it
again cannot fail half-way), the checkpoint a resume starts from, and the resume
itself: the logged events fed to the observers again (only those after the checkpoint
when there is one), a segment that stopped without finishing closed with an ``error``
status, and ``run_resumed``. The log is read twice, the scan before the feed, so that
nothing is written for a log that cannot be resumed; from a checkpoint only its tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, final

import pluggy

from twinkle.errors import (
    ConfigError,
    FinishedRunError,
    ReporterError,
    ResumeConfigError,
    TwinkleError,
)
from twinkle.events import EventBus, RunStarted, Status, read_back
from twinkle.hookspecs import RunContext
from twinkle.locks import RunDirLock
from twinkle.observers import ClockSkewTolerance
from twinkle.observers.placement import LatestTime
from twinkle.observers.sinks import EVENTS_FILE
from twinkle.perf import Clock, ClockAnchor
from twinkle.plugins import make_plugin_manager
from twinkle.reporting import make_dirs, sync_dir
from twinkle.run._checkpoint import (
    CHECKPOINT_FILE,
    NO_CHECKPOINT,
    Checkpoint,
    drop_stale,
    log_edited,
)
from twinkle.run._checkpoint import load as load_checkpoint
from twinkle.run._config import (
    RESUMABLE_CONFIG,
    check_config,
    describe_config_changes,
    refused_config_keys,
)
from twinkle.run._feed import FeedProgress, LogFeeder
from twinkle.run._observer_state import observers_of, plugins_without_state
from twinkle.run._replay import iter_events
from twinkle.run._run import Run
from twinkle.run._scan import Scan, fixed_config, logged_events, note, scan_of
from twinkle.run._summary import SUMMARY_FILE

__all__ = ["Resumed", "RunDirectory"]

log = logging.getLogger("twinkle.session")


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a resuming session found in its run directory's log.

    ``segment`` is the segment this session writes (1 for the first resume);
    ``events`` the events already logged; ``last_iteration`` and ``optimizer_steps``
    where the earlier segments stopped — a restarted trainer continues from
    :attr:`next_iteration` and step ``optimizer_steps + 1`` (iterations and steps only
    go forward); ``previous_status`` is the previous segment's status, None when it
    stopped without finishing (it is then closed with an ``error`` status);
    ``restored_events`` the first of ``events`` that the run's checkpoint stood for
    (the observers were fed only the rest).
    """

    segment: int
    events: int
    last_iteration: int | None
    optimizer_steps: int
    previous_status: Status | None
    #: the events whose effect came back from the run's checkpoint (not fed again)
    restored_events: int = 0

    @property
    def next_iteration(self) -> int:
        return 0 if self.last_iteration is None else self.last_iteration + 1


@final
class RunDirectory:
    """``path`` (``<out_dir>/<run_id>``) as the session of run ``run_id`` holds it."""

    __slots__ = ("_shift", "checkpoint", "created", "lock", "path", "run_id", "whole_log_why")

    def __init__(self, path: Path, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        self.lock = RunDirLock(path)
        self.created = False  # whether take() made the directory
        self.checkpoint: Checkpoint | None = None  # the one a resume starts from
        self.whole_log_why: str | None = None  # why a resume cannot start from one
        self._shift: list[int] | None = None  # what continuing() adds to the clock

    @property
    def log(self) -> Path:
        return self.path / EVENTS_FILE

    # -- the clock -----------------------------------------------------------------------

    def continuing(self, clock: Clock, wall_clock: Clock) -> Clock:
        """``clock``, moved onto the timeline of the run the log holds when it holds one
        (through the wall clock: decided when the session is made, as the recorders
        read the clock from the start); else ``clock`` itself."""
        origin = self._logged_origin()
        if origin is None:
            return clock
        shift = self._shift = [origin.monotonic_ns + (wall_clock() - origin.wall_ns) - clock()]

        def continuing() -> int:
            return clock() + shift[0]

        return continuing

    def _logged_origin(self) -> ClockAnchor | None:
        """The anchor of the run the log holds (None: no log, or one that does not start
        with a run_started: the scan says what is wrong)."""
        if self.log.is_symlink() or not self.log.is_file():
            return None
        # The first event as the scan will read it (blank lines and recorded fragments
        # passed over), so both agree on whether there is a run to resume.
        try:
            first = next(iter_events(self.log), None)  # (the reader closes with its iterator)
        except TwinkleError:
            return None
        return first.anchor if isinstance(first, RunStarted) else None

    # -- taking and giving up the directory ------------------------------------------------

    def take(self, pm: pluggy.PluginManager, config: Mapping[str, Any]) -> Scan | None:
        """Create and lock the directory; scan the log it holds (None: none), choosing
        the checkpoint a resume under ``pm``'s observers and ``config`` can start from."""
        out = self.path
        self.created = not os.path.lexists(out)
        try:
            make_dirs(out)  # (0755 less the umask at every level)
        except OSError as exc:
            raise ReporterError(
                f"cannot create the run directory {str(out)!r}: {exc.strerror or exc}; "
                "out_dir must be a writable directory (not a file, not read-only)"
            ) from exc
        if out.is_symlink() or not out.is_dir():
            raise ReporterError(
                f"run directory {str(out)!r} is a symlink or not a directory: twinkle "
                "follows no link in a run directory; remove it or choose another run id"
            )
        self.lock.acquire(self.run_id)
        try:
            if self.log.is_symlink() or not self.log.exists():
                self._drop_stale_checkpoint()  # (a new run of this id: another run's)
                return None  # (a symlink is refused by the event log's writer)
            if not self.log.is_file():
                raise ReporterError(
                    f"{str(self.log)!r} is not a file: the run's event log goes there; "
                    "remove what is in its place or choose another run id"
                )
            if self.log.stat().st_size == 0:
                self._drop_stale_checkpoint()
                return None
            self.checkpoint = self._usable_checkpoint(pm, config)
            return self._scan()
        except BaseException:
            self.lock.release()
            raise

    def give_up(self) -> None:
        """After a failed start: remove what the start left of a directory it made (the
        empty files it opened, then the directory), and release it."""
        unused = self._remove_if_unused()  # (while the directory is still ours)
        self.lock.release()
        if unused:
            with contextlib.suppress(OSError):  # another process took it since
                self.path.rmdir()

    def _remove_if_unused(self) -> bool:
        """Remove the empty files the start opened when that is all this session's new
        directory holds; True when the directory is then to be removed too."""
        if not self.created:
            return False
        try:
            entries = [e for e in self.path.iterdir() if e != self.lock.path]
            if not all(
                e.is_file() and not e.is_symlink() and not e.stat().st_size for e in entries
            ):
                return False
            for entry in entries:
                entry.unlink()
        except OSError:
            return False  # left as it is: nothing of a run is lost either way
        return True

    # -- the scan --------------------------------------------------------------------------

    def _scan(self) -> Scan | None:
        """Check the log through a run without observers: the events after
        :attr:`checkpoint` when there is one, else all of them."""
        checker = Run(
            make_plugin_manager(autoload=False, builtins=False),
            RunContext(self.run_id, None, {}, replay=True),
            background=False,
        )
        checkpoint = self.checkpoint
        checker.start()
        try:
            scan = None if checkpoint is None else scan_of(checkpoint, checker)
            for event in logged_events(self.log, checkpoint):
                if scan is None:
                    scan = self._first_scanned(event)
                    checker.context = dataclasses.replace(checker.context, config=event.config)
                checker.submit(event)
                note(scan, event)
        except TwinkleError as exc:
            raise ConfigError(
                f"cannot resume run {self.run_id!r} from {str(self.log)!r}: {exc}"
            ) from exc
        finally:
            checker.close()
        return scan

    def _first_scanned(self, event: Any) -> Scan:
        if not isinstance(event, RunStarted) or event.run_id != self.run_id:
            raise ConfigError(
                f"{str(self.log)!r} is not the log of run {self.run_id!r} (its first "
                f"event is {event.TYPE!r} of run {event.run_id!r}): move it away or "
                "choose another run id"
            )
        skew = ClockSkewTolerance.parse(event.config)
        return Scan(event, latest=LatestTime(event.anchor, skew))

    def _usable_checkpoint(
        self, pm: pluggy.PluginManager, config: Mapping[str, Any]
    ) -> Checkpoint | None:
        """The run's checkpoint when this resume can start from it, else None (why not is
        kept in :attr:`whole_log_why`, logged once the resume goes on: the whole log is
        fed again, as without one)."""
        names = observers_of(pm)
        found: Checkpoint | str = (
            f"plugin(s) {plugins_without_state(pm)} keep no checkpoint state (a plugin "
            "without the twinkle_checkpoint_state hook rebuilds its outputs from every "
            "event it sees; docs/hooks.md)"
            if names is None
            else load_checkpoint(self.path, self.run_id, names)
        )
        if isinstance(found, Checkpoint) and fixed_config(found.segment_config()) != fixed_config(
            config
        ):
            found = (
                "this session's configuration differs from the one the checkpoint's "
                "segment ran with (every output is rebuilt under the new one)"
            )
        if isinstance(found, str):
            edited = log_edited(self.path)
            if edited is not None:  # (its figures would be rebuilt from what it says now)
                raise ConfigError(
                    f"cannot resume run {self.run_id!r}: {edited}. Restore the original "
                    f"log to resume the run as it was; or, to take the log as it is now, "
                    f"remove {str(self.path / CHECKPOINT_FILE)!r} (the resume then rebuilds "
                    "the run's summary, records and trace from it)"
                )
            self.whole_log_why = found
            return None
        return found

    def _drop_stale_checkpoint(self) -> None:
        """Remove a checkpoint that marks an event log no longer there (cut, or none),
        before this session writes the log: else what it appends would later read as an
        edit of the part the checkpoint covers."""
        if drop_stale(self.path):
            log.info("run %r: removed %s, which marked a log no longer there", self.run_id,
                     CHECKPOINT_FILE)  # fmt: skip

    # -- resuming --------------------------------------------------------------------------

    def check(
        self,
        scan: Scan,
        *,
        asked: bool | None,
        config: Mapping[str, Any],
        pm: pluggy.PluginManager,
        clock: Clock,
    ) -> None:
        """Refuse to resume what ``scan`` found unless the session may (``asked``: its
        ``resume`` argument; ``config``: its configuration, under ``pm``'s observers),
        and push :meth:`continuing`'s clock on when the wall clock went back."""
        check_resume_asked(asked, scan, self.run_id, self.path)
        if self._shift is None:
            raise TwinkleError(
                f"run directory {str(self.path)!r} got an event log after this session "
                "was made; make the session again to resume it"
            )
        check_resumed_config(config, pm, scan.started, self.run_id, self.log)
        behind = scan.latest.ns - clock() + 1
        if behind > 0:  # the wall clock went back between the segments
            self._shift[0] += behind

    def resume(self, run: Run, bus: EventBus, scan: Scan) -> Resumed:
        """Feed the logged events to ``run``'s observers again (those after
        :attr:`checkpoint`), close a segment that stopped without finishing, and connect
        ``bus`` (the caller then publishes ``run_resumed``)."""
        summary = self.path / SUMMARY_FILE  # (before a line is written: forget_summary)
        if summary.is_dir() and not summary.is_symlink():
            raise TwinkleError(
                f"cannot resume run {self.run_id!r}: {str(summary)!r} is a directory, where "
                "the run writes its summary; move it away and resume again"
            )
        if self.checkpoint is None and self.whole_log_why is not None:
            level = logging.INFO if self.whole_log_why == NO_CHECKPOINT else logging.WARNING
            log.log(level, "run %r resumes from its whole log: %s", self.run_id, self.whole_log_why)
        if self.checkpoint is None:
            self._drop_stale_checkpoint()
        restored = 0 if self.checkpoint is None else self.checkpoint.events
        feeder = LogFeeder(run)
        feeder.count = restored
        # What observers publish while the logged events go by again is in the log
        # already (they published it the first time): the bus drops it until the run
        # goes on, and the event log skips exactly the events fed again.
        bus.bind(_logged_already)
        try:
            events = logged_events(self.log, self.checkpoint)
            what = f"run {self.run_id!r} resuming: its log fed again"
            progress = FeedProgress(what, events, self.log.stat().st_size, fed_before=restored)
            feeder.feed(events, limit=scan.events, progress=progress)  # (inline)
        finally:
            bus.bind(None)
        if feeder.count != scan.events:
            raise TwinkleError(f"{str(self.log)!r} changed while run {self.run_id!r} was resuming")
        run.connect(bus)
        feeder.close_unfinished(
            f"segment {scan.segments - 1} stopped without finishing (its process died or "
            "was killed); found when the run resumed",
            ns=scan.latest.ns,
            wall_ns=scan.latest.wall_ns,
        )
        return Resumed(
            segment=scan.segments,
            events=scan.events,
            last_iteration=scan.last_iteration,
            optimizer_steps=scan.optimizer_steps,
            previous_status=None if scan.finished is None else scan.finished.status,
            restored_events=restored,
        )

    def forget_summary(self) -> None:
        """Remove ``summary.json``, durably: it vouched for the segments before the new
        one, and until that one finishes it describes no run there is (replay rebuilds
        it)."""
        path = self.path / SUMMARY_FILE
        try:
            path.unlink()
        except FileNotFoundError:
            return
        sync_dir(path.parent)


def check_resume_asked(asked: bool | None, scan: Scan, run_id: str, where: Path) -> None:
    """:class:`~twinkle.errors.FinishedRunError` when a session with ``resume=asked`` may
    not continue the run in ``where`` (see ``resume`` in RunSession's docstring)."""
    finished = scan.finished
    if asked is True or (asked is None and (finished is None or finished.status != "ok")):
        return
    if asked is False:
        problem = (
            f"run {run_id!r} already has a log in {str(where)!r} ({scan.segments} "
            "segment(s)) and resume=False does not continue a run"
        )
    else:
        last = "none" if scan.last_iteration is None else str(scan.last_iteration)
        problem = (
            f"run {run_id!r} in {str(where)!r} finished ok (segment {scan.segments - 1}, "
            f"last iteration {last}, {scan.optimizer_steps} optimizer step(s)); "
            "running it again would silently make one longer run of both"
        )
    raise FinishedRunError(
        problem,
        "pass RunSession(resume=True) to continue it (numbering on from "
        "session.resumed), or another run_id (or out_dir) for a new run",
        run_id=run_id,
    )


def check_resumed_config(
    config: Mapping[str, Any],
    pm: pluggy.PluginManager,
    started: RunStarted,
    run_id: str,
    log_path: Path,
) -> None:
    """A resuming session's configuration may differ from the run's only where a resume
    may change it (``total_steps``, ``x_`` keys: :func:`~twinkle.run.resumable_key`);
    else :class:`~twinkle.errors.ResumeConfigError` names the keys, both values and the
    fix (a caller that builds the configuration says its own: ``with_fix``)."""
    given = check_config(config, pm)
    logged = cast("dict[str, Any]", read_back(dict(started.config)))
    keys = refused_config_keys(logged, given)
    if not keys:
        return
    raise ResumeConfigError(
        f"run {run_id!r} cannot resume with this configuration: it differs from the one "
        f"the run was started with at {list(keys)} "
        f"({describe_config_changes(keys, logged, given)}), and a resumed run may "
        f"change only {RESUMABLE_CONFIG}",
        f"pass RunSession(config=...) the run's configuration (the config of the "
        f"run_started line of {str(log_path)!r}), or start a new run with another run_id "
        "(or out_dir)",
        run_id=run_id,
        keys=keys,
        logged=logged,
        given=given,
    )


def _logged_already(event: Any) -> None:
    """The bus's receiver while a resumed run's logged events go by again."""
    log.debug("dropped %s published while resuming: the log holds it", event.TYPE)
