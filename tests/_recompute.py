"""An independent recompute of a run's figures from ``events.jsonl`` alone.

Plain ``json`` and the interval code below, not twinkle's observers: the log is read
event by event, each window is measured from the spans that had arrived when it was
finalised (``finalise_lag`` boundaries after its end), and every per-iteration and run
figure is compared with the records (:func:`check_run`). Used by the torch demo's
recompute tests, the real-vLLM demo's and the TRL integration's.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from twinkle.metric import ModelShape, generation_flops, training_flops

Iv = tuple[int, int]


def merged(ivs: list[Iv]) -> list[Iv]:
    out: list[list[int]] = []
    for s, e in sorted(ivs):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(ivs: list[Iv]) -> int:
    return sum(e - s for s, e in merged(ivs))


def minus(a: list[Iv], b: list[Iv]) -> list[Iv]:
    out = []
    for s, e in merged(a):
        cur = s
        for hs, he in merged(b):
            if he <= cur or hs >= e:
                continue
            if hs > cur:
                out.append((cur, hs))
            cur = max(cur, he)
        if cur < e:
            out.append((cur, e))
    return out


def both(a: list[Iv], b: list[Iv]) -> int:
    return length(a) + length(b) - length(a + b)


class Recompute:
    """The figures, from the log's events in order."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        started = events[0]
        cfg = started["config"]
        self.phases: dict[str, list[str]] = cfg["phases"]
        self.streaming: dict[str, str] = cfg.get("streaming") or {}
        lifecycle = cfg.get("lifecycle") or {}
        self.teardown_phases = set(lifecycle.get("teardown", []))
        self.lifecycle = set(lifecycle.get("setup", [])) | self.teardown_phases
        self.pairs = [(p, q) for i, p in enumerate(self.phases) for q in list(self.phases)[i + 1 :]]
        lag = cfg.get("finalise_lag", 1)
        self.boundaries: list[tuple[int, int]] = []  # (iteration, monotonic_ns)
        self.pieces: list[tuple[int, str | None, int, int, Any]] = []  # (pos, phase, s, e, tid)
        self.over: list[tuple[int, int, int, Any]] = []  # (pos, s, e, tid)
        # (pos, worker, wait name or None, s, e): the worker is the engine, else the source
        self.by_worker: list[tuple[int, str, str | None, int, int]] = []
        # (pos, s, e, name): a span in no phase, not a wait
        self.unnamed: list[tuple[int, int, int, str]] = []
        # (pos, s, e, tid, side) of a publish piece: True on the engines (an engine named,
        # a source placed there), False on the trainer (placed there), else None
        self.publish: list[tuple[int, int, int, Any, bool | None]] = []
        # (pos, phase, tid) of every span (the threads that generated, that trained)
        self.threads: list[tuple[int, str | None, Any]] = []
        placed = {
            name: set(worker["phases"]) for name, worker in (cfg.get("placement") or {}).items()
        }
        gen, train = self.streaming.get("generation"), self.streaming.get("training")
        worker_side = {
            name: train not in phases for name, phases in placed.items() if {gen, train} & phases
        }
        self.late_ns = 0
        self.spans: list[dict[str, Any]] = []
        self.samples: dict[tuple[int, str], list[int]] = {}
        #: position of the event that finalised each boundary's window ("setup" = 0)
        self.finalised_at: dict[int, int] = {}
        horizon: int | None = None
        for pos, ev in enumerate(events):
            kind = ev["type"]
            if kind == "iteration_started":
                self.boundaries.append((ev["iteration"], ev["monotonic_ns"]))
                k = len(self.boundaries)
                if k - lag >= 1:  # the window closed by boundary number k - lag is done
                    horizon = self.boundaries[k - lag - 1][1]
                    self.finalised_at[k - lag - 1] = pos
            elif kind == "spans":
                offset = placement(ev, started)
                for s in span_list(ev):
                    start, end = s["start_ns"] + offset, s["end_ns"] + offset
                    tid = (s["pid"], s["thread_id"])  # (two processes' idents may coincide)
                    if s["name"] == "twinkle.observe":
                        self.over.append((pos, start, end, tid))
                        continue
                    self.spans.append(s)
                    self.threads.append((pos, self.phase(s["name"]), tid))
                    if horizon is not None and start < horizon:
                        self.late_ns += min(end, horizon) - start
                    if horizon is None or end > horizon:
                        piece_start = start if horizon is None else max(start, horizon)
                        self.pieces.append((pos, self.phase(s["name"]), piece_start, end, tid))
                        if self.phase(s["name"]) is None and not s["name"].startswith("wait."):
                            self.unnamed.append((pos, piece_start, end, s["name"]))
                        engine = s["attrs"].get("engine")
                        named = isinstance(engine, str) and engine != ""
                        worker = engine if named else ev["source"]
                        wait = s["name"] if s["name"].startswith("wait.") else None
                        self.by_worker.append((pos, worker, wait, piece_start, end))
                        if self.phase(s["name"]) == self.streaming.get("publish", ""):
                            side = True if named else worker_side.get(ev["source"])
                            self.publish.append((pos, piece_start, end, tid, side))
            elif kind == "samples":
                self.samples.setdefault((ev["iteration"], ev["phase"]), []).extend(ev["lengths"])
            elif kind == "run_finished":
                self.finish: int = ev["monotonic_ns"]
                self.finish_pos = pos
                self.status: str = ev["status"]
        self.run_start: int = started["monotonic_ns"]
        # the names in no phase counted one by one: the first 32 seen; "" the later ones
        unnamed_names = [
            s["name"]
            for s in self.spans
            if self.phase(s["name"]) is None and not s["name"].startswith("wait.")
        ]
        self.kept_names = list(dict.fromkeys(unnamed_names))[:32]

    def phase(self, name: str) -> str | None:
        for phase, patterns in self.phases.items():
            if any(fnmatchcase(name, p) if p.endswith("*") else name == p for p in patterns):
                return phase
        return None

    def measure(self, lo: int, hi: int, before: int) -> dict[str, Any]:
        pieces = [
            (ph, max(s, lo), min(e, hi), t)
            for p, ph, s, e, t in self.pieces
            if p < before and e > lo and s < hi
        ]
        over = [
            (max(s, lo), min(e, hi), t)
            for p, s, e, t in self.over
            if p < before and e > lo and s < hi
        ]
        by = {ph: [(s, e) for q, s, e, _ in pieces if q == ph] for ph in self.phases}
        logical = {}
        for ph in self.phases:
            kept: list[Iv] = []
            for tid in {t for q, _, _, t in pieces if q == ph}:
                mine = [(s, e) for q, s, e, t in pieces if q == ph and t == tid]
                kept += minus(mine, [(s, e) for s, e, t in over if t == tid])
            logical[ph] = length(kept)
        busy = length([iv for ivs in by.values() for iv in ivs])
        overhead = [(s, e) for s, e, _ in over]
        unnamed = [
            (max(s, lo), min(e, hi), name if name in self.kept_names else "")
            for p, s, e, name in self.unnamed
            if p < before and e > lo and s < hi
        ]
        busy_ivs = [iv for ivs in by.values() for iv in ivs]
        return {
            "unnamed": length(minus([(s, e) for s, e, _ in unnamed], busy_ivs)),
            "unnamed_by_name": {
                key: length(minus([(s, e) for s, e, k in unnamed if k == key], busy_ivs))
                for key in {k for _, _, k in unnamed}
            },
            "path": self.path(hi - lo, by, overhead, self.publish_sides(lo, hi, before)),
            "wall": hi - lo,
            "overhead": length([(s, e) for s, e, _ in over]),
            "busy": busy,
            "span": sum(e - s for _, s, e, _ in pieces),
            "phase": {ph: length(ivs) for ph, ivs in by.items()},
            "logical": logical,
            "overlap": {(p, q): both(by[p], by[q]) for p, q in self.pairs},
        }

    def publish_sides(self, lo: int, hi: int, before: int) -> dict[bool, list[Iv]]:
        """The publish pieces in ``[lo, hi)`` by side (True: the engines'): the span's
        own, else its thread's: the engines' if it generated and never trained (by the
        spans logged before ``before``), else the trainer's."""
        gen, train = self.streaming.get("generation"), self.streaming.get("training")
        generated = {t for p, ph, t in self.threads if p < before and ph == gen}
        trained = {t for p, ph, t in self.threads if p < before and ph == train}
        out: dict[bool, list[Iv]] = {True: [], False: []}
        for p, s, e, tid, side in self.publish:
            if p < before and e > lo and s < hi:
                on = side if side is not None else (tid in generated and tid not in trained)
                out[on].append((max(s, lo), min(e, hi)))
        return out

    def path(
        self, wall: int, by: dict[str, list[Iv]], overhead: list[Iv], on: dict[bool, list[Iv]]
    ) -> dict[str, int]:
        """The window's critical path: the busier side's work first (the engines'
        generation, or the trainer's training; each side's union with the publish that
        ran on it), then publish, then the other side's, other phases, overhead, idle."""
        out = dict.fromkeys(("training", "publish", "generation", "other", "overhead"), 0)
        sides = {k: self.streaming.get(k) for k in ("training", "publish", "generation")}
        if "training" not in self.streaming:
            order: list[str] = []
        else:
            engines = by[self.streaming["generation"]] + on[True]
            trainer = by[self.streaming["training"]] + on[False]
            trainer_busier = length(engines) <= length(trainer)
            order = (
                ["training", "publish", "generation"]
                if trainer_busier
                else ["generation", "publish", "training"]
            )
        seen: list[Iv] = []
        for kind in order:
            side = sides[kind]
            ivs = by[side] if side else []
            out[kind] = length(minus(ivs, seen))
            seen += ivs
        named = {p for p in sides.values() if p}
        others = [iv for ph, ivs in by.items() if ph not in named for iv in ivs]
        out["other"] = length(minus(others, seen))
        seen += others
        out["overhead"] = length(minus(overhead, seen))
        out["idle"] = wall - sum(out.values())
        return out

    def loop_end(self) -> int:
        """The finish, or the start of the first span of a tear-down phase (stopping
        the workers) that starts in the last iteration's window."""
        last = self.boundaries[-1][1]
        starts = [
            s
            for pos, ph, s, _, _ in self.pieces
            if pos < self.finish_pos and ph in self.teardown_phases and last <= s < self.finish
        ]
        return min([self.finish, *starts])

    def flags(self) -> dict[int, list[str]]:
        """Each iteration's window flags: the first warm-up, the last drain (partial when
        the run did not finish ok)."""
        its = [it for it, _ in self.boundaries]
        out: dict[int, list[str]] = {it: [] for it in its}
        out[its[0]].append("warmup")
        out[its[-1]].append("drain" if self.status == "ok" else "partial")
        return out

    def waits(self) -> list[tuple[dict[str, int], dict[str, int]]]:
        """Per window: each worker's unaccounted ns (the workers seen in it or before),
        and each wait name's ns (per worker a union, then added)."""
        ends = [b for _, b in self.boundaries[1:]] + [self.loop_end()]
        seen: set[str] = set()
        out = []
        for k, ((_, lo), hi) in enumerate(zip(self.boundaries, ends, strict=True)):
            before = self.finalised_at.get(k + 1, self.finish_pos)
            mine = [
                (w, name, max(s, lo), min(e, hi))
                for p, w, name, s, e in self.by_worker
                if p < before and e > lo and s < hi
            ]
            seen |= {w for w, _, _, _ in mine}
            covered = {w: length(merged([(s, e) for v, _, s, e in mine if v == w])) for w in seen}
            waits: dict[str, int] = {}
            for name, w in {(n, w) for w, n, _, _ in mine if n is not None}:
                ivs = [(s, e) for v, n, s, e in mine if v == w and n == name]
                waits[name] = waits.get(name, 0) + length(merged(ivs))
            out.append(({w: hi - lo - ns for w, ns in covered.items()}, waits))
        return out

    def windows(self) -> list[dict[str, Any]]:
        ends = [b for _, b in self.boundaries[1:]] + [self.loop_end()]
        return [
            self.measure(b, end, self.finalised_at.get(k + 1, self.finish_pos))
            for k, ((_, b), end) in enumerate(zip(self.boundaries, ends, strict=True))
        ]

    def setup(self) -> tuple[dict[str, Any], int]:
        before = self.finalised_at.get(0, self.finish_pos)
        first_boundary = self.boundaries[0][1]
        starts = [s for p, _, s, _, _ in self.pieces if p < before]
        starts += [s for p, s, _, _ in self.over if p < before]
        lo = min([self.run_start, *starts])
        work = [
            s
            for p, ph, s, _, _ in self.pieces
            if p < before and ph is not None and ph not in self.lifecycle
        ]
        active_from = min([first_boundary, *work])
        return self.measure(lo, first_boundary, before), active_from

    def teardown(self) -> dict[str, Any]:
        end = max([self.finish, *(e for _, _, _, e, _ in self.pieces)])
        return self.measure(self.loop_end(), end, self.finish_pos + 1)


