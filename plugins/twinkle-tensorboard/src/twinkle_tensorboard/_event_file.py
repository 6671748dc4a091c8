"""One TensorBoard event file of float64 scalars: tensorboardX's TFRecord framing and
protos. Imported by :meth:`~twinkle_tensorboard.TensorBoardBackend.open` (on the
backend's own thread in a twinkle run), never with the plugin: loading the plugin, at
every run's start, costs no tensorboardX import."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboardX.proto.tensor_pb2 import TensorProto
from tensorboardX.proto.types_pb2 import DT_DOUBLE
from tensorboardX.record_writer import masked_crc32c

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
    first event of each tag).

    Each event is one TFRecord frame, written whole or not at all: a write that fails
    part-way (a full disk) cuts the file back to the frames before it, since TensorBoard
    stops reading an event file at a frame cut short, and every later event would be
    lost to it. The frames go straight to the file (no buffer that could hold a part
    of one for a later write)."""

    __slots__ = ("_fd", "_size", "_tagged", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        # (created 0666 less the umask, then its group and others' write taken away)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags, 0o666)
        self._size = 0  # the bytes of the whole frames written
        self._tagged: set[str] = set()  # tags whose scalar metadata is in the file
        try:
            remove_shared_write(path)
            self._write(Event(wall_time=time.time(), file_version=_FILE_VERSION))
        except BaseException:
            os.close(self._fd)
            raise

    def write_scalars(
        self, step: int, wall_time: float, scalars: Iterable[tuple[str, float]]
    ) -> None:
        """One event of ``scalars`` (tag, value) at ``step`` and ``wall_time`` (s); none
        when there is no scalar."""
        pairs = list(scalars)
        if not pairs:
            return
        values = [self._value(tag, value) for tag, value in pairs]
        self._write(Event(summary=Summary(value=values), step=step, wall_time=wall_time))
        self._tagged.update(tag for tag, _ in pairs)  # (once the event is in the file)

    def flush(self) -> None:
        """Make what was written durable (fsynced)."""
        os.fsync(self._fd)

    def close(self) -> None:
        """Flush, then close the file."""
        try:
            self.flush()
        finally:
            os.close(self._fd)

    def _write(self, event: Event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        frame = b"".join(
            (header, _crc(header), data, _crc(data))
        )  # TFRecord: length, its masked CRC-32C, the bytes, theirs
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:
            os.ftruncate(self._fd, self._size)  # (appends go on from there: O_APPEND)
            raise
        self._size += len(frame)

    def _value(self, tag: str, value: float) -> Summary.Value:
        tensor = TensorProto(dtype=DT_DOUBLE, double_val=[value])
        if tag in self._tagged:
            return Summary.Value(tag=tag, tensor=tensor)
        return Summary.Value(tag=tag, tensor=tensor, metadata=_SCALAR)


def _crc(data: bytes) -> bytes:
    return struct.pack("<I", masked_crc32c(data))
