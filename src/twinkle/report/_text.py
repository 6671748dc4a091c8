"""The report as text: the per-iteration table, the run's figures and a legend (one
vocabulary, docs/metrics.md "Report columns"), and two runs side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from twinkle.checks import printable
from twinkle.metric import convert_bytes
from twinkle.report._compare import compare, streaming_effect

__all__ = [
    "FLAG_NAMES",
    "LEGEND",
    "format_compare",
    "format_live",
    "format_report",
    "split_exactly",
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

LEGEND = (
    "columns (docs/metrics.md, 'Report columns'):",
    "  seg                the segment (a resumed run's process) the iteration ran in",
    "  limit              what bounds the window: train, gen, publish, mixed, - (no verdict)",
    "  flag               warm-up (a segment's first), drain (its last), partial (cut short):"
    " left out of the steady state",
    "  tok/s/dev          the iteration's tokens over its window's logical seconds (window view)",
    "  <phase> tok/s/dev  the phase's tokens over the time its work took (attributed view)",
    "  wall/busy/idle s   its window, from its boundary to the next (window view)",
    "  <phase> s          the phase's union within the window (window view)",
    "  attr <phase> s     the phase's work done for the iteration, wherever it ran (attributed)",
    "  <gen>&<train> s    generation and training at once within the window (window view)",
    "  <phase> MFU %      the phase's model FLOP/s per device over the peak (HFU: recomputed"
    " activations counted); ! over 100%: implied, not a utilisation",
)


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _count(value: Any) -> str:
    """A device count: whole numbers without decimals."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    return _num(value)


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


def _iteration_table(report: Mapping[str, Any]) -> list[str]:
    return _table(*iteration_cells(report))


