"""``summary.json``: the run's frame (its own keys, its segments, what its backends did,
the plugins it went without) around the observers' parts, written whole."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import orjson

from twinkle.errors import ReporterError, WriteError
from twinkle.events import BackendsClosed, RunFinished, RunResumed, RunStarted, read_back
from twinkle.plugins import HookCalls, merge_summary
from twinkle.reporting import ReplacingFile

__all__ = ["BASE_SUMMARY_KEYS", "SUMMARY_FILE", "Segment", "build_summary", "write_summary"]

SUMMARY_FILE = "summary.json"

BASE_SUMMARY_KEYS = frozenset(
    {
        "run_id",
        "status",
        "error",
        "records_dropped",
        "process_wall_seconds",
        "segments",
        "observer_failures",
        "observer_slow_calls",
        "backends",
        "plugins_left_out",
    }
)
"""The run's own keys of ``summary.json``: no observer's part may set them."""


@dataclasses.dataclass(slots=True)
class Segment:
    """One process's stretch of a run: the event that began it (``run_started``, then
    each ``run_resumed``), the ``run_finished`` that ended it (None while it runs, or when
    its process was killed) and what its record backends did (``backends_closed``; None
    until they closed, or when the process was killed)."""

    start: RunStarted | RunResumed
    finish: RunFinished | None = None
    backends: BackendsClosed | None = None
    #: the first and the last iteration that started in it (None: none did)
    first_iteration: int | None = None
    last_iteration: int | None = None

    @property
    def number(self) -> int:
        return self.start.segment if isinstance(self.start, RunResumed) else 0


#: how summary.json is written (sorted keys, indented); a part is checked against it
_SUMMARY_JSON = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def build_summary(
    event: RunFinished, calls: HookCalls, segments: list[Segment] | None = None
) -> dict[str, Any]:
    """``summary.json``'s content: the run's frame (its :data:`BASE_SUMMARY_KEYS`, which
    no observer can set: a part naming one is refused and counted as that observer's
    failure) and the observers' parts."""
    parts: list[tuple[str, dict[str, Any]]] = []
    for name, returned in calls.call_named("twinkle_summary", event=event):
        part, problem = _json_part(returned)
        if part is None:  # (counted, so summary.json is still written, and the checkpoint)
            calls.count(name, "returned a summary part that %s; left out", problem)
            continue
        taken = sorted(BASE_SUMMARY_KEYS.intersection(part))
        if taken:
            calls.count(name, "set the run's own summary key(s) %s, which were ignored", taken)
        parts.append((name, {k: v for k, v in part.items() if k not in BASE_SUMMARY_KEYS}))
    parts.sort(key=lambda item: not calls.builtin(item[0]))  # (twinkle's own keys first)
    summary: dict[str, Any] = merge_summary(parts)
    summary.update(
        run_id=event.run_id,
        status=event.status,
        error=event.error,
        records_dropped=event.records_dropped,
        process_wall_seconds=_process_wall(event, segments or []),
        segments=_segments(segments or []),
        backends=_backends(segments[-1]) if segments else {},
        plugins_left_out=_left_out(segments[-1]) if segments else {},
        observer_failures=dict(sorted(calls.failures.items())),
        # The live run's count, from its event: a replay's own timing differs.
        observer_slow_calls=dict(sorted(event.observer_slow_calls.items())),
    )
    return summary


def _json_part(part: object) -> tuple[dict[str, Any] | None, str]:
    """An observer's summary part as ``summary.json`` will hold it (a copy, read back
    from its JSON: what the plugin changes after cannot reach the file), or None and
    what keeps it out: not a dict, or not JSON (a numpy number, an object, a key that
    is not a str)."""
    if not isinstance(part, dict):
        return None, f"is a {type(part).__name__}, not a dict"
    try:
        copy: dict[str, Any] = orjson.loads(orjson.dumps(part, option=_SUMMARY_JSON))
    except TypeError as exc:
        return None, f"is not JSON ({exc}: use plain numbers, str, lists and dicts)"
    return copy, ""


