"""``twinkle report``: a run's figures from its files, for people (a table) or machines
(``--json``), and two runs side by side.

Every figure is read from the run's own outputs, never recomputed differently:

* per iteration: ``metrics_raw.jsonl``'s ``iteration`` record (tokens, tokens/s/device),
  each throughput phase's record (its tokens/s/device over the time its work took), its
  ``timing`` record (the window's flags; the window view: wall, busy, idle, each phase,
  the overlap of generation and training; the attributed view of each phase) and the
  reward scalar;
* what limits the run: ``summary.json``'s ``limits`` (the verdict, its evidence, what a
  twice-as-fast side would save) and each window's verdict and critical path;
* the run: ``summary.json``'s ``window`` (the steady state and the whole loop's
  throughput), ``phase_windows`` (each phase's), ``placement`` (the device
  denominators and the workers' devices) and ``seconds`` (wall, busy, idle and
  overhead, each as set-up + loop + tear-down; each phase; generation running while
  training runs);
* memory: each worker's peak (host and device) over its readings: ``summary.json``'s
  ``memory_peaks`` (a summary written before it had them: the readings in
  ``events.jsonl``).

The log is never read whole: its first event, then its segments counted in chunks.
``summary.json`` and the records (a few per iteration, whatever the workers: the
table's rows) are, so a report of days of 512 workers needs the memory of its table,
not of its log.

The plots (``--plots``) are drawn in :mod:`twinkle.report._plots`.

The reward is the first scalar key named ``reward_mean`` or ``reward`` (the demo's
``grpo.reward_mean``, TRL's ``trl.reward``), or the ``NAME.KEY`` given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from twinkle.errors import InvalidArgumentError
from twinkle.events import IterationStarted, MemoryReadings, RunResumed, RunStarted
from twinkle.observers import BUILTIN_KINDS, EVENTS_FILE
from twinkle.report._compare import PEAKS, compare, phases_differ, streaming_effect
from twinkle.report._log_segments import log_ends_a_segment, logged_segments
from twinkle.report._plots import PLOTS, time_parts, write_plots, write_png
from twinkle.report._run_files import (
    RECORDS_FILE,
    SUMMARY_MAX_BYTES,
    Segment,
    Summary,
    check_covered,
    finished_records,
    read_summary,
    run_dir,
)
from twinkle.report._text import format_compare, format_report
from twinkle.run import (
    SUMMARY_FILE,
    Follower,
    Snapshot,
    iter_events,
    log_unlike_checkpoint,
    writer_of,
)

__all__ = [
    "PLOTS",
    "RECORDS_FILE",
    "SUMMARY_MAX_BYTES",
    "compare",
    "format_compare",
    "format_report",
    "live_report",
    "load_report",
    "log_emptied",
    "phases_differ",
    "streaming_effect",
    "time_parts",
    "write_plots",
    "write_png",
]

_REWARD_KEYS = ("reward_mean", "reward")


def _reward(scalars: list[dict[str, Any]], choice: str | None) -> tuple[str, str] | None:
    """The (scalar name, key) of the reward among the caller's ``scalars`` records:
    ``choice`` ("NAME.KEY") or the first ``reward_mean`` / ``reward`` key."""
    if choice is not None:
        name, _, key = choice.rpartition(".")
        if not name or not any(r["kind"] == name and key in r["values"] for r in scalars):
            known = sorted({f"{r['kind']}.{k}" for r in scalars for k in r["values"]})
            raise InvalidArgumentError(
                f"--reward {choice!r} names no scalar of this run; its scalars: "
                f"{known[:20] or 'none'}"
            )
        return name, key
    for key in _REWARD_KEYS:
        for r in scalars:
            if key in r["values"]:
                return r["kind"], key
    return None


def load_report(path: str | os.PathLike[str], *, reward: str | None = None) -> dict[str, Any]:
    """The figures of the run in ``path`` (its directory), as plain JSON data. A run
    still being written (or stopped before it finished) is reported from its log so
    far, read through the run's observers (:class:`~twinkle.run.Follower`): its
    ``status`` is ``in progress`` and ``live`` says who writes it."""
    run = run_dir(path)
    events = iter_events(run / EVENTS_FILE)  # read once: its first event, then memory
    first_event = next(events, None)
    if first_event is None:
        raise InvalidArgumentError(f"{str(run / EVENTS_FILE)!r} holds no event{_why_none(run)}")
    if not isinstance(first_event, RunStarted):
        raise InvalidArgumentError(
            f"{str(run / EVENTS_FILE)!r} does not start with run_started: it is not a "
            "twinkle run's log (or it was cut); report a run directory a run wrote"
        )
    finished = _finished(run, first_event)
    if finished is not None:
        summary, logged = finished
        ended = log_ends_a_segment(run / EVENTS_FILE)
        check_covered(run, summary, first_event, logged, ended=ended)
        records = finished_records(run, summary, "timing" in first_event.plugins)
        return _report(run, summary, records, first_event, events, reward, None)
    summary, records, live = _snapshot(run)
    if live["state"] == "finished":  # (its log did; its files do not cover it)
        live["files_missing"] = [n for n in (SUMMARY_FILE, RECORDS_FILE) if not (run / n).is_file()]
    return _report(run, summary, records, first_event, iter(()), reward, live)


def _report(  # noqa: PLR0917 - the parts of one report, each read by its caller
    run: Path,
    summary: Summary,
    records: list[dict[str, Any]],
    first_event: RunStarted,
    events: Iterator[Any],
    reward: str | None,
    live: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report of a run's parts (``events``: the log after its first event, read for
    the memory peaks of a summary from before it had them)."""
    report = _figures(run, summary, records, first_event, reward)
    report["missing_sample_tags"] = dict(summary.missing_sample_tags)
    report["no_phase"] = summary.spans.get("no_phase")  # (None: an older summary)
    report["framework"], report["clock_skew"] = summary.compare, summary.clock_skew
    report["unstarted_iterations"] = sorted(int(k) for k in summary.unstarted_iterations)
    report["live"] = live
    # (a finished run's log against its checkpoint; a live one is read from its log)
    report["log_changed"] = log_unlike_checkpoint(run) if live is None else None
    if live is not None and live["state"] != "finished":
        report["status"] = live["state"]  # in progress, or stopped
    if summary.memory_peaks is None:  # (a summary from before it had them)
        peaks, segments = _from_log(events, summary.segments)
    else:
        peaks, segments = summary.memory_peaks, _segments(summary.segments)
    by_it = {row["iteration"]: row for row in report["iterations"]}
    for segment in segments:  # each iteration's segment (the first: 0)
        first, last = segment["first_iteration"], segment["last_iteration"]
        for it in () if first is None else range(first, last + 1):
            if it in by_it:
                by_it[it]["segment"] = segment["segment"]
    report["memory_peak_bytes"] = peaks
    report["segments"] = segments
    return report