def iteration_cells(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The per-iteration table's header and rows of cells (as the text table shows
    them; the HTML report's too)."""
    phases, rated = report["loop_phases"], report["throughput_phases"]
    segmented = len(report.get("segments", ())) > 1
    header = ["iter", *(["seg"] if segmented else []), "flag", "limit", "tokens", "tok/s/dev"]
    header += [f"{p} tok/s/dev" for p in rated]
    header += ["wall s", "busy s", "idle s"]
    header += [f"{p} s" for p in phases]
    header += [f"attr {p} s" for p in phases]
    has_overlap = report.get("streaming") is not None
    if has_overlap:
        header.append("{}&{} s".format(*report["streaming"]))
    utilised = _mfu_phases(report)
    header += [f"{p} {figure.upper()} %" for p, figure in utilised.items()]
    if report["reward"]:
        header.append("reward")
    rows = []
    for r in report["iterations"]:
        flags = ",".join(FLAG_NAMES.get(f, f) for f in r.get("window_flags", []))
        row = [str(r["iteration"]), *([str(r.get("segment", "-"))] if segmented else [])]
        limit = VERDICT_NAMES.get(r.get("window_verdict") or "", "-")
        row += [flags, limit, _num(r.get("tokens")), _num(r.get("tokens_per_s_per_device"))]
        row += [_num(r.get("phase_tokens_per_s_per_device", {}).get(p)) for p in rated]
        row += [_num(r.get(f"window_{k}_seconds")) for k in ("wall", "busy", "idle")]
        row += [_num(r.get("window_phase_seconds", {}).get(p)) for p in phases]
        row += [_num(r.get("attributed_phase_seconds", {}).get(p)) for p in phases]
        if has_overlap:
            row.append(_num(r.get("window_overlap_generation_training_seconds")))
        row += [_share(r.get("phase_mfu", {}).get(p)) for p in utilised]
        if report["reward"]:
            row.append(_num(r.get("reward")))
        rows.append(row)
    return header, rows


def limits_lines(report: Mapping[str, Any]) -> list[str]:
    """ "What limits this run": the verdict on the steady state in plain words, each
    window's verdict counted, the critical path, how busy each side was, and at most
    what a twice-as-fast side would save."""
    limits = report.get("limits") or {}
    if "verdict" not in limits:
        return ["What limits this run: not known (the run's summary has no limits)"]
    windows = limits.get("windows", {})
    counted = ", ".join(
        f"{n} {name}" for name, n in sorted(windows.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    total = sum(windows.values())
    path = limits.get("path_seconds", {})
    shares = limits.get("path_shares", {})
    shown = [k for k in _PATH_ORDER if path.get(k) or k in ("training", "generation")]
    lines = [
        f"What limits this run ({limits.get('over', '-')}, docs/metrics.md 'What limits the run')",
        f"  verdict           {limits['verdict']}: {limits.get('reason', '-')}",
        f"  windows           {counted} (of {total})",
        "  critical path     "
        + ", ".join(f"{k} {_num(path[k])} s ({_pct(shares.get(k))})" for k in shown),
    ]
    busy = limits.get("busy_shares", {})
    if busy:
        lines.append(
            "  busy              "
            + ", ".join(f"{side} ran {_pct(share)}" for side, share in busy.items())
            + " of it"
        )
    stragglers = limits.get("stragglers") or {}
    if stragglers:
        lines.append(
            "  stragglers        "
            + "; ".join(_stragglers(side, s) for side, s in stragglers.items())
        )
    driver = limits.get("driver") or {}
    if driver:
        blocked = sum((driver.get("engines_blocked_seconds") or {}).values())
        lines.append(
            f"  driver            the trainer waited {_num(driver.get('trainer_wait_seconds'))} s "
            f"for rollouts; engines blocked on a full buffer {_num(blocked)} s; "
            f"{driver.get('produced', '-')} batches produced, {driver.get('consumed', '-')} "
            f"trained, {driver.get('dropped', '-')} dropped as stale, "
            f"{driver.get('left_in_buffer', '-')} left at the end"
        )
    never = limits.get("never_trained") or {}
    if never.get("unstarted_iterations"):
        tokens = ", ".join(f"{_num(n)} {tag}" for tag, n in never["unstarted_tokens"].items())
        lines.append(
            f"  never trained     {never['unstarted_iterations']} iterations observed but never "
            f"started: {_num(never['unstarted_span_seconds'])} s of spans"
            + (f", tokens {tokens}" if tokens else "")
        )
    workers = limits.get("workers") or {}
    for name, by_worker in (workers.get("waits") or {}).items():
        lines.append(f"  {name:<17} " + _most(by_worker) + " of their windows waiting")
    if workers.get("unaccounted"):
        lines.append(
            "  unaccounted       " + _most(workers["unaccounted"]) + " of their windows: no span"
        )
    age = limits.get("policy_age") or {}
    if age:
        lines.append(
            f"  policy age        mean {_num(age.get('mean'))}, max {age.get('max')} versions "
            f"behind the policy trained ({age.get('spans')} generation spans)"
        )
    faster = limits.get("twice_as_fast", {})
    if faster:
        lines.append(
            "  if 2x faster      "
            + "; ".join(
                f"{side}: at most {_pct(v.get('share'))} shorter" for side, v in faster.items()
            )
        )
    return lines


def _most(workers: Mapping[str, Mapping[str, Any]], shown: int = 3) -> str:
    """The ``shown`` workers with the most seconds, each with its share."""
    top = sorted(workers.items(), key=lambda kv: (-kv[1]["seconds"], kv[0]))
    words = [f"{w} {_num(v['seconds'])} s ({_pct(v.get('share'))})" for w, v in top[:shown]]
    return ", ".join(words) + (f" and {len(top) - shown} more" if len(top) > shown else "")


def _stragglers(side: str, found: Mapping[str, Any]) -> str:
    """One side's stragglers in words: the slow workers, or that none was, or why its
    workers were not compared."""
    workers = found.get("workers", {})
    if not workers:
        why = ", ".join(f"{n} iterations: {r}" for r, n in found.get("abstained", {}).items())
        return f"{side}: not compared ({why or 'no work seen'})"
    slow = [
        f"{name} {w.get('verdict')} ({w.get('median_ratio_to_peers', 0):.1f}x its peers' "
        f"seconds per {found.get('unit')}, slow in {w.get('slow_iterations')} of "
        f"{w.get('compared_iterations')} iterations)"
        for name, w in workers.items()
        if w.get("verdict") != "ok"
    ]
    return f"{side}: " + (", ".join(slow) if slow else f"none of {', '.join(workers)}")


#: the critical path's kinds, as docs/metrics.md orders them
_PATH_ORDER = ("training", "generation", "publish", "other", "overhead", "idle")


def _pct(share: Any) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _segment(s: Mapping[str, Any]) -> str:
    first, last = s["first_iteration"], s["last_iteration"]
    span = "no iteration" if first is None else f"iterations {first}-{last}"
    return f"{s['segment']}: {span} ({s['status'] or 'unfinished'})"


def _mfu_phases(report: Mapping[str, Any]) -> dict[str, str]:
    """The phases with an MFU column and the figure each shows (``mfu``, ``hfu``): none
    without a peak (the lines below the table say why)."""
    mfu = report.get("mfu") or {}
    if mfu.get("peak_flops_per_s") is None:
        return {}
    return {p: d["figure"] for p, d in mfu.get("phases", {}).items()}


def _share(found: Mapping[str, Any] | None) -> str:
    """A share of the peak in per cent; over 100 % marked ``!`` (implied, not MFU)."""
    if not found or found.get("share") is None:
        return "-"
    return f"{100 * found['share']:.1f}" + ("!" if found.get("implied") else "")


def _rate(flops_per_s: Any) -> str:
    if flops_per_s is None:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {unit}"
    return f"{flops_per_s:.3g} FLOP/s"


def mfu_lines(report: Mapping[str, Any]) -> list[str]:
    """The run's MFU per phase (steady state, then the whole loop) and its peak, or why
    there is none."""
    mfu = report.get("mfu")
    if not mfu:
        return []
    if "phases" not in mfu:
        return [f"MFU                 n/a: {mfu.get('abstained')}"]
    run = mfu.get("run", {})

    def figure(prefix: str, phase: str, work: Mapping[str, Any]) -> str:
        name = f"{prefix}{phase}_"
        rate = _rate(run.get(name + "flops_per_s_per_device"))
        share = run.get(name + work["figure"])
        implied = run.get(f"{name}implied_{work['figure']}")
        if share is not None:
            return f"{phase} {100 * share:.1f}% ({rate}/device)"
        if implied is not None:
            over = f"implied {100 * implied:.0f}%, not a utilisation"
            return f"{phase} over the peak: {over} ({rate}/device)"
        return f"{phase} {rate}/device"

    phases = mfu["phases"].items()
    peak = mfu.get("peak_flops_per_s")
    names = "/".join(sorted({w["figure"].upper() for _, w in phases}))
    names = names if peak is not None else "model FLOP/s"
    lines = [
        f"{names:<20}" + ", ".join(figure("steady_", p, w) for p, w in phases) + " (steady state)",
        "  whole loop        " + ", ".join(figure("", p, w) for p, w in phases),
    ]
    device = f"{mfu.get('device') or 'the device'}, {mfu.get('dtype')}"
    if peak is None:
        lines.append(f"  peak              none for {device}: {mfu.get('abstained')}")
    else:
        lines.append(
            f"  peak              {_rate(peak)} per device ({device}): {mfu.get('peak_source')}"
        )
    return lines


def _throughput_lines(report: Mapping[str, Any]) -> list[str]:
    """The steady state first, with each phase's; then the whole loop's."""
    window, iterations = report["window"], len(report["iterations"])
    steady = window.get("steady_iterations") or 0
    if steady:
        lines = [
            f"steady state        {_num(window.get('steady_tokens_per_s_per_device'))} "
            f"tokens/s/device over {steady} of {iterations} iterations (warm-up, drain and "
            f"partial left out): {_num(window.get('steady_tokens'))} tokens / "
            f"{_num(window.get('steady_seconds'))} logical s"
        ]
        per_phase = [
            f"{p} {_num(report['phase_windows'].get(p, {}).get('steady_tokens_per_s_per_device'))}"
            for p in report["throughput_phases"]
        ]
        if per_phase:
            lines.append(
                "  per phase         "
                + ", ".join(per_phase)
                + " tokens/s/device (steady state, over the time each phase's work took)"
            )
    else:
        lines = [
            "steady state        n/a: no iteration outside warm-up, drain and partial "
            "(a segment needs 3 iterations or more)"
        ]
    lines.append(
        f"whole loop          {_num(window.get('tokens_per_s_per_device'))} tokens/s/device "
        f"over all {iterations} iterations: {_num(window.get('tokens'))} tokens / "
        f"{_num(window.get('seconds'))} active logical s"
    )
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
    return lines


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
            lines.append(f"{name:<20}{_num(total)} s")
            continue
        t, setup, loop, teardown = split_exactly(total, values)
        lines.append(f"{name:<20}{t} s = set-up {setup} + loop {loop} + tear-down {teardown}")
    return lines


def format_report(report: Mapping[str, Any], *, legend: bool = True) -> str:
    """The report as text: the per-iteration table, the run's figures (the steady state
    first) and, with ``legend``, what each column shows."""
    lines = [f"run {report['run_id']} ({report['status']}): {report['run_dir']}"]
    lines += [*live_lines(report), ""]
    lines += [*limits_lines(report), ""]
    lines += _iteration_table(report)
    segments = report.get("segments", [])
    if len(segments) > 1:
        lines += ["", "segments            " + ", ".join(map(_segment, segments))]
    seconds = report["seconds"]
    lines += ["", *_throughput_lines(report), *_device_lines(report.get("placement") or {})]
    lines += mfu_lines(report)
    lines += _time_lines(seconds)
    lines.append(
        "phase seconds       "
        + ", ".join(f"{p} {_num(v)}" for p, v in seconds["phases"].items())
        + " (each phase's union over the run)"
    )
    if seconds["generation_hidden_share"] is not None:
        lines.append(
            f"gen. with training  {_num(seconds['generation_hidden_seconds'])} s "
            f"({100 * seconds['generation_hidden_share']:.1f}% of generation ran while "
            "training ran: concurrency, not a saving)"
        )
    rewards = [
        (r["iteration"], r["reward"]) for r in report["iterations"] if r.get("reward") is not None
    ]
    if rewards:
        lines.append(
            f"reward ({report['reward']})  {_num(rewards[0][1])} (iteration {rewards[0][0]}) -> "
            f"{_num(rewards[-1][1])} (iteration {rewards[-1][0]})"
        )
    lines += _memory_lines(report)
    if legend:
        lines += ["", *LEGEND]
    return _text(lines)


def _memory_lines(report: Mapping[str, Any]) -> list[str]:
    return [
        f"peak memory         {worker}: "
        + ", ".join(
            f"{k.removesuffix('_bytes')} {convert_bytes(v, 'MiB'):,.0f} MiB"
            for k, v in peaks.items()
        )
        for worker, peaks in report["memory_peak_bytes"].items()
    ]


def format_live(report: Mapping[str, Any], *, rows: int) -> str:
    """``twinkle watch``'s view: the run's state, what limits it, the last ``rows``
    iterations of the table, its throughput and memory (one vocabulary with
    :func:`format_report`)."""
    lines = [f"run {report['run_id']} ({report['status']}): {report['run_dir']}"]
    lines += [*live_lines(report), ""]
    lines += [*limits_lines(report), ""]
    table = _iteration_table(report)
    shown = table[2:][-rows:] if rows > 0 else []
    if len(shown) < len(table) - 2:
        lines.append(f"(the last {len(shown)} of {len(table) - 2} iterations)")
    lines += [*table[:2], *shown, ""]
    lines += _throughput_lines(report)
    lines += _memory_lines(report)
    return _text(lines)


def live_lines(report: Mapping[str, Any]) -> list[str]:
    """What a report of a run that has not finished says of it (none for a finished
    run's): the figures are its log's so far."""
    live = report.get("live")
    if not live or live["state"] == "finished":
        return []
    events = f"the figures of its first {live['events']:,} events"
    if live["state"] == "in progress":
        return [f"in progress ({live['writer']}): {events}, closed at the last"]
    writer = "" if live["writer"] is None else f" ({live['writer']})"
    return [
        f"stopped without finishing{writer}: {events}; run it again with the same run id "
        "and out_dir to resume it"
    ]


def format_compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """Two runs side by side, each figure with B / A."""
    rows = [
        [
            r["figure"],
            _num(r["a"]),
            _num(r["b"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}x",
        ]
        for r in compare(a, b)
    ]
    lines = [f"A: run {a['run_id']} ({a['run_dir']})", f"B: run {b['run_id']} ({b['run_dir']})", ""]
    lines += _table(["figure", "A", "B", "B / A"], rows, names=True)
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
    return _text(lines)


def _text(lines: list[str]) -> str:
    """The lines as the report's text, every string of the run's files in them (worker
    ids, scalar and phase names) with its control characters escaped: an escape
    sequence in a log is shown, never obeyed by the terminal. (printable() leaves the
    table's cells, escaped already, as they are.)"""
    return "\n".join(printable(line) for line in lines)