def shift(anchor: dict[str, Any], run: dict[str, Any]) -> int:
    """What the anchors say places a batch's spans on the run's timeline: 0 from the
    run's own process, else the difference of the two processes' wall-minus-monotonic
    offsets."""
    if (anchor["pid"], anchor["hostname"]) == (run["pid"], run["hostname"]):
        return 0
    anchor_offset: int = anchor["wall_ns"] - anchor["monotonic_ns"]
    run_offset: int = run["wall_ns"] - run["monotonic_ns"]
    return anchor_offset - run_offset


#: config.clock_skew's defaults (docs/metrics.md), in ns
AHEAD_NS, BEHIND_NS = 10_000_000, 1_000_000_000


def skew_offset(batch: dict[str, Any], started: dict[str, Any]) -> int | None:
    """A worker batch's send, placed by the anchors, minus its arrival (the batch's
    ``monotonic_ns``); None when it carries no send time (the run's own recorders)."""
    sent = batch.get("sent_anchor")
    if sent is None:
        return None
    sent_ns: int = sent["monotonic_ns"]
    arrival_ns: int = batch["monotonic_ns"]
    return sent_ns + shift(batch["anchor"], started["anchor"]) - arrival_ns


def skewed(batch: dict[str, Any], started: dict[str, Any]) -> bool:
    """Whether the batch's send falls beyond the run's clock_skew tolerance."""
    offset = skew_offset(batch, started)
    spec = started["config"].get("clock_skew") or {}
    ahead = round(spec.get("ahead_s", AHEAD_NS / 1e9) * 1e9)
    behind = round(spec.get("behind_s", BEHIND_NS / 1e9) * 1e9)
    return offset is not None and not -behind <= offset <= ahead


