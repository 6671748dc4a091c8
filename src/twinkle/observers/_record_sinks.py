"""The record-file sinks: ``metrics_raw.jsonl`` (:class:`RawRecordsSink`) and the WebUI
flat file ``metrics.jsonl`` (:class:`WebUISink`), each rebuilt whole when the run resumes
(from a checkpoint: its head copied, the rest written again)."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from twinkle.errors import ReporterError
from twinkle.events import RunResumed
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.observers._builtin import BuiltinObserver
from twinkle.observers._config import ObserverConfig
from twinkle.reporting import (
    Backend,
    JsonlBackend,
    JsonlFileBackend,
    WebUIFlatBackend,
    open_regular,
)

__all__ = ["RAW_FILE", "WEBUI_FILE", "RawRecordsSink", "WebUISink"]

log = logging.getLogger("twinkle.observers")

RAW_FILE = "metrics_raw.jsonl"
WEBUI_FILE = "metrics.jsonl"


class _FileBackendSink(BuiltinObserver):
    """A sink of one record file: its backend is opened at configure, so that a file
    that cannot be opened (a directory, a symlink, no permission) fails the run's start
    with a :class:`~twinkle.errors.ReporterError` naming it, and handed to the run's
    reporter (which closes it).

    A resumed run (``RunContext.resumed_events > 0``) writes the file again, whole (the
    observers see the logged events again first): into a new file beside it
    (``.<name>.resume.<pid>.tmp``). Once ``run_resumed`` begins the new segment
    (``RunContext.segment``: not an earlier segment's ``run_resumed``, fed again), the
    new file takes the old one's place as soon as it holds at least as many lines,
    fsynced (:meth:`~twinkle.reporting.JsonlFileBackend.replace_when_complete`): the
    records of the logged events may still be on their way to it, and the WebUI file
    holds its newest lines back. So a resume that fails before the new segment (a log it
    cannot read, Ctrl-C) leaves the file as it was, and one killed at any moment after
    leaves it, or a file holding at least as much, in place: never fewer records.

    A resume from a checkpoint (``RunContext.checkpoint``) begins the new file with the
    lines the checkpoint covers, copied (a WebUI file's with the new ``total_steps``
    when the resume changed it). When the file holds those lines and nothing after them
    (a segment that finished, or was killed before writing more), and they stay as
    they are, the new records are appended to the file itself: nothing is copied; a
    resume that fails before the new segment then cuts the file back to those lines."""

    FILE = ""

    def __init__(self) -> None:
        self._backend: JsonlFileBackend | None = None
        # on resume: (new file, the file, the lines the file holds)
        self._rebuilding: tuple[Path, Path, int] | None = None
        # on resume in place: (the file, the size it had), until the new segment begins
        self._in_place: tuple[Path, int] | None = None
        self._segment = 0  # the segment this session begins

    def _open(self, path: Path, context: RunContext) -> JsonlFileBackend:
        raise NotImplementedError  # pragma: no cover - each sink opens its file

    def _open_for(self, context: RunContext) -> JsonlFileBackend:
        assert context.out_dir is not None
        path = context.out_dir / self.FILE
        if context.resumed_events == 0:
            return self._open(path, context)
        mark = None if context.checkpoint is None else context.checkpoint.files[self.FILE]
        plan = None if mark is None else self._new_plan(context)
        if mark is not None and plan is None and _holds_just(path, mark):
            # The file is the checkpoint's lines, as this session writes them: the new
            # records follow them in it (nothing copied, nothing to replace)
            _remove_stale(path)
            backend = self._open(path, context)
            backend.held_before = mark.lines
            self._in_place = (path, mark.size)
            self._segment = context.segment
            return backend
        # The file a checkpoint marks, opened before the stale files go (a killed
        # segment's rebuild may be it)
        source = None if mark is None else open_regular(path.parent / mark.path)
        with source or contextlib.nullcontext():
            _remove_stale(path)
            new = path.with_name(f".{path.name}.resume.{os.getpid()}.tmp")
            head = 0
            lines = None
            if source is not None and mark is not None:  # the lines the checkpoint covers
                if plan is None:
                    _copy_head(source, new, mark.size)
                else:
                    _copy_replanned(source, new, mark.size, plan)
                head = mark.lines
                if mark.path == path.name:  # (the file itself: count only what follows)
                    lines = head + _count_lines(path, mark.size)
            if lines is None:
                lines = _count_lines(path)
        self._rebuilding = (new, path, lines)
        self._segment = context.segment
        backend = self._open(new, context)
        backend.held_before = head
        return backend

    def _new_plan(self, context: RunContext) -> int | None:
        """The ``total_steps`` the lines a checkpoint covers get in this session, when
        they carry one and it changed (None: they stay as they are)."""
        return None

    def head(self) -> tuple[Path, int] | None:
        """The file the records go to now and the lines it holds (once the reporter
        handed them over: a checkpoint marks them); None when lines a failed write left
        in memory are in neither."""
        backend = self._backend
        if backend is None or backend.writer.unwritten_records:
            return None
        return backend.writer.path, backend.held_lines

    def checkpoint_state(self) -> dict[str, Any]:
        """What the sink holds back from its file, for a checkpoint (none)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take :meth:`checkpoint_state` back into the new file's backend."""

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if context.out_dir is not None:
            self._backend = self._open_for(context)

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Backend] | None:
        if context.out_dir is None:
            return None
        if self._backend is None:
            self._backend = self._open_for(context)
        return [self._backend]

    @hookimpl
    def twinkle_run_resumed(self, event: RunResumed) -> None:
        if event.segment != self._segment:
            return  # (an earlier segment's, fed again: the resume is not complete)
        self._in_place = None
        if self._rebuilding is None:
            return
        rebuilding, self._rebuilding = self._rebuilding, None
        _, path, lines = rebuilding
        if self._backend is not None:
            self._backend.replace_when_complete(path, lines)

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        backend, self._backend = self._backend, None
        # The reporter closed it, unless the run failed to start before it had one.
        if backend is not None and not backend.writer.closed:
            backend.close()
        rebuilding, self._rebuilding = self._rebuilding, None
        if rebuilding is not None:  # the resume failed: the file stays as it was
            rebuilding[0].unlink(missing_ok=True)
        in_place, self._in_place = self._in_place, None
        if in_place is not None:  # the resume failed: the file is cut back to the mark
            try:
                os.truncate(*in_place)
            except OSError as exc:  # (the resume's own error is the one to raise)
                log.warning(
                    "cannot cut %s back to the %d bytes its checkpoint covers (%s): the "
                    "next resume rebuilds it from the event log",
                    in_place[0],
                    in_place[1],
                    exc.strerror or exc,
                )