def _process_wall(event: RunFinished, segments: list[Segment]) -> float | None:
    """Every segment's process wall time added (a killed one's is unknown: left out;
    None when no segment's is known)."""
    ends = [s.finish for s in segments] if segments else [event]
    known = [e.process_wall_ns for e in ends if e is not None and e.process_wall_ns is not None]
    return sum(known) / 1e9 if known else None


def _segments(segments: list[Segment]) -> list[dict[str, Any]]:
    return [_segment(s, segments[i - 1] if i else None) for i, s in enumerate(segments)]


def _segment(segment: Segment, before: Segment | None) -> dict[str, Any]:
    """One segment of the run (a process's stretch of it) for the summary; ``before``:
    the segment before it (None for the first)."""
    start, end = segment.start, segment.finish
    return {
        **_segment_config(start, None if before is None else before.start),
        "segment": segment.number,
        "first_iteration": segment.first_iteration,
        "last_iteration": segment.last_iteration,
        "pid": start.anchor.pid,
        "hostname": start.anchor.hostname,
        "started_unix_s": start.wall_ns / 1e9,
        "finished_unix_s": None if end is None else end.wall_ns / 1e9,
        "status": None if end is None else end.status,
        "error": None if end is None else end.error,
        "process_wall_seconds": (
            None if end is None or end.process_wall_ns is None else end.process_wall_ns / 1e9
        ),
        "terminal_totals": {} if end is None else dict(sorted(end.terminal_totals.items())),
        "backends": _backends(segment),
        "plugins_left_out": _left_out(segment),
    }


def _segment_config(
    start: RunStarted | RunResumed, before: RunStarted | RunResumed | None
) -> dict[str, Any]:
    """A segment's planned steps (``total_steps``; None: not configured) and, as
    ``config_changes``, each configuration key whose value differs from the segment
    before it, with this segment's value (None: no longer set); ``{}`` for the first."""
    config = read_back(dict(start.config))
    changes: dict[str, Any] = {}
    if before is not None:
        previous = read_back(dict(before.config))
        changes = {
            k: config.get(k)
            for k in sorted({*config, *previous})
            if k not in config or k not in previous or config[k] != previous[k]
        }
    return {"total_steps": config.get("total_steps"), "config_changes": changes}


def _backends(segment: Segment) -> dict[str, dict[str, Any]]:
    """What each record backend of ``segment`` did ({} when its process was killed)."""
    closed = segment.backends
    if closed is None:
        return {}
    return {name: msgspec.structs.asdict(h) for name, h in sorted(closed.backends.items())}


def _left_out(segment: Segment) -> dict[str, str]:
    """The plugins ``segment`` went without, with why: those that could not configure
    (its start event) and those whose backend could not open (``backends_closed``)."""
    left = dict(segment.start.plugins_left_out)
    if segment.backends is not None:
        for name, health in segment.backends.backends.items():
            if health.setup_error is not None:
                left.setdefault(name, f"its backend could not open: {health.setup_error}")
    return dict(sorted(left.items()))


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """Write ``summary.json`` (sorted keys, indented), whole or not at all, durably
    (:class:`~twinkle.reporting.ReplacingFile`: synced, then renamed into place; no
    symlink followed)."""
    data = orjson.dumps(summary, option=_SUMMARY_JSON)
    try:
        out = ReplacingFile(path)
        try:
            out.write(data + b"\n")
        except OSError as exc:
            out.discard()
            raise WriteError(exc.errno, f"cannot write {str(path)!r}: {exc.strerror}") from exc
        out.commit()
    except ReporterError as exc:
        raise WriteError(
            getattr(exc, "errno", None),
            f"{getattr(exc, 'strerror', None) or exc}; the summary can be rebuilt: twinkle "
            f"replay {str(path.parent)!r}",
        ) from exc