def log_emptied(run: Path) -> str | None:
    """Why a run whose log holds no event will never hold one: it wrote its summary
    (else None: it may be starting, or be run again)."""
    if (run / SUMMARY_FILE).is_file():
        return (
            f", yet the run wrote its {SUMMARY_FILE}: its log was emptied after it; "
            f"restore {EVENTS_FILE} to report it"
        )
    return None


def _why_none(run: Path) -> str:
    """Why a run's log holds no event, as far as its summary and lock file tell."""
    emptied = log_emptied(run)
    if emptied is not None:
        return emptied
    writer = writer_of(run)
    if writer is not None and writer.alive is False:
        return (
            f": the process that began the run ({writer.describe()}) was stopped before it "
            "wrote one; there is nothing to report (run it again with the same run id to "
            "start it, or remove the directory)"
        )
    return (
        " yet: a run just starting writes its first in a moment (report it again), or one "
        "that never started wrote none"
    )


def _finished(run: Path, first: RunStarted) -> tuple[Summary, int] | None:
    """The run's summary and the segments its log holds when its files are a finished
    run's: a summary and records that cover every segment of the log (a summary of
    another run, or of more segments than the log holds, is refused by
    :func:`_check_covered`); None for a run still being written, or stopped."""
    if not (run / SUMMARY_FILE).is_file() or not (run / RECORDS_FILE).is_file():
        return None
    summary = read_summary(run)
    logged = logged_segments(run / EVENTS_FILE)  # (the log read once, in chunks)
    if summary.run_id != first.run_id or len(summary.segments) >= logged:
        return summary, logged
    return None


