"""TensorBoard for twinkle: every record of a run as TensorBoard scalars.

Installed, this plugin is loaded by every twinkle run of the environment (it registers
the observer ``tensorboard`` in the entry-point group ``twinkle.observers``); each run
then writes ``runs/<run_id>/tensorboard/``, and ``tensorboard --logdir runs`` shows
every run. Leave it out of one run with ``--block tensorboard`` (``blocked=
["tensorboard"]``), of all with ``TWINKLE_DISABLE_PLUGIN_AUTOLOAD=1``.

**Tags and steps.** Each value of a record is the scalar its
:func:`~twinkle.reporting.flat_key` names, ``<kind>/<key>`` for an iteration's record
(``rollout/tokens_per_s_per_device``, ``timing/window_idle_seconds``,
``grpo/reward_mean``: the names of ``metrics_raw.jsonl``), at global step = the record's
optimizer step, at the record's wall time. The run's and the windows' records give
``run/<kind>/<key>`` and ``window/<kind>/<key>``, at the run's last step. A ``None``
(a figure with nothing to measure) is left out, never written as 0, and so are the
figures of an iteration a crash or an error cut short before its step
(:func:`~twinkle.reporting.cut_short`: a second point at the step before it would draw
a false drop); they stay in ``metrics_raw.jsonl`` and the report.

**Exact values.** Each value is a float64 tensor with the scalar plugin's metadata, which
TensorBoard shows as a scalar like any other. The usual ``simple_value`` is a float32:
it would round a peak of 359,432,192 bytes to a multiple of 32, and a token count past
2**24 to an even number; here every figure reads back as the run recorded it (integers
exactly up to 2**53).

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`TensorBoardBackend`), which the run calls on a thread of the backend's own
(:class:`~twinkle.reporting.IsolatedBackend`): the training thread never builds a
protobuf or waits on the disk. Loading the plugin imports no tensorboardX: the backend's
:meth:`~TensorBoardBackend.open`, on that thread, imports it and creates the event file,
so the run's start waits for neither. A directory the plugin cannot use
(``runs/<run_id>/tensorboard`` is a file) leaves the plugin out of the run at its start:
named on stderr and in ``summary.json`` (``plugins_left_out``); an event file it cannot
create leaves its backend out (``summary.json`` → ``backends`` → ``tensorboard`` →
``setup_error``); a write that raises is logged with the backend's name, counted there
(``records_failed``, ``calls_failed``) and skipped. The run goes on, and every record
stays in ``metrics_raw.jsonl``; a run that requires the plugin (``--require-plugin
tensorboard``, ``RunSession(required_plugins=["tensorboard"])``) fails its start instead.

**Resume and replay.** A resumed run (a restarted job on the same run directory) writes
every record again, the earlier segments' first, into a new file under a hidden name
TensorBoard does not read; once the first record of the new segment is written, the
file takes its event-file name and the earlier event files are removed. So each record
is in the directory once, and none that a crash kept from being written is missing.
A resume that fails before its new segment begins removes its own file when its backend
closes, and keeps the others; one that was killed leaves its hidden file, which the next
resume removes. ``twinkle replay RUN --out DIR`` writes the same scalars into
``DIR/tensorboard/``.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from twinkle.errors import ReporterError
from twinkle.events import RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, cut_short, flat_key

if TYPE_CHECKING:  # (imported by open(): loading the plugin imports no tensorboardX)
    from twinkle_tensorboard._event_file import EventFile

__all__ = ["DIR", "EVENT_FILES", "REBUILD_FILES", "TensorBoardBackend", "TensorBoardSink"]

#: the plugin's directory in the run directory
DIR = "tensorboard"
#: the names of TensorBoard's event files (a glob)
EVENT_FILES = "events.out.tfevents.*"
#: a resumed run's rebuild until its new segment begins (TensorBoard does not read it)
_REBUILD = ".twinkle-rebuild"
REBUILD_FILES = f"{_REBUILD}.*"


class TensorBoardBackend:
    """A twinkle reporting backend that writes records into one new TensorBoard event
    file in ``logdir`` (see the module docstring), synchronously: a twinkle run calls it
    on a thread of its own. :meth:`open` creates the file, before the first write.

    ``rebuilding``: the file is a resumed run's rebuild, written under a hidden name
    that TensorBoard does not read (:data:`REBUILD_FILES`) until :meth:`publish_from`'s
    time is reached; it then takes its event-file name and the directory's other event
    files are removed (kept when a write failed: points twice rather than points lost).
    A rebuild whose time never came (the resume failed before its segment began) is
    removed at :meth:`close`, and the older files stay as they were.
    """

    def __init__(self, logdir: Path, *, rebuilding: bool = False) -> None:
        self.logdir = logdir
        self.rebuilding = rebuilding
        # A name of its own: two writers started in one second on one host would
        # otherwise share tensorboardX's name, and the second truncate the first's file.
        suffix = f".twinkle.{os.getpid()}.{secrets.token_hex(4)}"
        #: the file's event-file name (tensorboardX's form: time, host, then the suffix)
        self.event_file = (
            logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        )
        #: where the file is now: its hidden name while it is a rebuild
        self.path = logdir / f"{_REBUILD}{suffix}" if rebuilding else self.event_file
        self.name = f"TensorBoardBackend({str(logdir)!r})"
        self.closed = False
        self.failed = False  # a write raised: the file lacks records
        self._file: EventFile | None = None
        self._publish_from: int | None = None

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` created the file."""
        return self._file is not None

    def open(self) -> None:
        """Import tensorboardX and create the event file (a rebuild under its hidden
        name, after removing those a killed resume left). A twinkle run calls it on the
        backend's own thread, so the run's start waits for neither."""
        if self._file is not None or self.closed:
            return
        from twinkle_tensorboard._event_file import EventFile

        try:
            if self.rebuilding:  # a resume killed before its new segment began left these
                for stale in self.logdir.glob(REBUILD_FILES):
                    stale.unlink(missing_ok=True)
            self._file = EventFile(self.path)
        except OSError as exc:
            raise _cannot_write(self.logdir, exc) from exc

    def publish_from(self, monotonic_ns: int) -> None:
        """Put the rebuild in place once a record made at or after ``monotonic_ns`` (bus
        clock: the new segment began) is written, or at close."""
        self._publish_from = monotonic_ns

    def write(self, records: Sequence[MetricRecord]) -> None:
        file = self._opened()
        try:
            for record in records:
                if cut_short(record):
                    continue
                file.write_scalars(
                    record.step,
                    record.wall_ns / 1e9,
                    (
                        (flat_key(record, key), float(value))
                        for key, value in record.values.items()
                        if value is not None
                    ),
                )
        except BaseException:
            self.failed = True
            raise
        since = self._publish_from
        if since is not None and any(r.monotonic_ns >= since for r in records):
            self._publish(file)

    def _opened(self) -> EventFile:
        if self._file is None:
            raise ReporterError(
                f"{self.name} is not open: call its open() before writing (a twinkle run "
                "does, on the backend's own thread)"
            )
        return self._file

    def _publish(self, file: EventFile) -> None:
        """The rebuild holds what the older files did: make it durable, give it its
        event-file name, then remove them."""
        self._publish_from = None
        file.flush()  # (fsyncs)
        os.replace(self.path, self.event_file)
        self.path = self.event_file
        if not self.failed:
            for older in self.logdir.glob(EVENT_FILES):
                if older != self.event_file:
                    older.unlink(missing_ok=True)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        file = self._file
        if file is None:
            return  # never opened: no file
        try:
            if self._publish_from is not None and self.path != self.event_file:
                self._publish(file)  # (the new segment began but made no record)
        finally:
            file.close()
        if self.path != self.event_file:  # the resume failed before its segment began
            self.path.unlink(missing_ok=True)


