"""Checkpoints: the observers' state, so that a resume feeds them only the log's tail
(docs/metrics.md, "Resuming from a checkpoint").

A running segment writes ``checkpoint.bin`` beside its log at an iteration boundary
every :data:`~twinkle.run._checkpointing.CHECKPOINT_EVERY` events, and a segment that finishes
once more at its end, last (after the summary), each durably: a JSON header line, then
the state, pickled (read back by :mod:`twinkle.run._state_pickle`). The header says what
the state covers: the log's first ``events`` events (``log_bytes`` bytes), the record
files' and the trace's first bytes and lines, and a digest of the last bytes of each,
so that a resume can tell the files still begin as they did.

A resume uses it only when everything agrees: the same format, the same twinkle code
(a digest of its sources) and Python, the same run, the same observers (twinkle's
own, and plugins that keep their state through ``twinkle_checkpoint_state``, with the
same code; any other plugin rebuilds its outputs from the events it sees), the state's digest,
and each file's length and digest. Anything else, it says why and feeds the whole log
again, as a resume without a checkpoint does: never a wrong figure; but an event log
that holds the bytes its checkpoint covers, ending otherwise, was edited, and is
refused (:func:`log_edited`); a checkpoint whose log was cut short, or is gone, is
removed before the log is written again (:func:`drop_stale`). One digest covers
the header and the state together (a changed count in the header is as much a
different checkpoint as a changed state). The state is read by an unpickler that only
makes twinkle's classes and plain Python values.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import io
import os
import pickle
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

import orjson

import twinkle
from twinkle.errors import PluginError
from twinkle.hookspecs import RunContext
from twinkle.observers import (
    EVENTS_FILE,
    TIMELINE,
    EventLogSink,
    RawRecordsSink,
    TimelineObserver,
    TraceSink,
    WebUISink,
)
from twinkle.reporting import ReplacingFile, json_object, open_regular, sync_dir
from twinkle.run._state_pickle import read_state

__all__ = [
    "CHECKPOINT_FILE",
    "NO_CHECKPOINT",
    "Checkpoint",
    "FileMark",
    "code_digest",
    "load",
    "drop_stale",
    "log_edited",
    "log_unlike_checkpoint",
    "mark",
    "observers_of",
    "plugins_without_state",
    "restore_observers",
    "snapshot_observers",
    "write",
]

CHECKPOINT_FILE: Final = "checkpoint.bin"
#: the files a checkpoint marks
MARKED: Final = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "trace.json")
NO_CHECKPOINT: Final = "the run has no checkpoint"
FORMAT: Final = 2
#: the header's key of the digest over the rest of the header and the state
DIGEST: Final = "sha256"
#: the bytes of a file's end that its digest covers
TAIL_BYTES: Final = 64 * 1024
#: the most bytes a checkpoint's header line may take (its file marks and observers'
#: names: a few KiB); a file whose first line is longer is not read further
HEADER_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class FileMark:
    """Where a file stood when the checkpoint was taken: its first ``size`` bytes (``lines``
    lines), the digest of the last :data:`TAIL_BYTES` of them, and the name of the file
    in the run directory that held them (a running segment's trace and rebuilt record
    files are temporary files beside their final names)."""

    size: int
    lines: int
    tail: str
    path: str

    def matches(self, path: Path) -> str | None:
        """None when ``path`` still begins so, else why not."""
        tail = self._tail(path)
        if isinstance(tail, str):
            return tail
        if hashlib.sha256(tail).hexdigest() != self.tail:
            return f"{path.name} no longer begins with the bytes the checkpoint covers"
        return None

    def edited(self, path: Path) -> bool:
        """Whether ``path`` holds the marked bytes' count at least, but other bytes than
        they were at the mark (a line changed, added or removed before it; a file cut
        short is not)."""
        tail = self._tail(path)
        return isinstance(tail, bytes) and hashlib.sha256(tail).hexdigest() != self.tail

    def _tail(self, path: Path) -> bytes | str:
        """The bytes ``path`` holds where the mark's tail was, else why there are none."""
        try:
            with open_regular(path) as f:
                have = os.fstat(f.fileno()).st_size
                if have < self.size:
                    return f"{path.name} holds {have} bytes, fewer than its {self.size}"
                f.seek(max(0, self.size - TAIL_BYTES))
                return f.read(self.size - max(0, self.size - TAIL_BYTES))
        except OSError as exc:
            return f"cannot read {path.name} ({exc.strerror or exc})"


