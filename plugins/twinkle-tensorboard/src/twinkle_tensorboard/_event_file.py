"""One TensorBoard event file of float64 scalars: tensorboardX's TFRecord framing and
protos. Imported by :meth:`~twinkle_tensorboard.TensorBoardBackend.open` (on the
backend's own thread in a twinkle run), never with the plugin: loading the plugin, at
every run's start, costs no tensorboardX import."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboardX.proto.tensor_pb2 import TensorProto
from tensorboardX.proto.types_pb2 import DT_DOUBLE
from tensorboardX.record_writer import RecordWriter

from twinkle.reporting import remove_shared_write

__all__ = ["EventFile"]

#: TensorBoard's scalar plugin reads a tensor carrying this as a scalar
_SCALAR = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
#: the first event of every event file (what tensorboardX's ``EventsWriter`` writes)
_FILE_VERSION = "brain.Event:2"


class EventFile:
    """A new event file at ``path``, created here under that very name (a rebuild's
    hidden name is never, even for a moment, a name TensorBoard reads), writable by its
    owner alone. Scalars are float64 tensors with the scalar plugin's metadata (in the
    first event of each tag)."""

    __slots__ = ("_tagged", "_writer", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = RecordWriter(str(path))  # (creates it, 0666 less the umask)
        self._tagged: set[str] = set()  # tags whose scalar metadata is in the file
        try:
            remove_shared_write(path)
            self._write(Event(wall_time=time.time(), file_version=_FILE_VERSION))
        except BaseException:
            self._writer.close()
            raise

    def write_scalars(
        self, step: int, wall_time: float, scalars: Iterable[tuple[str, float]]
    ) -> None:
        """One event of ``scalars`` (tag, value) at ``step`` and ``wall_time`` (s); none
        when there is no scalar."""
        values = [self._value(tag, value) for tag, value in scalars]
        if values:
            self._write(Event(summary=Summary(value=values), step=step, wall_time=wall_time))

    def flush(self) -> None:
        """Make what was written durable (flushed and fsynced)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush, then close the file."""
        try:
            self._writer.flush()
        finally:
            self._writer.close()

    def _write(self, event: Event) -> None:
        self._writer.write(event.SerializeToString())

    def _value(self, tag: str, value: float) -> Summary.Value:
        tensor = TensorProto(dtype=DT_DOUBLE, double_val=[value])
        if tag in self._tagged:
            return Summary.Value(tag=tag, tensor=tensor)
        self._tagged.add(tag)
        return Summary.Value(tag=tag, tensor=tensor, metadata=_SCALAR)