class TensorBoardSink:
    """The observer: gives each run that writes files a :class:`TensorBoardBackend` in
    ``<run dir>/tensorboard/`` and, on resume, tells it when the new segment begins."""

    def __init__(self) -> None:
        self._backend: TensorBoardBackend | None = None
        self._segment = 0  # the segment a resumed run begins; 0 once it began (or none)

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[TensorBoardBackend] | None:
        if context.out_dir is None:
            return None
        logdir = context.out_dir / DIR
        try:  # (quick, and a path that is a file is best named at the start)
            logdir.mkdir(mode=0o755, exist_ok=True)  # (twinkle's modes, less the umask)
        except OSError as exc:
            raise _cannot_write(logdir, exc) from exc
        rebuilding = context.resumed_events > 0
        self._backend = TensorBoardBackend(logdir, rebuilding=rebuilding)
        self._segment = context.segment if rebuilding else 0
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # (an earlier segment's run_resumed goes by again first: not this one)
        if self._backend is not None and self._segment and event.segment == self._segment:
            self._segment = 0
            self._backend.publish_from(event.monotonic_ns)

    @hookimpl
    def twinkle_checkpoint_state(self) -> None:
        """Nothing to keep: the resumed run's backend is made for its segment, and a
        resume from the run's checkpoint hands it the earlier records from
        ``metrics_raw.jsonl`` (a restart need not feed the whole log again)."""
        return None

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        # The run's reporter closed the backend, which removed a rebuild whose segment
        # never began: nothing of the plugin's own is left to close.
        self._backend = None


def _cannot_write(logdir: Path, exc: OSError) -> ReporterError:
    """The error of an event file that cannot be written in ``logdir``: why, and the fix."""
    return ReporterError(
        f"cannot write TensorBoard's event file in {str(logdir)!r} "
        f"({exc.strerror or exc}): make it a writable directory, or leave the "
        "plugin out of the run (--block tensorboard)"
    )