def skew_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``clock_skew`` (its counts and workers) from the log: a report split
    over consecutive lines (same arrival and send) counts once."""
    started, checked = events[0], 0
    workers: dict[str, dict[str, Any]] = {}
    last: dict[str, Any] = {}
    for batch in events:
        offset = skew_offset(batch, started) if batch["type"] == "spans" else None
        if offset is None:
            continue
        key = (batch["monotonic_ns"], batch["sent_anchor"])
        new = last.get(batch["source"]) != key
        last[batch["source"]] = key
        checked += new
        if not skewed(batch, started):
            continue
        worker = workers.setdefault(
            batch["source"],
            {"hostname": batch["anchor"]["hostname"], "reports": 0, "spans": 0, "offset": 0},
        )
        worker["reports"] += new
        worker["spans"] += len(span_list(batch))
        if abs(offset) > abs(worker["offset"]):
            worker["offset"], worker["hostname"] = offset, batch["anchor"]["hostname"]
    return {
        "checked_reports": checked,
        "workers": {
            source: {
                "hostname": w["hostname"],
                "corrected_reports": w["reports"],
                "corrected_spans": w["spans"],
                "offset_seconds": w["offset"] / 1e9,
            }
            for source, w in sorted(workers.items())
        },
    }


def placement(batch: dict[str, Any], started: dict[str, Any]) -> int:
    """What places a batch's spans on the run's timeline: the anchors' shift, or for a
    skewed worker's batch the one that puts its send at its arrival."""
    if skewed(batch, started):
        arrival_ns: int = batch["monotonic_ns"]
        sent_ns: int = batch["sent_anchor"]["monotonic_ns"]
        return arrival_ns - sent_ns
    return shift(batch["anchor"], started["anchor"])