def _snapshot(run: Path) -> tuple[Summary, list[dict[str, Any]], dict[str, Any]]:
    """The summary and records of the run's log so far, and who writes it."""
    with Follower(run) as follower:
        follower.poll()
        return snapshot_parts(run, follower.snapshot())


def snapshot_parts(
    run: Path, snap: Snapshot
) -> tuple[Summary, list[dict[str, Any]], dict[str, Any]]:
    """A follower's snapshot of ``run`` as a report's parts: its summary, its records
    and ``live`` (the state: ``finished``, ``in progress`` or ``stopped``, who writes
    it, from the run directory's lock file, and why the log was read whole, not from
    the run's checkpoint)."""
    writer = writer_of(run)
    gone = writer is None or writer.alive is False
    live = {
        "state": "finished" if snap.finished else ("stopped" if gone else "in progress"),
        "writer": None if writer is None else writer.describe(),
        "pid": None if writer is None else writer.pid,
        "host": None if writer is None else writer.host,
        "alive": None if writer is None else writer.alive,
        "events": snap.events,
        "whole_log_why": snap.whole_log_why,
    }
    return msgspec.convert(snap.summary, Summary), snap.records, live


def live_report(run: Path, snap: Snapshot, *, reward: str | None = None) -> dict[str, Any]:
    """The report of a follower's snapshot of ``run`` (``twinkle watch``)."""
    summary, records, live = snapshot_parts(run, snap)
    return _report(run, summary, records, snap.first, iter(()), reward, live)


def _figures(
    run: Path,
    summary: Summary,
    records: list[dict[str, Any]],
    first_event: RunStarted,
    reward: str | None,
) -> dict[str, Any]:
    """The report of ``records`` and ``summary`` (without the memory and segments)."""
    config = first_event.config
    phases = list(config.get("phases", {}))
    lifecycle = config.get("lifecycle") or {}
    # The lifecycle phases run in the set-up and tear-down, never in an iteration.
    loop_phases = [p for p in phases if not any(p in names for names in lifecycle.values())]
    throughput = [p for p in config.get("throughput", {}) if p in phases]
    streaming = config.get("streaming") or {}
    pair = (streaming.get("generation"), streaming.get("training"))
    # The caller's scalars: every record of a kind the built-in observers do not make
    # (under this configuration: "mfu" only with config.mfu).
    mfu_kind = "mfu" if config.get("mfu") is not None else None
    own = BUILTIN_KINDS | set(config.get("throughput", {})) | {mfu_kind}
    scalars = [r for r in records if r["scope"] == "iteration" and r["kind"] not in own]
    reward_at = _reward(scalars, reward)
    rows = _rows(
        records,
        throughput=throughput,
        mfu_kind=mfu_kind,
        reward_at=reward_at,
        phases=phases,
        pair=pair,
    )
    report: dict[str, Any] = {
        "run_id": summary.run_id,
        "run_dir": str(run),
        "status": summary.status,
        "error": summary.error,
        "phases": phases,
        # each phase's span-name patterns (config.phases): the HTML timeline's colours
        "phase_patterns": {p: list(names) for p, names in config.get("phases", {}).items()},
        "loop_phases": loop_phases,
        "throughput_phases": throughput,
        # the samples tag whose tokens the run counts (None: no config.window, no tokens)
        "window_samples": (config.get("window") or {}).get("samples"),
        "streaming": None if None in pair else list(pair),
        "reward": None if reward_at is None else ".".join(reward_at),
        "iterations": rows,
        "window": dict(summary.window),
        "phase_windows": {p: dict(v) for p, v in summary.phase_windows.items()},
        "placement": dict(summary.placement),
        "limits": dict(summary.limits),
        "mfu": summary.mfu,
        "seconds": _seconds(summary.seconds, phases),
    }
    return report


