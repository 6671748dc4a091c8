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
(a figure with nothing to measure) is left out, never written as 0.

**Exact values.** Each value is a float64 tensor with the scalar plugin's metadata, which
TensorBoard shows as a scalar like any other. The usual ``simple_value`` is a float32:
it would round a peak of 359,432,192 bytes to a multiple of 32, and a token count past
2**24 to an even number; here every figure reads back as the run recorded it (integers
exactly up to 2**53).

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`TensorBoardBackend`). The reporter hands it the records on its writer thread, in
``seq`` order, so the training thread never builds a protobuf or waits on the disk; a
write that raises is the reporter's backend failure (logged with the backend's name,
counted in ``summary.json``, skipped), and every record stays in ``metrics_raw.jsonl``.

**Resume and replay.** A resumed run (a restarted job on the same run directory) writes
every record again, the earlier segments' first, into a new file under a hidden name
TensorBoard does not read; once the first record of the new segment is written, the
file takes its event-file name and the earlier event files are removed. So each record
is in the directory once, and none that a crash kept from being written is missing.
A resume that fails before its new segment begins removes its own file and keeps the
others; one that was killed leaves its hidden file, which the next resume removes.
``twinkle replay RUN --out DIR`` writes the same scalars into ``DIR/tensorboard/``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboardX.proto.tensor_pb2 import TensorProto
from tensorboardX.proto.types_pb2 import DT_DOUBLE

from twinkle.errors import ReporterError
from twinkle.events import RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, flat_key

__all__ = ["DIR", "EVENT_FILES", "REBUILD_FILES", "TensorBoardBackend", "TensorBoardSink"]

#: the plugin's directory in the run directory
DIR = "tensorboard"
#: the names of TensorBoard's event files (a glob)
EVENT_FILES = "events.out.tfevents.*"
#: a resumed run's rebuild until its new segment begins (TensorBoard does not read it)
_REBUILD = ".twinkle-rebuild"
REBUILD_FILES = f"{_REBUILD}.*"

#: TensorBoard's scalar plugin reads a tensor carrying this as a scalar
_SCALAR = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))


class TensorBoardBackend:
    """A twinkle reporting backend that writes records into one new TensorBoard event
    file in ``logdir`` (see the module docstring), synchronously: the run's reporter
    already calls it on its own writer thread.

    ``rebuilding``: the file is a resumed run's rebuild, written under a hidden name
    that TensorBoard does not read (:data:`REBUILD_FILES`) until :meth:`publish_from`'s
    time is reached; it then takes its event-file name and the directory's other event
    files are removed (kept when a write failed: points twice rather than points lost).
    """

    def __init__(self, logdir: Path, *, rebuilding: bool = False) -> None:
        self.logdir = logdir
        # A name of its own: two writers started in one second on one host would
        # otherwise share tensorboardX's name, and the second truncate the first's file.
        suffix = f".twinkle.{os.getpid()}.{secrets.token_hex(4)}"
        self._writer = EventsWriter(str(logdir / "events"), suffix)
        self.name = f"TensorBoardBackend({str(logdir)!r})"
        self.closed = False
        self.failed = False  # a write raised: the file lacks records
        self._tagged: set[str] = set()  # tags whose scalar metadata is in the file
        self._publish_from: int | None = None
        try:
            self.event_file = next(logdir.glob(EVENT_FILES + suffix))
            self.path = self.event_file  # where it is now
            if rebuilding:  # (the open file is written on under its new name)
                self.path = logdir / f"{_REBUILD}{suffix}"
                os.replace(self.event_file, self.path)
        except BaseException:
            self.closed = True
            self._writer.close()
            raise

    def publish_from(self, monotonic_ns: int) -> None:
        """Put the rebuild in place once a record made at or after ``monotonic_ns`` (bus
        clock: the new segment began) is written, or at close."""
        self._publish_from = monotonic_ns

    def write(self, records: Sequence[MetricRecord]) -> None:
        try:
            for record in records:
                values = [
                    self._value(flat_key(record, key), float(value))
                    for key, value in record.values.items()
                    if value is not None
                ]
                if values:
                    event = Event(
                        summary=Summary(value=values),
                        step=record.step,
                        wall_time=record.wall_ns / 1e9,
                    )
                    self._writer.write_event(event)
        except BaseException:
            self.failed = True
            raise
        since = self._publish_from
        if since is not None and any(r.monotonic_ns >= since for r in records):
            self._publish()

    def _value(self, name: str, value: float) -> Summary.Value:
        tensor = TensorProto(dtype=DT_DOUBLE, double_val=[value])
        if name in self._tagged:
            return Summary.Value(tag=name, tensor=tensor)
        self._tagged.add(name)
        return Summary.Value(tag=name, tensor=tensor, metadata=_SCALAR)

    def _publish(self) -> None:
        """The rebuild holds what the older files did: make it durable, give it its
        event-file name, then remove them."""
        self._publish_from = None
        self._writer.flush()  # (fsyncs)
        os.replace(self.path, self.event_file)
        self.path = self.event_file
        if not self.failed:
            for older in self.logdir.glob(EVENT_FILES):
                if older != self.event_file:
                    older.unlink(missing_ok=True)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self._publish_from is not None and self.path != self.event_file:
                self._publish()  # (the new segment began but made no record)
        finally:
            self._writer.close()


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
        rebuilding = context.resumed_events > 0
        try:
            logdir.mkdir(exist_ok=True)
            if rebuilding:  # a resume killed before its new segment began left these
                for stale in logdir.glob(REBUILD_FILES):
                    stale.unlink(missing_ok=True)
            self._backend = TensorBoardBackend(logdir, rebuilding=rebuilding)
        except OSError as exc:
            raise ReporterError(
                f"cannot write TensorBoard's event file in {str(logdir)!r} "
                f"({exc.strerror or exc}): make it a writable directory, or leave the "
                "plugin out of the run (--block tensorboard)"
            ) from exc
        self._segment = context.segment if rebuilding else 0
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        # (an earlier segment's run_resumed goes by again first: not this one)
        if self._backend is not None and self._segment and event.segment == self._segment:
            self._segment = 0
            self._backend.publish_from(event.monotonic_ns)

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        backend, self._backend = self._backend, None
        if backend is None:
            return
        backend.close()  # (the reporter closed it, unless the run's start failed first)
        if self._segment:  # the resume failed before its segment began: keep the older
            backend.path.unlink(missing_ok=True)