def _s(ns: int) -> float:
    return ns / 1e9


def check_run(run_dir: Path) -> dict[str, Any]:
    """Recompute every figure of the run in ``run_dir``; returns its run timing record."""
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    records = [json.loads(x) for x in (run_dir / "metrics_raw.jsonl").read_text().splitlines()]
    rc = Recompute(events)
    timing = {
        r["iteration"]: r["values"]
        for r in records
        if r["kind"] == "timing" and r["scope"] == "iteration"
    }
    windows = rc.windows()
    assert sorted(timing) == [it for it, _ in rc.boundaries]
    for (it, _), w in zip(rc.boundaries, windows, strict=True):
        t = timing[it]
        assert t["window_wall_seconds"] == _s(w["wall"])
        assert t["window_overhead_seconds"] == _s(w["overhead"])
        assert t["window_logical_seconds"] == _s(w["wall"] - w["overhead"])
        assert t["window_busy_seconds"] == _s(w["busy"])
        assert t["window_idle_seconds"] == _s(w["wall"] - w["busy"])
        assert t["window_span_seconds"] == _s(w["span"])
        assert t["window_unnamed_seconds"] == _s(w["unnamed"])
        assert t["window_busy_seconds"] <= t["window_wall_seconds"]
        for ph in rc.phases:
            assert t[f"window_{ph}_seconds"] == _s(w["phase"][ph]), (it, ph)
            assert t[f"window_{ph}_logical_seconds"] == _s(w["logical"][ph]), (it, ph)
        for p, q in rc.pairs:
            assert t[f"window_overlap_{p}_{q}_seconds"] == _s(w["overlap"][(p, q)])
        for kind, ns in w["path"].items():
            assert t[f"window_path_{kind}_seconds"] == _s(ns), (it, kind)
    check_waits(rc, records)
    check_mfu(events, records, timing)
    setup, active_from = rc.setup()
    teardown = rc.teardown()
    parts = [setup, *windows, teardown]
    total = {k: sum(p[k] for p in parts) for k in ("wall", "overhead", "busy", "span", "unnamed")}
    run: dict[str, Any]
    (run,) = [r["values"] for r in records if r["kind"] == "timing" and r["scope"] == "run"]
    assert run["wall_seconds"] == _s(total["wall"])
    assert run["busy_seconds"] == _s(total["busy"])
    assert run["overhead_seconds"] == _s(total["overhead"])
    assert run["idle_seconds"] == _s(total["wall"] - total["busy"])
    assert run["unnamed_seconds"] == _s(total["unnamed"])
    for name, part in (("setup", setup), ("teardown", teardown)):
        assert run[f"{name}_wall_seconds"] == _s(part["wall"])
        assert run[f"{name}_busy_seconds"] == _s(part["busy"])
    loop = {k: sum(w[k] for w in windows) for k in ("wall", "overhead", "busy")}
    assert run["loop_wall_seconds"] == _s(loop["wall"])
    assert run["loop_busy_seconds"] == _s(loop["busy"])
    assert run["loop_idle_seconds"] == _s(loop["wall"] - loop["busy"])
    assert run["loop_overhead_seconds"] == _s(loop["overhead"])
    assert run["late_seconds"] == _s(rc.late_ns)
    # every span's duration: in a window (clipped) or late
    assert total["span"] + rc.late_ns == sum(s["end_ns"] - s["start_ns"] for s in rc.spans)
    for ph in rc.phases:
        assert run[f"{ph}_seconds"] == _s(sum(p["phase"][ph] for p in parts)), ph
        assert run[f"{ph}_logical_seconds"] == _s(sum(p["logical"][ph] for p in parts)), ph
    overlap = {pq: sum(p["overlap"][pq] for p in parts) for pq in rc.pairs}
    for (p, q), ns in overlap.items():
        assert run[f"overlap_{p}_{q}_seconds"] == _s(ns)
    hidden = overlap[("rollout", "train")]
    generation = sum(p["phase"]["rollout"] for p in parts)
    assert run["generation_hidden_seconds"] == _s(hidden)
    assert run["generation_hidden_share"] == hidden / generation
    # throughput: the iteration's tokens over its window's logical seconds; the run's
    # every generated token over the active logical seconds (from the first span of
    # the loop's work to the loop's end)
    lead_in = rc.measure(active_from, rc.boundaries[0][1], rc.finish_pos)
    active_ns = (lead_in["wall"] - lead_in["overhead"]) + sum(
        p["wall"] - p["overhead"] for p in windows
    )
    assert run["active_logical_seconds"] == _s(active_ns)
    it_records = {r["iteration"]: r for r in records if r["kind"] == "iteration"}
    # the window's devices: the configuration's (the demo and one TRL process: 1)
    devices = events[0]["config"].get("window", {}).get("devices", 1)
    flags = rc.flags()
    steady_tokens = steady_ns = 0
    for (it, _), w in zip(rc.boundaries, windows, strict=True):
        tokens = sum(rc.samples.get((it, "rollout"), []))
        values = it_records[it]["values"]
        assert values["tokens"] == tokens
        seconds = _s(w["wall"] - w["overhead"])
        assert values["tokens_per_s_per_device"] == pytest.approx(
            tokens / seconds / devices, rel=1e-15
        )
        assert it_records[it]["attrs"]["window_flags"] == flags[it]
        assert values["steady"] == timing[it]["window_steady"] == int(not flags[it])
        if not flags[it]:
            steady_tokens += tokens
            steady_ns += w["wall"] - w["overhead"]
    (window,) = [r["values"] for r in records if r["kind"] == "run"]
    tokens = sum(sum(v) for (_, tag), v in rc.samples.items() if tag == "rollout")
    assert window["tokens"] == tokens
    assert window["seconds"] == _s(active_ns)
    assert window["tokens_per_s_per_device"] == pytest.approx(
        tokens / _s(active_ns) / devices, rel=1e-15
    )
    assert window["steady_iterations"] == sum(not f for f in flags.values())
    assert window["steady_tokens"] == steady_tokens
    assert window["steady_seconds"] == pytest.approx(_s(steady_ns), rel=1e-15)
    if steady_ns:
        assert window["steady_tokens_per_s"] == pytest.approx(
            steady_tokens / _s(steady_ns), rel=1e-15
        )
    phase_windows = {r["kind"]: r["values"] for r in records if r["scope"] == "window"}
    rollout_logical = sum(p["logical"]["rollout"] for p in parts)
    assert phase_windows["rollout"]["seconds"] == _s(rollout_logical)
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = skew_summary(events)
    assert {k: summary["clock_skew"][k] for k in expected} == expected
    idle: dict[str, int] = {}
    for part in parts:
        for key, ns in part["unnamed_by_name"].items():
            idle[key] = idle.get(key, 0) + ns
    check_no_phase(rc, summary["spans"]["no_phase"], idle)
    return run


