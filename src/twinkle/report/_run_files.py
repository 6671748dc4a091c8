"""A run directory's files as the report reads them: the directory itself, its
``summary.json`` (bounded, of the shape the report reads) and its ``metrics_raw.jsonl``
(each line a record, as many iterations as the summary counts), each refused naming
the file, what is wrong and the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import orjson

from twinkle.checks import SafeName, explain
from twinkle.errors import InvalidArgumentError, RecordError
from twinkle.events import RunStarted, Status
from twinkle.observers import EVENTS_FILE
from twinkle.reporting import check_record_line, read_jsonl
from twinkle.run import SUMMARY_FILE

__all__ = [
    "RECORDS_FILE",
    "SUMMARY_MAX_BYTES",
    "check_covered",
    "finished_records",
    "read_summary",
    "replay_fix",
    "run_dir",
    "Segment",
    "Summary",
]

RECORDS_FILE = "metrics_raw.jsonl"
#: the largest summary.json read: a run's is a few KiB (a thousand scalars, some hundred
#: KiB); past this it is not a summary twinkle wrote, and reading it could exhaust memory
SUMMARY_MAX_BYTES: Final = 64 * 1024 * 1024


def run_dir(path: str | os.PathLike[str]) -> Path:
    run = Path(path)
    if not run.is_dir():
        raise InvalidArgumentError(
            f"{str(run)!r} is not a run directory: give the directory a run wrote "
            "(runs/<run_id>/, holding summary.json, metrics_raw.jsonl and events.jsonl)"
        )
    if not (run / EVENTS_FILE).is_file():
        if os.path.lexists(run / EVENTS_FILE):  # (a FIFO, a directory, a broken link)
            raise InvalidArgumentError(
                f"{str(run / EVENTS_FILE)!r} is not a regular file: a run's log is one; "
                "give the directory of a run twinkle writes"
            )
        missing = [n for n in (SUMMARY_FILE, RECORDS_FILE, EVENTS_FILE) if not (run / n).is_file()]
        if len(missing) == 1:  # (a run's directory without its log)
            raise InvalidArgumentError(
                f"{str(run)!r} has no {EVENTS_FILE}, which a report reads beside the run's "
                "summary: a run that blocked the events observer (--block events) writes "
                "none and cannot be reported; run it again without blocking it"
            )
        raise InvalidArgumentError(
            f"{str(run)!r} has no {', '.join(missing)}: it is not a twinkle run's directory"
        )
    return run


def replay_fix(run: Path) -> str:
    """How to get files to report from a run's log alone."""
    return f"replay its log first (twinkle replay {run}/{EVENTS_FILE} --out DIR) and report DIR"


class Segment(msgspec.Struct, frozen=True):
    """A segment as ``summary.json`` lists it (what the report checks of it)."""

    segment: int
    status: Status | Literal["in progress"] | None
    first_iteration: int | None = None
    last_iteration: int | None = None


class Summary(msgspec.Struct, frozen=True):
    """What the report reads of ``summary.json`` (the observers' other parts are not
    checked here)."""

    run_id: SafeName
    status: Status | Literal["in progress"]
    segments: list[Segment]
    #: how the run ended when it ended in error (its last segment's ``run_finished``)
    error: str | None = None
    window: dict[str, int | float | None] = {}
    phase_windows: dict[str, dict[str, int | float | None]] = {}
    placement: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    seconds: dict[str, int | float | None] = {}
    #: model FLOPs utilisation (``config.mfu``; None: the run had none)
    mfu: dict[str, Any] | None = None
    #: each worker's peaks (None: a summary from before it had them)
    memory_peaks: dict[str, dict[str, int]] | None = None
    #: the iterations finalised, one ``timing`` record each (the timing observer's key
    #: when it ran; else whatever a plugin's part put there)
    iterations: Any = None
    records_dropped: int = 0
    #: each sample tag the configuration counts that no samples event carried, and why
    missing_sample_tags: dict[str, str] = {}
    #: where every span went (``spans.no_phase``: those no phase names)
    spans: dict[str, Any] = {}
    #: what was observed for each iteration that never started, by its number
    unstarted_iterations: dict[str, Any] = {}
    #: a framework's own figures beside twinkle's (``config.compare``; None: none)
    compare: dict[str, Any] | None = None
    #: worker clocks found skewed ({}: a summary from before the figure)
    clock_skew: dict[str, Any] = {}