def _holds_just(path: Path, mark: Any) -> bool:
    """Whether ``path`` is the file a checkpoint's ``mark`` names and holds nothing after
    the lines it covers."""
    try:
        return bool(mark.path == path.name and path.stat().st_size == mark.size)
    except FileNotFoundError:
        return False


def _remove_stale(path: Path) -> None:
    """Remove the new files of resumes killed before their rename (the run directory is
    this process's: no live process is writing one)."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.resume.*.tmp"):
        stale.unlink(missing_ok=True)


def _copy_head(source: BinaryIO, target: Path, size: int) -> None:
    """``target`` made to hold the first ``size`` bytes of ``source`` (copied by the
    kernel where it can)."""
    with target.open("wb") as dst:
        left = size
        copy_range = getattr(os, "copy_file_range", None)  # (Linux's)
        try:
            if copy_range is None:
                raise OSError("no copy_file_range")
            while left > 0 and (n := copy_range(source.fileno(), dst.fileno(), left)):
                left -= n
        except OSError:  # (a file system, kernel or platform without it: by hand)
            source.seek(size - left)
            while left > 0 and (chunk := source.read(min(left, 1 << 20))):
                dst.write(chunk)
                left -= len(chunk)
    if left:
        raise ReporterError(
            f"{source.name!r} is shorter than the checkpoint it resumes from says: "
            "it changed while the run resumed; start the run again"
        )


#: the beginning of a WebUI line (:class:`~twinkle.reporting.WebUIFlatBackend`'s), up to
#: its ``total_steps`` value
_PLAN = re.compile(rb'\{"ts":[^,]*,"step":-?[0-9]+,"total_steps":([0-9]+)[,}]')


def _copy_replanned(source: BinaryIO, target: Path, size: int, total_steps: int) -> None:
    """``target`` made to hold the first ``size`` bytes of the WebUI file ``source`` with
    each line's ``total_steps`` value made ``total_steps`` (every other byte as it is)."""
    plan = str(total_steps).encode()
    source.seek(0)
    left = size
    with target.open("wb") as dst:
        for number, line in enumerate(source, 1):
            if left <= 0:
                break
            left -= len(line)
            found = _PLAN.match(line)
            if left < 0 or not line.endswith(b"\n") or found is None:
                raise ReporterError(
                    f"{source.name!r} line {number} is not a line twinkle wrote (or the "
                    "file changed while the run resumed): move checkpoint.bin out of the "
                    "run directory to rebuild every output from the event log"
                )
            dst.write(line[: found.start(1)] + plan + line[found.end(1) :])
    if left > 0:
        raise ReporterError(
            f"{source.name!r} is shorter than the checkpoint it resumes from says: it "
            "changed while the run resumed; start the run again"
        )