def check_no_phase(rc: Recompute, no_phase: dict[str, Any], idle: dict[str, int]) -> None:
    """The spans no phase names (waits aside), by name (the first 32 names; the later
    ones together, key ""), summed durations and the idle time each ran in."""
    by_key: dict[str, list[int]] = {}
    for s in rc.spans:
        if rc.phase(s["name"]) is None and not s["name"].startswith("wait."):
            key = s["name"] if s["name"] in rc.kept_names else ""
            counts = by_key.setdefault(key, [0, 0])
            counts[0] += 1
            counts[1] += s["end_ns"] - s["start_ns"]

    def entry(key: str) -> dict[str, Any]:
        n, ns = by_key.get(key, [0, 0])
        return {"spans": n, "seconds": _s(ns), "idle_seconds": _s(idle.get(key, 0))}

    assert no_phase["names"] == {name: entry(name) for name in sorted(rc.kept_names)}
    assert no_phase["other"] == entry("")
    assert no_phase["spans"] == sum(n for n, _ in by_key.values())
    assert no_phase["seconds"] == _s(sum(ns for _, ns in by_key.values()))


def check_mfu(
    events: list[dict[str, Any]], records: list[dict[str, Any]], timing: dict[int, Any]
) -> None:
    """Each ``mfu`` record (with ``config.mfu``): its phases' FLOPs from the log's samples
    by twinkle.metric's formulas, over the timing record's attributed seconds."""
    config = events[0]["config"]
    mfu = config.get("mfu")
    if mfu is None:
        assert not [r for r in records if r["kind"] == "mfu"]
        return
    shape = ModelShape.from_dict(mfu["model"])
    streaming = config.get("streaming", {})
    work = {mfu.get(k, streaming.get(k)): k for k in ("training", "generation")}
    work.pop(None, None)
    samples = [e for e in events if e["type"] == "samples"]
    for r in (r for r in records if r["kind"] == "mfu" and r["scope"] == "iteration"):
        it = r["iteration"]
        for phase, kind in work.items():
            spec = config["throughput"][phase]
            mine = [e for e in samples if e["iteration"] == it and e["phase"] == spec["samples"]]
            lengths = [n for e in mine for n in e["lengths"]]
            # (a sample without prompt lengths: the LM head on each of its tokens)
            prompts = [p for e in mine for p in e.get("prompt_lengths") or [0] * len(e["lengths"])]
            if kind == "training":
                head_on_all = mfu.get("logits", "all") == "all"
                flops = training_flops(
                    shape,
                    lengths,
                    recompute=mfu.get("recompute", False),
                    prompt_lengths=None if head_on_all else prompts,
                )
            else:
                flops = generation_flops(shape, prompts, [n - p for n, p in zip(lengths, prompts)])
            values = r["values"]
            assert values[f"{phase}_flops"] == float(flops), (it, phase)
            # the phase's throughput record's device seconds: its attributed seconds
            key = (phase, "iteration", it)
            (tp,) = [q for q in records if (q["kind"], q["scope"], q["iteration"]) == key]
            assert values[f"{phase}_device_seconds"] == tp["values"]["device_seconds"]
            assert tp["values"]["seconds"] == timing[it][f"attributed_{phase}_seconds"]