def _rows(
    records: list[dict[str, Any]],
    *,
    throughput: list[str],
    mfu_kind: str | None,
    reward_at: tuple[str, str] | None,
    phases: list[str],
    pair: tuple[Any, Any],
) -> list[dict[str, Any]]:
    """Each iteration's row of the table, from its records, in iteration order."""
    by_it: dict[int, dict[str, Any]] = {}
    for r in records:
        if r["scope"] != "iteration" or r["iteration"] is None:
            continue
        row = by_it.setdefault(r["iteration"], {"iteration": r["iteration"]})
        values = r["values"]
        if r["kind"] == "iteration":
            row["tokens"], row["samples"] = values.get("tokens"), values.get("samples")
            row["tokens_per_s_per_device"] = values.get("tokens_per_s_per_device")
        elif r["kind"] in throughput:
            per_phase = row.setdefault("phase_tokens_per_s_per_device", {})
            per_phase[r["kind"]] = values.get("tokens_per_s_per_device")
            row.setdefault("phase_samples", {})[r["kind"]] = values.get("samples")
        elif r["kind"] == mfu_kind:
            row["phase_mfu"] = _utilisation(values)
        elif r["kind"] == "timing":
            row.update(_timing_row(r, phases, pair))
        elif reward_at is not None and (r["kind"], reward_at[1]) == reward_at:
            row["reward"] = values.get(reward_at[1])
    return [_not_counted_when_cut(by_it[i]) for i in sorted(by_it)]


def _not_counted_when_cut(row: dict[str, Any]) -> dict[str, Any]:
    """A ``partial`` iteration (cut short) whose record counts no samples: its tokens
    and throughputs not known (None), not the record's 0: its samples were never
    published (verl and ms-swift publish a step's after it)."""
    if "partial" not in row.get("window_flags", []):
        return row
    if not row.get("samples"):
        row["tokens"] = row["tokens_per_s_per_device"] = None
    phased, samples = row.get("phase_tokens_per_s_per_device", {}), row.get("phase_samples", {})
    for phase in phased:
        if not samples.get(phase):
            phased[phase] = None
    for utilisation in row.get("phase_mfu", {}).values():
        if not utilisation["tokens"]:  # (its FLOPs not known: 0 is what it counted)
            utilisation["share"] = None
    return row


def _timing_row(record: dict[str, Any], phases: list[str], pair: tuple[Any, Any]) -> dict[str, Any]:
    """An iteration's row figures from its ``timing`` record: its flags, verdict and
    critical path, the window view's seconds, each phase's in both views and the
    streaming pair's overlap."""
    values, attrs = record["values"], record["attrs"]
    row: dict[str, Any] = {
        "window_flags": list(attrs.get("window_flags", [])),
        "window_verdict": attrs.get("window_verdict"),
        "window_path_seconds": {
            k.removeprefix("window_path_").removesuffix("_seconds"): v
            for k, v in values.items()
            if k.startswith("window_path_")
        },
    }
    for key in ("wall", "busy", "idle", "overhead"):
        row[f"window_{key}_seconds"] = values.get(f"window_{key}_seconds")
    row["window_phase_seconds"] = {p: values.get(f"window_{p}_seconds") for p in phases}
    row["attributed_phase_seconds"] = {p: values.get(f"attributed_{p}_seconds") for p in phases}
    if None not in pair:  # (the pair is named in the order of config.phases)
        overlap = values.get(f"window_overlap_{pair[0]}_{pair[1]}_seconds")
        if overlap is None:
            overlap = values.get(f"window_overlap_{pair[1]}_{pair[0]}_seconds")
        row["window_overlap_generation_training_seconds"] = overlap
    return row


