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
2**24 to an even number; here every figure reads back as the run recorded it.

**Where the work happens.** The plugin gives the run's reporter a backend
(:class:`TensorBoardBackend`). The reporter hands it the records on its writer thread, in
``seq`` order, so the training thread never builds a protobuf or waits on the disk; a
write that raises is the reporter's backend failure (logged with the backend's name,
counted in ``summary.json``, skipped), and every record stays in ``metrics_raw.jsonl``.

**Resume and replay.** A resumed run (a restarted job on the same run directory) writes
every record again, the earlier segments' first, into a new event file; once the first
record of the new segment is written, the earlier event files are removed, so each
record is in the directory once, and none a crash had not flushed is missing. A resume
that fails before its new segment begins removes its own file and keeps the others.
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

__all__ = ["DIR", "EVENT_FILES", "TensorBoardBackend", "TensorBoardSink"]

#: the plugin's directory in the run directory
DIR = "tensorboard"
#: the names of TensorBoard's event files (a glob)
EVENT_FILES = "events.out.tfevents.*"

#: TensorBoard's scalar plugin reads a tensor carrying this as a scalar
_SCALAR = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))


class TensorBoardBackend:
    """A twinkle reporting backend that writes records into one new TensorBoard event
    file in ``logdir`` (see the module docstring), synchronously: the run's reporter
    already calls it on its own writer thread.

    ``replaces_before``: once a record at or after this bus time (ns) is written, remove
    the directory's other event files (a resumed run's rebuild is then complete).
    """

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        # A name of its own: two writers started in one second on one host would
        # otherwise share tensorboardX's name, and the second truncate the first's file.
        suffix = f".twinkle.{os.getpid()}.{secrets.token_hex(4)}"
        self._writer = EventsWriter(str(logdir / "events"), suffix)
        self.path = next(logdir.glob(f"events.out.tfevents.*{suffix}"))
        self.name = f"TensorBoardBackend({str(self.path)!r})"
        self.replaces_before: int | None = None
        self.closed = False
        self._tagged: set[str] = set()  # tags whose scalar metadata is in the file

    def write(self, records: Sequence[MetricRecord]) -> None:
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
        cut = self.replaces_before
        if cut is not None and any(r.monotonic_ns >= cut for r in records):
            self._replace_older()

    def _value(self, name: str, value: float) -> Summary.Value:
        tensor = TensorProto(dtype=DT_DOUBLE, double_val=[value])
        if name in self._tagged:
            return Summary.Value(tag=name, tensor=tensor)
        self._tagged.add(name)
        return Summary.Value(tag=name, tensor=tensor, metadata=_SCALAR)

    def _replace_older(self) -> None:
        """The rebuilt file holds what the older ones did: make it durable, then remove
        them."""
        self.replaces_before = None
        self._writer.flush()  # (fsyncs)
        for older in self.logdir.glob(EVENT_FILES):
            if older != self.path:
                older.unlink(missing_ok=True)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()


class TensorBoardSink:
    """The observer: gives each run that writes files a :class:`TensorBoardBackend` in
    ``<run dir>/tensorboard/`` and, on resume, tells it when the new segment begins."""

    def __init__(self) -> None:
        self._backend: TensorBoardBackend | None = None
        self._resuming = False

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[TensorBoardBackend] | None:
        if context.out_dir is None:
            return None
        logdir = context.out_dir / DIR
        try:
            logdir.mkdir(exist_ok=True)
            self._backend = TensorBoardBackend(logdir)
        except OSError as exc:
            raise ReporterError(
                f"cannot write TensorBoard's event file in {str(logdir)!r} "
                f"({exc.strerror or exc}): make it a writable directory, or leave the "
                "plugin out of the run (--block tensorboard)"
            ) from exc
        self._resuming = context.resumed_events > 0
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        if self._backend is not None and self._resuming:
            self._resuming = False
            self._backend.replaces_before = event.monotonic_ns

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        backend, self._backend = self._backend, None
        if backend is None:
            return
        backend.close()  # (the reporter closed it, unless the run's start failed first)
        if self._resuming:  # the resume failed before its segment began: keep the older
            backend.path.unlink(missing_ok=True)
