"""The report as text: the per-iteration table, the run's figures and a legend (one
vocabulary, docs/metrics.md "Report columns"), and two runs side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from twinkle.checks import printable
from twinkle.metric import convert_bytes
from twinkle.report._compare import compare, phases_differ, streaming_effect
from twinkle.report._format import NAMED_WORKERS, error_line, highest_peaks, num
from twinkle.report._framework_text import framework_lines
from twinkle.report._limits_text import limits_lines
from twinkle.report._mfu_text import mfu_lines, mfu_phases, mfu_share
from twinkle.report._no_phase_text import no_phase_lines
from twinkle.report._segments_text import segments_line
from twinkle.report._skew_text import clock_skew_lines

__all__ = [
    "FLAG_NAMES",
    "LEGEND",
    "LEGEND_TITLE",
    "format_compare",
    "format_report",
    "as_text",
    "head_lines",
    "iteration_cells",
    "iteration_table",
    "legend_lines",
    "live_lines",
    "memory_lines",
    "split_exactly",
    "throughput_lines",
]

#: how the table names each window's verdict (``attrs.window_verdict``)
VERDICT_NAMES = {
    "training-bound": "train",
    "generation-bound": "gen",
    "publish-bound": "publish",
    "mixed": "mixed",
    "abstain": "-",
}
#: how the table names each window flag (``attrs.window_flags``)
FLAG_NAMES = {"warmup": "warm-up", "drain": "drain", "partial": "partial"}

LEGEND_TITLE = "columns (docs/metrics.md, 'Report columns'):"
#: what each kind of column shows, in the table's order (the legend lists the kinds
#: the table has; iter, tokens and reward say what they are)
LEGEND = (
    ("seg", "the segment (a resumed run's process) the iteration ran in"),
    ("limit", "what bounds the window: train, gen, publish, mixed, - (no verdict)"),
    (
        "flag",
        "warm-up (a segment's first), drain (its last), partial (cut short): left out of "
        "the steady state; a partial one whose samples never came has - tokens",
    ),
    ("tok/s/dev", "the iteration's tokens over its window's logical seconds (window view)"),
    ("<phase> tok/s/dev", "the phase's tokens over the time its work took (attributed view)"),
    ("wall/busy/idle s", "its window, from its boundary to the next (window view)"),
    ("<phase> s", "the phase's union within the window (window view)"),
    ("attr <phase> s", "the phase's work done for the iteration, wherever it ran (attributed)"),
    ("<gen>&<train> s", "generation and training at once within the window (window view)"),
    (
        "<phase> MFU %",
        "the phase's model FLOP/s per device over the peak (HFU: recomputed activations "
        "counted); ! over 100%: implied, not a utilisation",
    ),
)


def _count(value: Any) -> str:
    """A device count: whole numbers without decimals."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    return num(value)


def split_exactly(total: float, parts: Sequence[float], digits: int = 3) -> list[str]:
    """``total`` and its ``parts`` (which add up to it) shown with ``digits`` decimals so
    that the shown parts add up to the shown total: each part is its value rounded down
    and the units left over go to the parts with the largest remainders (each shown part
    is within one unit of its value)."""
    unit = Fraction(1, 10**digits)
    whole = round(Fraction(total) / unit)
    exact = [Fraction(p) / unit for p in parts]
    shown = [math.floor(x) for x in exact]
    left = whole - sum(shown)
    by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - shown[i], reverse=True)
    if left >= 0:
        for i in by_remainder[:left]:
            shown[i] += 1
    else:  # (the parts' floats add up to a hair over the total)
        for i in by_remainder[left:]:
            shown[i] -= 1
    scale = 10**digits
    return [
        f"{'-' if n < 0 else ''}{abs(n) // scale}.{abs(n) % scale:0{digits}d}"
        for n in (whole, *shown)
    ]


def _table(header: list[str], rows: list[list[str]], *, names: bool = False) -> list[str]:
    """Right-aligned columns (the first left-aligned when it holds ``names``), each
    cell :func:`~twinkle.checks.printable` (as it will be shown: the widths fit)."""
    header = [printable(h) for h in header]
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if names and i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    head = line(header)
    return [head, "-" * len(head), *(line(r) for r in rows)]


def iteration_table(report: Mapping[str, Any]) -> list[str]:
    return _table(*iteration_cells(report))