def _seconds(seconds: dict[str, Any], phases: list[str]) -> dict[str, Any]:
    """The run's seconds from ``summary.json``'s: wall, busy, idle and overhead, each as
    set-up + loop + tear-down (they add up to it), each phase's, and generation hidden
    behind training."""
    return {
        "wall": seconds.get("wall_seconds"),
        "busy": seconds.get("busy_seconds"),
        "idle": seconds.get("idle_seconds"),
        "overhead": seconds.get("overhead_seconds"),
        # idle while only spans no phase names ran (None: a summary from before it)
        "unnamed": seconds.get("unnamed_seconds"),
        "parts": {
            total: {
                part: seconds.get(f"{part}_{total}_seconds")
                for part in ("setup", "loop", "teardown")
            }
            for total in ("wall", "busy", "idle", "overhead")
        },
        "phases": {p: seconds.get(f"{p}_seconds") for p in phases},
        "generation_hidden_seconds": seconds.get("generation_hidden_seconds"),
        "generation_hidden_share": seconds.get("generation_hidden_share"),
    }


def _utilisation(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per phase of an ``mfu`` record (its ``<phase>_flops`` keys): its ``share`` of the
    peak (None: no peak), the ``figure`` it is (``mfu``, ``hfu``), whether it is
    ``implied`` (over 1: not a utilisation) and the ``tokens`` it counted."""
    out: dict[str, dict[str, Any]] = {}
    for key in values:
        if not key.endswith("_flops") or key.startswith("steady_"):
            continue
        phase = key.removesuffix("_flops")
        tokens = values.get(f"{phase}_tokens")
        out[phase] = {"figure": None, "share": None, "implied": False, "tokens": tokens}
        for figure in ("mfu", "hfu"):
            for implied in (False, True):
                name = f"{phase}_{'implied_' if implied else ''}{figure}"
                if name in values:
                    out[phase].update(figure=figure, share=values[name], implied=implied)
    return out


def _segments(listed: list[Segment]) -> list[dict[str, Any]]:
    return [
        {
            "segment": s.segment,
            "first_iteration": s.first_iteration,
            "last_iteration": s.last_iteration,
            "status": s.status,
        }
        for s in listed
    ]


def _from_log(
    events: Iterable[Any], listed: list[Segment]
) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """From the rest of the log: each worker's highest reading of each peak field
    (fields it never reported are left out), and each segment of the run with its first
    and last iteration and its status (the summary's)."""
    peaks: dict[str, dict[str, int]] = {}
    segments: list[dict[str, Any]] = [{"segment": 0, "iterations": []}]
    for event in events:
        if isinstance(event, RunResumed):
            segments.append({"segment": event.segment, "iterations": []})
        elif isinstance(event, IterationStarted):
            segments[-1]["iterations"].append(event.iteration)
        if not isinstance(event, MemoryReadings):
            continue
        for reading in event.readings:
            mine = peaks.setdefault(reading.worker_id, {})
            for field in PEAKS:
                value = getattr(reading, field)
                if value is not None and value > mine.get(field, -1):
                    mine[field] = value
    status = {s.segment: s.status for s in listed}
    return {worker: peaks[worker] for worker in sorted(peaks)}, [
        {
            "segment": s["segment"],
            "first_iteration": min(s["iterations"], default=None),
            "last_iteration": max(s["iterations"], default=None),
            "status": status.get(s["segment"]),
        }
        for s in segments
    ]