def mark(path: Path, size: int, lines: int) -> FileMark:
    """The :class:`FileMark` of ``path``'s first ``size`` bytes (``lines`` lines)."""
    with path.open("rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read(size - max(0, size - TAIL_BYTES))
    if len(tail) != size - max(0, size - TAIL_BYTES):
        raise OSError(f"{path.name} holds fewer than {size} bytes")
    return FileMark(size, lines, hashlib.sha256(tail).hexdigest(), path.name)


@dataclass(slots=True)
class Checkpoint:
    """What a segment's end left for the next resume: the events it covers and where the
    files stood (``files`` by name: the log, the record files, the trace's part before
    its tail), the scan's figures (:class:`~twinkle.run._session._Scan`'s), the names of
    the observers whose state it holds, and the state (``payload``, pickled)."""

    run_id: str
    events: int
    files: dict[str, FileMark]
    scan: dict[str, Any]
    observers: list[str]
    payload: bytes = field(repr=False)

    _state: dict[str, Any] | None = field(default=None, repr=False)

    def state(self) -> dict[str, Any]:
        """The pickled state, made by :class:`_Unpickler` (once: a caller that changes
        what it holds copies it first)."""
        if self._state is None:
            collecting = gc.isenabled()
            gc.disable()  # (the collector would walk the objects made so far, again and again)
            try:
                self._state = read_state(io.BytesIO(self.payload))
            finally:
                if collecting:
                    gc.enable()
        return self._state

    def segment_config(self) -> Mapping[str, Any]:
        """The configuration of the segment the checkpoint was taken in."""
        config: Mapping[str, Any] = self.state()["segments"][-1].start.config
        return config


def observers_of(pm: Any, *, leaving: Collection[str] = ()) -> list[str] | None:
    """The run's observers, sorted by name, when a checkpoint can hold them all, else
    None: twinkle's own by name, and each plugin that keeps its state through the
    ``twinkle_checkpoint_state`` hook by name and code (:func:`_plugin_code`: a plugin
    changed between the segments makes the checkpoint not fit); a plugin without that
    hook rebuilds its outputs from every event it sees, so the whole log is fed again.
    The names in ``leaving`` (observers the run left out: their state saw no event
    since) are not listed, so that the checkpoint does not fit a run that has them."""
    # (a blocked plugin is listed as None: not the run's)
    named = sorted(
        (item for item in pm.list_name_plugin() if item[1] is not None), key=lambda item: item[0]
    )
    if plugins_without_state(pm):
        return None
    return [
        name if pm.is_builtin(name) else f"{name} ({_plugin_code(plugin)})"
        for name, plugin in named
        if name not in leaving
    ]


def plugins_without_state(pm: Any) -> list[str]:
    """The run's plugins, not twinkle's own, that implement no
    ``twinkle_checkpoint_state`` (a checkpoint cannot hold what they saw), sorted."""
    keeping = _state_hooks(pm, "twinkle_checkpoint_state")
    return sorted(
        name
        for name, plugin in pm.list_name_plugin()
        if plugin is not None and not pm.is_builtin(name) and name not in keeping
    )


def _state_hooks(pm: Any, hook: str, calls: Any = None) -> dict[str, Callable[..., Any]]:
    """Each plugin's implementation of ``hook`` (``twinkle_checkpoint_state`` or
    ``twinkle_restore_state``), by plugin name; as the run's ``calls``
    (:class:`~twinkle.plugins.HookCalls`) make it when given: a plugin's on its own
    thread, within its time, as its other hooks."""
    if calls is not None:
        return {name: function for name, function, _ in calls.plan(hook)}
    return {impl.plugin_name: impl.function for impl in getattr(pm.hook, hook).get_hookimpls()}


def _plugin_code(plugin: object) -> str:
    """A plugin's class as ``module.qualname`` and a digest of its module's source (a
    plugin that is a module: its name and a digest of its source)."""
    if inspect.ismodule(plugin):
        return _code_of(plugin.__name__, "")
    kind = type(plugin)
    return _code_of(kind.__module__, kind.__qualname__)


@cache
def _code_of(module: str, qualname: str) -> str:
    name = f"{module}.{qualname}" if qualname else module
    try:
        source = Path(inspect.getfile(sys.modules[module])).read_bytes()
    except (KeyError, OSError, TypeError):  # (a class made in code, without a file)
        return name
    return f"{name} {hashlib.sha256(source).hexdigest()[:16]}"


#: the sinks whose state is what they hold back from their files
_SINKS = (RawRecordsSink, WebUISink, TraceSink)
#: the key under which a plugin's own state is kept (a plugin's is never a dict of vars)
_PLUGIN_STATE: Final = "twinkle_checkpoint_state"


def snapshot_observers(
    pm: Any, *, leaving: Collection[str] = (), calls: Any = None
) -> dict[str, Any]:
    """Each observer's state (the sinks': what they hold back from their files; the
    event log's none: its file is all of it; a plugin's: what its
    ``twinkle_checkpoint_state`` returns; a plugin without that hook has none here,
    and :func:`observers_of` says the checkpoint does not fit such a run). The plugins
    in ``leaving`` (left out of the run: none of their hooks is called again) have none
    either: the checkpoint does not list them. ``calls``: the run's hook calls, which
    call the plugins' hooks (:func:`_state_hooks`)."""
    states: dict[str, Any] = {}
    keeping = _state_hooks(pm, "twinkle_checkpoint_state", calls)
    restoring = _state_hooks(pm, "twinkle_restore_state", calls)
    for name, plugin in pm.list_name_plugin():
        if plugin is None or name in leaving:  # blocked, or left out
            continue
        if not pm.is_builtin(name):
            if name in keeping:
                states[name] = {
                    _PLUGIN_STATE: _kept(name, _call_kept(name, keeping[name]), name in restoring)
                }
        elif isinstance(plugin, _SINKS):
            states[name] = plugin.checkpoint_state()
        elif not isinstance(plugin, EventLogSink):
            states[name] = dict(vars(plugin))
    return states


def _call_kept(name: str, hook: Callable[[], object]) -> object:
    """What plugin ``name``'s ``twinkle_checkpoint_state`` returns; what it raises, as
    a :class:`~twinkle.errors.PluginError` naming it (no checkpoint is taken)."""
    try:
        return hook()
    except Exception as exc:  # (a plugin's fault is the plugin's)
        raise PluginError(
            f"plugin {name!r}: its twinkle_checkpoint_state raised {type(exc).__name__}: {exc}"
        ) from exc


def _kept(name: str, state: object, restorable: bool) -> object:
    """The state plugin ``name``'s ``twinkle_checkpoint_state`` returned, when a
    checkpoint can give it back (read back as a resume reads it: plain Python values and
    twinkle's only), else a :class:`~twinkle.errors.PluginError` naming the plugin and
    the fix (this checkpoint is not taken: a resume starts from an earlier one, or
    feeds the whole log)."""
    if state is None:
        return None
    why = None
    if not restorable:
        why = "it implements no twinkle_restore_state to take it back: add one"
    else:
        try:
            read_state(io.BytesIO(pickle.dumps(state, pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:  # (whatever pickling raises)
            why = (
                f"a checkpoint cannot hold it ({type(exc).__name__}: {exc}): return plain "
                "Python values (dict, list, str, int, float...), e.g. dataclasses.asdict()"
            )
    if why is None:
        return state
    raise PluginError(f"plugin {name!r} returned a state from twinkle_checkpoint_state, and {why}")


def restore_observers(
    pm: Any,
    states: dict[str, Any],
    context: RunContext,
    *,
    leaving: Collection[str] = (),
    calls: Any = None,
) -> dict[str, Exception]:
    """Give each configured observer its state back (the trace its file's first part,
    a plugin what it kept; not one in ``leaving``, left out of the run at its
    configure). The run's timeline (in its stash, shared by the observers) is the one
    configure made, given the checkpoint's state: every observer's reference to the
    checkpoint's is turned into one to it. Returns the plugins whose
    ``twinkle_restore_state`` raised, with what it raised (the run leaves them out)."""
    live = context.stash[TIMELINE]
    saved = next(
        (state["timeline"] for name, state in states.items()
         if isinstance(pm.get_plugin(name), TimelineObserver)),
        None,
    )  # fmt: skip
    if saved is not None:
        vars(live).update(vars(saved))
    restoring = _state_hooks(pm, "twinkle_restore_state", calls)
    failed: dict[str, Exception] = {}
    for name, saved_state in states.items():
        plugin = pm.get_plugin(name)
        if _PLUGIN_STATE in saved_state:
            kept = saved_state[_PLUGIN_STATE]
            if kept is not None and name in restoring and name not in leaving:
                try:
                    restoring[name](kept)
                except Exception as exc:  # (a plugin's fault is the plugin's)
                    failed[name] = exc
            continue
        state = {k: live if saved is not None and v is saved else v for k, v in saved_state.items()}
        if isinstance(plugin, _SINKS):
            plugin.restore(state)
        else:
            vars(plugin).update(state)
    return failed


@cache
def code_digest() -> str:
    """A digest of the sources of the installed twinkle: a checkpoint is read back only
    by the code that wrote it (the state's shape is that code's)."""
    root = Path(twinkle.__file__).parent
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write(out_dir: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` into ``out_dir`` durably (a whole file or the old one)."""
    header = {
        "format": FORMAT,
        "code": code_digest(),
        "run_id": checkpoint.run_id,
        "events": checkpoint.events,
        "files": {
            name: [m.size, m.lines, m.tail, m.path] for name, m in sorted(checkpoint.files.items())
        },
        "scan": checkpoint.scan,
        "observers": checkpoint.observers,
    }
    header[DIGEST] = _digest(header, checkpoint.payload)
    out = ReplacingFile(out_dir / CHECKPOINT_FILE)  # synced, then renamed into place
    try:
        out.write(orjson.dumps(header) + b"\n" + checkpoint.payload)
    except BaseException:
        out.discard()
        raise
    out.commit()


def _digest(header: Mapping[str, Any], payload: bytes) -> str:
    """The SHA-256 of ``header`` (its JSON, keys sorted, without the digest) and the
    state."""
    fields = {k: v for k, v in header.items() if k != DIGEST}
    digest = hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
    digest.update(b"\n")
    digest.update(payload)
    return digest.hexdigest()


def load(out_dir: Path, run_id: str, observers: list[str]) -> Checkpoint | str:
    """The checkpoint in ``out_dir`` when it can serve this resume (the run's id, its
    observers' names, every file as it marks it), else why not."""
    path = out_dir / CHECKPOINT_FILE
    try:
        with open_regular(path) as f:
            head = f.readline(HEADER_BYTES + 1)
            header = _header(head)
            # (the state is read only for a header this code wrote)
            payload = f.read() if isinstance(header, dict) and _ours(header) else b""
    except FileNotFoundError:
        return NO_CHECKPOINT
    except OSError as exc:
        return f"cannot read {CHECKPOINT_FILE} ({exc.strerror or exc}): remove it"
    unreadable = f"{CHECKPOINT_FILE} is not a checkpoint twinkle wrote (its header is unreadable)"
    if not isinstance(header, dict):
        return unreadable
    try:
        checkpoint = Checkpoint(
            run_id=header["run_id"],
            events=int(header["events"]),
            files={name: FileMark(*mark) for name, mark in header["files"].items()},
            scan=dict(header["scan"]),
            observers=list(header["observers"]),
            payload=payload,
        )
        if sorted(checkpoint.files) != sorted(MARKED):
            raise ValueError("files")
    except (KeyError, TypeError, ValueError, AttributeError):
        return unreadable
    why = _disagreement(header, checkpoint, run_id, observers)
    if why is None:
        for _, file_mark in sorted(checkpoint.files.items()):
            if Path(file_mark.path).name != file_mark.path:
                why = f"it names {file_mark.path!r}, not a file of the run directory"
            else:
                why = file_mark.matches(out_dir / file_mark.path)
            if why is not None:
                break
    if why is None:
        try:
            checkpoint.state()
        except Exception as exc:  # (whatever a bad pickle raises)
            why = f"its state cannot be read back ({type(exc).__name__}: {exc})"
    return checkpoint if why is None else why


def log_unlike_checkpoint(out_dir: Path) -> str | None:
    """Why the run's event log is not what its checkpoint marks (cut, or a line added,
    removed or changed before the end the checkpoint covers), else None (it is, or no
    checkpoint marks it). Reads the checkpoint's first line and the log's marked tail."""
    mark = _log_mark(out_dir)
    return None if mark is None else mark.matches(out_dir / EVENTS_FILE)


def log_edited(out_dir: Path) -> str | None:
    """Why the run's event log was changed within the part its checkpoint covers (a line
    changed, added or removed: not only cut short), else None."""
    mark = _log_mark(out_dir)
    if mark is None or not mark.edited(out_dir / EVENTS_FILE):
        return None
    return (
        f"{EVENTS_FILE} changed since the run wrote it: its first {mark.size} bytes, which "
        f"{CHECKPOINT_FILE} covers, end otherwise than they did"
    )


def drop_stale(out_dir: Path) -> bool:
    """Remove the run's checkpoint, durably, when its event log no longer holds what it
    marks (cut short: it never fits again, and the bytes the run appends where its mark
    ended would later read as an edit of the log), or when there is no log (a new run
    of a run id whose files were removed); whether it did."""
    path = out_dir / CHECKPOINT_FILE
    if not os.path.lexists(path):
        return False
    log = out_dir / EVENTS_FILE
    logged = log.is_file() and log.stat().st_size > 0
    if logged and log_unlike_checkpoint(out_dir) is None:
        return False
    path.unlink()
    sync_dir(out_dir)
    return True


def _log_mark(out_dir: Path) -> FileMark | None:
    """Where the run's checkpoint marks its event log (None: no checkpoint of this
    format, or none readable). Reads the checkpoint's first line."""
    try:
        with open_regular(out_dir / CHECKPOINT_FILE) as f:
            header = _header(f.readline(HEADER_BYTES + 1))
        if header is None or header.get("format") != FORMAT:
            return None
        return FileMark(*header["files"][EVENTS_FILE])
    except (OSError, KeyError, TypeError, ValueError):
        return None  # (no checkpoint of this twinkle's: nothing to compare with)


def _header(line: bytes) -> dict[str, Any] | None:
    """A checkpoint's header: its first line's JSON object (None: no line within
    :data:`HEADER_BYTES`, or not a JSON object)."""
    return json_object(line) if line.endswith(b"\n") else None


def _ours(header: Mapping[str, Any]) -> bool:
    """Whether ``header`` says this code (this twinkle, this Python) wrote it."""
    return header.get("format") == FORMAT and header.get("code") == code_digest()


def _disagreement(
    header: dict[str, Any], checkpoint: Checkpoint, run_id: str, observers: list[str]
) -> str | None:
    if not _ours(header):
        return "it was written by another twinkle (or Python) than this one"
    if header.get(DIGEST) != _digest(header, checkpoint.payload):
        return f"{CHECKPOINT_FILE} is cut or changed (its digest differs)"
    if checkpoint.run_id != run_id:
        return f"it is run {checkpoint.run_id!r}'s, not {run_id!r}'s"
    if checkpoint.observers != observers:
        extra = sorted(set(observers) - set(checkpoint.observers))
        hint = (
            f"; {extra} not among them (new to the run, or left out of its segment: one "
            "that could not set up; block one that cannot set up here either, "
            "blocked=[...] or --block NAME, for a resume to start from the checkpoint)"
            if extra and set(checkpoint.observers) < set(observers)
            else ""
        )
        return (
            f"it holds the state of observers {checkpoint.observers}, and this run has "
            f"{observers}{hint}"
        )
    return None