def check_waits(rc: Recompute, records: list[dict[str, Any]]) -> None:
    """Each window's ``waits`` record: the workers' unaccounted time reduced, the waits."""
    waits = {r["iteration"]: r for r in records if r["kind"] == "waits"}
    names: set[str] = set()
    for (it, _), (unaccounted, by_name) in zip(rc.boundaries, rc.waits(), strict=True):
        names |= set(by_name)
        if not unaccounted:
            assert it not in waits
            continue
        values, attrs = waits[it]["values"], waits[it]["attrs"]
        most = max(unaccounted.values())
        assert values["unaccounted_seconds_max"] == _s(most)
        assert values["unaccounted_seconds_min"] == _s(min(unaccounted.values()))
        assert values["unaccounted_seconds_mean"] == pytest.approx(
            _s(sum(unaccounted.values())) / len(unaccounted), rel=1e-15
        )
        assert values["unaccounted_workers"] == len(unaccounted)
        assert attrs["unaccounted_argmax_worker"] == min(
            w for w, ns in unaccounted.items() if ns == most
        )
        for name in names:
            assert values[f"{name}_seconds"] == _s(by_name.get(name, 0)), (it, name)


FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's log, event by event; a span batch's spans also as a list of objects
    (``spans``, :func:`span_list`)."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for ev in events:
        if ev["type"] == "spans":
            ev["spans"] = span_list(ev)
    return events