def iteration_cells(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The per-iteration table's header and rows of cells (as the text table shows
    them; the HTML report's too)."""
    phases, rated = report["loop_phases"], report["throughput_phases"]
    segmented = _segmented(report)
    header = ["iter", *(["seg"] if segmented else []), "flag", "limit", "tokens", "tok/s/dev"]
    header += [f"{p} tok/s/dev" for p in rated]
    header += ["wall s", "busy s", "idle s"]
    header += [f"{p} s" for p in phases]
    header += [f"attr {p} s" for p in phases]
    has_overlap = report.get("streaming") is not None
    if has_overlap:
        header.append("{}&{} s".format(*report["streaming"]))
    utilised = mfu_phases(report)
    header += [f"{p} {figure.upper()} %" for p, figure in utilised.items()]
    if report["reward"]:
        header.append("reward")
    rows = []
    for r in report["iterations"]:
        flags = ",".join(FLAG_NAMES.get(f, f) for f in r.get("window_flags", []))
        row = [str(r["iteration"]), *([str(r.get("segment", "-"))] if segmented else [])]
        limit = VERDICT_NAMES.get(r.get("window_verdict") or "", "-")
        row += [flags, limit, num(r.get("tokens")), num(r.get("tokens_per_s_per_device"))]
        row += [num(r.get("phase_tokens_per_s_per_device", {}).get(p)) for p in rated]
        row += [num(r.get(f"window_{k}_seconds")) for k in ("wall", "busy", "idle")]
        row += [num(r.get("window_phase_seconds", {}).get(p)) for p in phases]
        row += [num(r.get("attributed_phase_seconds", {}).get(p)) for p in phases]
        if has_overlap:
            row.append(num(r.get("window_overlap_generation_training_seconds")))
        row += [mfu_share(r.get("phase_mfu", {}).get(p)) for p in utilised]
        if report["reward"]:
            row.append(num(r.get("reward")))
        rows.append(row)
    return header, rows


def legend_lines(report: Mapping[str, Any]) -> list[str]:
    """What each column of the report's table shows: the kinds of column it has."""
    shown = {"limit", "flag", "tok/s/dev", "wall/busy/idle s"}
    if _segmented(report):
        shown.add("seg")
    if report["throughput_phases"]:
        shown.add("<phase> tok/s/dev")
    if report["loop_phases"]:
        shown |= {"<phase> s", "attr <phase> s"}
    if report.get("streaming") is not None:
        shown.add("<gen>&<train> s")
    if mfu_phases(report):
        shown.add("<phase> MFU %")
    return [LEGEND_TITLE, *(f"  {name:<18} {text}" for name, text in LEGEND if name in shown)]


def _segmented(report: Mapping[str, Any]) -> bool:
    """Whether the run has more than one segment (the table then has a ``seg`` column)."""
    return len(report.get("segments", ())) > 1


def throughput_lines(report: Mapping[str, Any]) -> list[str]:
    """The steady state first, with each phase's; then the whole loop's."""
    window, iterations = report["window"], len(report["iterations"])
    steady = window.get("steady_iterations") or 0
    per_phase = [
        f"{p} {num(report['phase_windows'].get(p, {}).get('steady_tokens_per_s_per_device'))}"
        for p in report["throughput_phases"]
    ]
    # (a report from before ``window_samples`` was kept has none: counted)
    counted = report.get("window_samples", "") is not None
    if not counted:
        lines = [
            "tokens/s/device     the run's: not counted, config.window names no samples tag "
            '(e.g. "window": {"samples": "rollout", "devices": 8}: docs/metrics.md)'
        ]
    elif steady:
        lines = [
            f"steady state        {num(window.get('steady_tokens_per_s_per_device'))} "
            f"tokens/s/device over {steady} of {iterations} iterations (warm-up, drain and "
            f"partial left out): {num(window.get('steady_tokens'))} tokens / "
            f"{num(window.get('steady_seconds'))} logical s"
        ]
    else:
        lines = [
            "steady state        n/a: no iteration outside warm-up, drain and partial "
            "(a segment needs 3 iterations or more)"
        ]
    if per_phase and steady:
        lines.append(
            "  per phase         "
            + ", ".join(per_phase)
            + " tokens/s/device (steady state, over the time each phase's work took)"
        )
    if counted:
        lines.append(
            f"whole loop          {num(window.get('tokens_per_s_per_device'))} tokens/s/device "
            f"over all {iterations} iterations: {num(window.get('tokens'))} tokens / "
            f"{num(window.get('seconds'))} active logical s"
        )
    # A tag counted but never published reads 0 above: say why, not only 0 (in a run
    # still being written, once an iteration was done: before, none could be).
    if report.get("live") is None or report["iterations"]:
        for tag, why in report.get("missing_sample_tags", {}).items():
            lines.append(f"{f'no {tag} samples':<19} {why}")
    return lines


def _device_lines(placement: Mapping[str, Any]) -> list[str]:
    """What every tokens/s/device divides by, where that came from, and which workers
    used each device (the placement's)."""
    counts = [("run", placement.get("window"))]
    counts += list(placement.get("phases", {}).items())
    shown = [(name, d) for name, d in counts if d]
    if not shown:
        return []
    sources = {d["from"] for _, d in shown}
    where = (
        "from the placement"
        if sources == {"placement"}
        else "given in the configuration"
        if sources == {"config"}
        else "placement or configuration, as the summary's placement says"
    )
    lines = [
        "devices             "
        + ", ".join(f"{name} {_count(d['devices'])}" for name, d in shown)
        + f" (the denominators of tokens/s/device; {where})"
    ]
    users: dict[str, list[str]] = {}
    for worker, w in placement.get("workers", {}).items():
        for device in w["devices"] or [f"{w['count']} unnamed"]:
            users.setdefault(f"{device} ({w['device_type']})", []).append(worker)
    lines += [f"  {device:<18}used by {', '.join(names)}" for device, names in users.items()]
    return lines + _disagreeing(shown, placement.get("workers", {}))


def _disagreeing(shown: list[tuple[str, Any]], workers: Mapping[str, Any]) -> list[str]:
    """A line naming each denominator the configuration gave where the placement's
    workers of it hold another number of devices (the configuration's wins)."""
    found = []
    # (the run's devices are every worker's: compared only when each phase was placed)
    whole = all(any(p in w["phases"] for w in workers.values()) for p, _ in shown if p != "run")
    for name, d in shown:
        mine = [w for w in workers.values() if name == "run" or name in w["phases"]]
        if d["from"] != "config" or not mine or (name == "run" and not whole):
            continue
        named = {(w["device_type"], device) for w in mine for device in w["devices"]}
        placed = len(named) + sum(w["count"] for w in mine if not w["devices"])
        if placed != d["devices"]:
            found.append(f"{name} {_count(d['devices'])} given, {placed} placed")
    if not found:
        return []
    return [
        "  not the placement's: " + ", ".join(found) + " (the configuration's count divides; "
        "leave its devices out to divide by the placement's)"
    ]


def _time_lines(seconds: Mapping[str, Any]) -> list[str]:
    """Wall, busy, idle and twinkle's own seconds, each as set-up + loop + tear-down
    (shown so that the parts add up to the total shown)."""
    names = {"wall": "wall clock (all-in)", "busy": "  busy", "idle": "  idle"}
    names["overhead"] = "  twinkle's own"
    lines = []
    for key, name in names.items():
        total, parts = seconds.get(key), seconds.get("parts", {}).get(key, {})
        values = [parts.get(p) for p in ("setup", "loop", "teardown")]
        if total is None or None in values:
            lines.append(f"{name:<20}{num(total)} s")
            continue
        t, setup, loop, teardown = split_exactly(total, values)
        lines.append(f"{name:<20}{t} s = set-up {setup} + loop {loop} + tear-down {teardown}")
    return lines


def format_report(report: Mapping[str, Any], *, legend: bool = True) -> str:
    """The report as text: the per-iteration table, the run's figures (the steady state
    first) and, with ``legend``, what each column shows."""
    lines = [*head_lines(report), ""]
    lines += [*limits_lines(report), ""]
    lines += iteration_table(report)
    if _segmented(report):
        lines += ["", segments_line(report["segments"])]
    seconds = report["seconds"]
    lines += ["", *throughput_lines(report), *framework_lines(report.get("framework"))]
    lines += _device_lines(report.get("placement") or {})
    lines += clock_skew_lines(report.get("clock_skew"))
    lines += mfu_lines(report)
    lines += _time_lines(seconds)
    lines.append(
        "phase seconds       "
        + ", ".join(f"{p} {num(v) if v else 'none ran'}" for p, v in seconds["phases"].items())
        + (
            " (each phase's union over the run)"
            if seconds["phases"]
            else "none configured (config.phases)"
        )
    )
    lines += no_phase_lines(seconds, report.get("no_phase"))
    if seconds["generation_hidden_share"] is not None:
        lines.append(
            f"gen. with training  {num(seconds['generation_hidden_seconds'])} s "
            f"({100 * seconds['generation_hidden_share']:.1f}% of generation ran while "
            "training ran: concurrency, not a saving)"
        )
    rewards = [
        (r["iteration"], r["reward"]) for r in report["iterations"] if r.get("reward") is not None
    ]
    if rewards:
        lines.append(
            f"reward ({report['reward']})  {num(rewards[0][1])} (iteration {rewards[0][0]}) -> "
            f"{num(rewards[-1][1])} (iteration {rewards[-1][0]})"
        )
    lines += memory_lines(report)
    if legend:
        lines += ["", *legend_lines(report)]
    return as_text(lines)


def memory_lines(report: Mapping[str, Any]) -> list[str]:
    """Each worker's peaks; of many workers, those holding the highest (any field),
    then how many more the JSON report holds."""
    peaks: Mapping[str, Mapping[str, int]] = report["memory_peak_bytes"]
    if not peaks:
        return [f"{'peak memory':<20}none read (run.read_memory(iteration=i) reads a worker's)"]
    workers = list(peaks) if len(peaks) <= NAMED_WORKERS else highest_peaks(peaks)
    lines = [
        f"{'peak memory' if not k else '':<20}{worker}: "
        + ", ".join(
            f"{name.removesuffix('_bytes')} {convert_bytes(v, 'MiB'):,.0f} MiB"
            for name, v in peaks[worker].items()
        )
        for k, worker in enumerate(workers[:NAMED_WORKERS])
    ]
    if len(workers) > NAMED_WORKERS:
        lines.append(
            f"{'':<20}(the {NAMED_WORKERS} highest of {len(workers)} workers; every one: "
            "report --json, memory_peak_bytes)"
        )
    return lines


def head_lines(report: Mapping[str, Any]) -> list[str]:
    """The run, its status and directory; the error it ended in (``summary.json``'s
    ``error``, a run that ended in error); and what a run not finished says of it."""
    lines = [f"run {report['run_id']} ({report['status']}): {report['run_dir']}"]
    if report.get("error"):
        lines.append(f"{'error':<20}{error_line(report['error'])}")
    if report.get("log_changed"):
        lines.append(
            f"{'event log':<20}changed since the run wrote it ({report['log_changed']}): "
            "these figures are the run's own, which the log no longer gives again "
            "(`twinkle replay` of it gives the log's as it is now)"
        )
    return [*lines, *live_lines(report)]


def live_lines(report: Mapping[str, Any]) -> list[str]:
    """What a report of a run that has not finished says of it (none for a finished
    run's): the figures are its log's so far."""
    live = report.get("live")
    if live and "files_missing" in live:
        missing = live["files_missing"]
        files = (
            f"it has no {' and no '.join(missing)}"
            if missing
            else "its summary.json covers fewer segments than its log"
        )
        return [
            f"its log holds its finish, but {files} (a process killed as it finished, or "
            "the log copied alone): these figures are its log's, and `twinkle replay "
            "events.jsonl --out DIR` writes its files anew"
        ]
    if not live or live["state"] == "finished":
        return []
    events = f"the figures of its first {live['events']:,} events"
    if live.get("whole_log_why"):  # (a long run's report takes long: say why)
        events += f" (read from the whole log: {live['whole_log_why']})"
    if live["state"] == "in progress":
        return [f"in progress ({live['writer']}): {events}, closed at the last"]
    writer = "" if live["writer"] is None else f" ({live['writer']})"
    return [
        f"stopped without finishing{writer}: {events}; run it again with the same run id "
        "and out_dir to resume it"
    ]


def _compared(tag: str, report: Mapping[str, Any]) -> str:
    """A compared run's line: its id, status, iterations (and how many the steady state
    holds) and directory: the shape a ratio below depends on."""
    n = len(report["iterations"])
    steady = report["window"].get("steady_iterations")
    shape = f"{n} iteration{'' if n == 1 else 's'}" + (
        "" if steady is None else f", {steady} steady"
    )
    return f"{tag}: run {report['run_id']} ({report['status']}, {shape}): {report['run_dir']}"


def format_compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """Two runs side by side, each figure with B / A."""
    rows = [
        [
            r["figure"],
            num(r["a"]),
            num(r["b"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}x",
        ]
        for r in compare(a, b)
    ]
    lines = [_compared("A", a), _compared("B", b), ""]
    lines += _table(["figure", "A", "B", "B / A"], rows, names=True)
    differ = phases_differ(a, b)
    if differ:
        named = "; ".join(
            f"{phase} (A: {_names(both['a'])}, B: {_names(both['b'])})"
            for phase, both in differ.items()
        )
        lines += ["", f"phases defined differently, so their figures time other spans: {named}"]
    effect = streaming_effect(a, b)
    if effect is not None:
        ratio = effect["throughput_ratio"]
        with_, without = ("B", "A") if effect["overlapped"] == "b" else ("A", "B")
        lines += [
            "",
            f"streaming, measured: {with_} overlapped generation with training, {without} did "
            f"not; {with_}'s {effect['figure']} throughput is "
            + ("-" if ratio is None else f"{ratio:.3f}x")
            + f" {without}'s (same work assumed: check the tokens above)",
        ]
    return as_text(lines)


def _names(patterns: list[str] | None) -> str:
    """A phase's span names as config.phases gives them ("no such phase": None)."""
    return "no such phase" if patterns is None else ", ".join(patterns) or "no span"


def as_text(lines: list[str]) -> str:
    """The lines as the report's text, every string of the run's files in them (worker
    ids, scalar and phase names) with its control characters escaped: an escape
    sequence in a log is shown, never obeyed by the terminal. (printable() leaves the
    table's cells, escaped already, as they are.)"""
    return "\n".join(printable(line) for line in lines)