def read_summary(run: Path) -> Summary:
    """The run's ``summary.json``, refused (naming the file, what is wrong and the fix)
    when it is too big, not JSON or not of :class:`Summary`'s shape."""
    path = run / SUMMARY_FILE
    fix = f"it is not a summary twinkle wrote (or it was cut): {replay_fix(run)}"
    with path.open("rb") as f:
        # The size first: a file of gigabytes is refused without reading it.
        size = os.fstat(f.fileno()).st_size
        data = b"" if size > SUMMARY_MAX_BYTES else f.read(SUMMARY_MAX_BYTES + 1)
    if max(size, len(data)) > SUMMARY_MAX_BYTES:
        raise InvalidArgumentError(
            f"{str(path)!r} holds {max(size, len(data)):,} bytes, more than the "
            f"{SUMMARY_MAX_BYTES:,} a run's summary may: {fix}"
        )
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{str(path)!r} is not JSON ({exc}): {fix}") from None
    try:
        return msgspec.convert(parsed, Summary)
    except msgspec.ValidationError as exc:
        raise InvalidArgumentError(
            f"{str(path)!r}: {explain(exc, parsed, 'summary')}: {fix}"
        ) from None


def check_covered(
    run: Path, summary: Summary, first: RunStarted, logged: int, *, ended: bool
) -> None:
    """Refuse a summary that does not cover the run's log (``logged`` segments): another
    run's, one of more segments than the log holds, or one of a run that finished ok
    beside a log that does not end with its last segment's end (``ended``: the log was
    cut, replaced or added to after the summary was written). One of fewer segments is
    a run still being written, or stopped: it is reported from its log
    (:func:`_snapshot`)."""
    path = run / SUMMARY_FILE
    if summary.run_id != first.run_id:
        raise InvalidArgumentError(
            f"{str(path)!r} is the summary of run {summary.run_id!r}, but {EVENTS_FILE} "
            f"beside it is the log of run {first.run_id!r}: {replay_fix(run)}"
        )
    covered = len(summary.segments)
    if logged < covered:
        raise InvalidArgumentError(
            f"{str(run)!r}: its {EVENTS_FILE} holds {logged} segment(s) of the run, but its "
            f"{SUMMARY_FILE} covers {covered}: the summary is stale (the log was cut or "
            f"replaced after the summary was written); {replay_fix(run)}"
        )
    if summary.status == "ok" and not ended:
        raise InvalidArgumentError(
            f"{str(run)!r}: its {SUMMARY_FILE} says the run finished ok, but its "
            f"{EVENTS_FILE} does not end with the run's end (backends_closed): the log was "
            f"cut or added to after the summary was written; {replay_fix(run)}"
        )


def finished_records(run: Path, summary: Summary, timed: bool) -> list[dict[str, Any]]:
    """A finished run's records, refused (naming the file, what is wrong and the fix)
    when a line is not a record or when they are not the summary's: a run that
    finished ``ok`` and dropped no record has a ``timing`` record per iteration its
    summary counts (a file cut or added to after the run finished would otherwise be
    reported beside a summary it contradicts; ``timed``: the timing observer ran, the
    summary's ``iterations`` is its count)."""
    path = run / RECORDS_FILE
    reader = read_jsonl(path)
    try:
        records = list(reader)
    except RecordError:
        if reader.error is None:
            raise
        line, why = reader.error
        raise InvalidArgumentError(f"{str(path)!r} line {line}: {why}: {replay_fix(run)}") from None
    for number, record in enumerate(records, 1):
        try:
            check_record_line(record)
        except RecordError as exc:
            raise InvalidArgumentError(
                f"{str(path)!r}, its record {number}: {exc}: {replay_fix(run)}"
            ) from None
    count = sum(1 for r in records if r.get("kind") == "timing" and r.get("scope") == "iteration")
    whole = timed and summary.status == "ok" and summary.records_dropped == 0
    if whole and count != summary.iterations:
        raise InvalidArgumentError(
            f"{str(path)!r} holds the records of {count} iteration(s), but {SUMMARY_FILE} "
            f"beside it counts {summary.iterations}: the records were cut or added to after "
            f"the run finished; {replay_fix(run)}"
        )
    return records