def _count_lines(path: Path, start: int = 0) -> int:
    """The complete lines of ``path`` from byte ``start`` on (0 when there is no such
    file)."""
    try:
        with open_regular(path) as file:
            file.seek(start)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise ReporterError(
            f"cannot read {str(path)!r} to rebuild it ({exc.strerror or exc}): make it a "
            "readable file, or move it away (replay rebuilds it)"
        ) from exc


def _appends(context: RunContext) -> bool:
    """Whether a record file is appended to: a new run's, or a resume's from a
    checkpoint (its new file begins with the lines the checkpoint covers)."""
    return context.resumed_events == 0 or context.checkpoint is not None


class RawRecordsSink(_FileBackendSink):
    """Every record, as written by the run's reporter, in ``metrics_raw.jsonl``
    (rebuilt whole when the run resumes)."""

    FILE = RAW_FILE

    def _open(self, path: Path, context: RunContext) -> JsonlFileBackend:
        return JsonlBackend(path, append=_appends(context))


class WebUISink(_FileBackendSink):
    """One flat numeric object per iteration in ``metrics.jsonl`` (``ts``, ``step``,
    ``total_steps``, ``iteration``, then ``<kind>/<key>`` values); rebuilt whole when
    the run resumes, like ``metrics_raw.jsonl``."""

    FILE = WEBUI_FILE

    def checkpoint_state(self) -> dict[str, Any]:
        """The newest iterations' lines, held back for more records."""
        backend = self._backend
        assert isinstance(backend, WebUIFlatBackend)
        return backend.open_lines()

    def restore(self, state: dict[str, Any]) -> None:
        backend = self._backend
        assert isinstance(backend, WebUIFlatBackend)
        backend.reopen_lines(state)

    def _new_plan(self, context: RunContext) -> int | None:
        """A resume that plans another ``total_steps`` than the checkpoint's segment did
        gives the copied lines the new plan (as a resume from the whole log writes them:
        every line carries the newest)."""
        total_steps = ObserverConfig.parse(context.config).total_steps
        before = ObserverConfig.parse(context.checkpoint.segment_config()).total_steps
        return None if total_steps == before else total_steps

    def _open(self, path: Path, context: RunContext) -> JsonlFileBackend:
        config = ObserverConfig.parse(context.config)
        # An iteration's timing and throughput come lag + 1 boundaries after it began.
        return WebUIFlatBackend(
            path,
            total_steps=config.total_steps,
            hold=config.finalise_lag + 2,
            append=_appends(context),
        )