def span_list(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """The spans of a ``spans`` line as objects, read from its columns as
    docs/architecture.md ("The event log") describes them (here, not twinkle's reader),
    or the list an older log holds."""
    if "spans" in ev:  # (an older log's list, or read_events' expansion)
        return list(ev["spans"])
    c = ev["columns"]
    n = len(c["start"])
    if not n:
        return []

    def column(table: str, index: str) -> list[Any]:
        if table not in c:
            return [None] * n
        return [c[table][i] for i in c[index]] if index in c else [c[table][0]] * n

    values = {k: iter(v) for k, v in c.get("values", {}).items()}
    keys = column("keys", "key") if "keys" in c else [[]] * n
    rows = zip(
        column("names", "name"), c["start"], c["dur"], column("threads", "thread"),
        column("pids", "pid"), keys, column("errors", "error"), strict=True,
    )  # fmt: skip
    return [
        {
            "name": name,
            "start_ns": c["t0"] + start,
            "end_ns": c["t0"] + start + dur,
            "thread_id": thread,
            "pid": pid,
            "attrs": {k: next(values[k]) for k in names},
            "error": error,
        }
        for name, start, dur, thread, pid, names, error in rows
    ]


def check_replay(run_dir: Path, out: Path) -> None:
    """Replaying the log into ``out`` gives the run's five files byte for byte."""
    from twinkle.run import replay

    replay(run_dir / "events.jsonl", out)
    for name in FILES:
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


def placed_spans(
    events: list[dict[str, Any]], sources: set[str]
) -> list[tuple[str, dict[str, Any], int, int]]:
    """(source, span, start, end) of every span of ``sources``: its start and end on the
    run's timeline, moved there by its batch's placement (compare with :func:`windows`)."""
    out = []
    for batch in events:
        if batch["type"] != "spans" or batch["source"] not in sources:
            continue
        offset = placement(batch, events[0])
        for span in span_list(batch):
            out.append((batch["source"], span, span["start_ns"] + offset, span["end_ns"] + offset))
    return out


def windows(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each iteration's window on the run's timeline: its boundary to the next (the last
    one's to the run's finish)."""
    boundaries = [e["monotonic_ns"] for e in events if e["type"] == "iteration_started"]
    finish = [e["monotonic_ns"] for e in events if e["type"] == "run_finished"][-1]
    return list(zip(boundaries, [*boundaries[1:], finish], strict=True))
