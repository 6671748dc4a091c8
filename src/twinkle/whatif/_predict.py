"""The predicted run as a run: its event log, built from the simulation's timeline and
the recorded run's other events, replayed through the observers into a run directory
(docs/metrics.md, "What if: predicting another configuration").

The log is what the run would have logged:

* ``run_started`` with the recorded configuration, its placement changed to the
  predicted workers (a new engine or rank gets a device of its own when the recorded
  ones used devices no other worker used, else shares theirs) and ``x_whatif`` (the
  changes, the recorded run's path);
* the events before the loop (set-up spans and readings) as recorded;
* each iteration's ``iteration_started`` at its predicted begin, the spans finished by
  then in one batch, the iteration's samples, scalars, optimizer steps and memory
  readings at the same time after the same piece of the trainer's work as recorded,
  and each publication's ``weights_published``;
* the spans after the loop (tear-down) shifted by the loop's change, ``run_finished``
  at the predicted end.

So every figure of the predicted run is the observers' own, read as a recorded run's is.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from twinkle.events import Event, IterationStarted, RunFinished, RunStarted, SpanBatch
from twinkle.perf import Span
from twinkle.run import ReplayResult, replay
from twinkle.whatif._recorded import Recorded, shifted
from twinkle.whatif._schedule import Plan, Timeline
from twinkle.whatif._types import Piece
from twinkle.whatif._work import trainer_workers

__all__ = [
    "added_on_shared_devices",
    "contended_devices",
    "contended_why",
    "not_predicted",
    "speed_shared_note",
    "predicted_events",
    "write_prediction",
]

#: the predicted run's id: the recorded run's with this suffix
SUFFIX = "-whatif"


def _thawed(value: Any) -> Any:
    """``value`` (an event's, read-only) as plain dicts and lists to change."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(v) for v in value]
    return value


def _config(recorded: Recorded, plan: Plan, changes: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = _thawed(recorded.first.config)
    placement = config.get("placement")
    if isinstance(placement, dict) and placement:
        config["placement"] = _placement(placement, recorded, plan, changes.get("ranks"))
    config["x_whatif"] = {"recorded": str(recorded.path), "changes": changes}
    return config


def _placement(
    placement: dict[str, Any], recorded: Recorded, plan: Plan, ranks: int | None
) -> dict[str, Any]:
    """The recorded placement with the predicted engines and trainer ranks."""
    engines = [name for name in placement if name in recorded.engines]
    trainers = trainer_workers(recorded)
    out = {k: v for k, v in placement.items() if k not in engines}
    if engines:
        for k, e in enumerate(plan.engines):
            template = e.name if e.name in placement else engines[k % len(engines)]
            out[e.name] = _device_of(placement, template, e.name, engines)
    if ranks is not None and trainers:
        # a rank per device: the first ``ranks`` of the recorded ones kept, each worker
        # with as many as it keeps; more get a worker each, of one device
        slots = [name for name in trainers for _ in range(recorded.config.placement[name].count)]
        for name in trainers:
            del out[name]
        for name, kept in Counter(slots[:ranks]).items():
            out[name] = _with_ranks(placement[name], kept)
        one_rank = {**placement, trainers[-1]: _with_ranks(placement[trainers[-1]], 1)}
        for r in range(len(slots), ranks):
            out[f"rank{r}"] = _device_of(one_rank, trainers[-1], f"rank{r}", trainers)
    return out


def _with_ranks(entry: dict[str, Any], ranks: int) -> dict[str, Any]:
    """A trainer worker's entry keeping its first ``ranks`` devices (a rank each)."""
    kept = copy.deepcopy(entry)
    if kept.get("devices"):
        kept["devices"] = kept["devices"][:ranks]
    if "count" in kept or not kept.get("devices"):
        kept["count"] = ranks
    return kept


def added_on_shared_devices(recorded: Recorded, plan: Plan, ranks: int | None) -> list[str]:
    """The engines and trainer ranks the prediction adds (not in the recorded
    placement) whose devices another worker uses too: the model gives each engine and
    rank compute of its own, which a shared device does not add (none without a
    placement: the run named no device)."""
    placement = recorded.first.config.get("placement")
    if not isinstance(placement, Mapping) or not placement:
        return []
    predicted = _placement(_thawed(placement), recorded, plan, ranks)
    used = _device_uses(predicted)
    return [
        name
        for name, worker in predicted.items()
        if name not in placement and any(used[d] > 1 for d in worker.get("devices", ()))
    ]


def contended_devices(recorded: Recorded, concurrency_changed: bool) -> list[str]:
    """The devices several recorded workers used (the placement's: the demo's all share
    the host's CPU), when the prediction changes how much of their work runs at once
    (``concurrency_changed``: another lag or buffer, fewer engines or ranks): the
    recorded spans' times hold what sharing cost then, which the model keeps. None
    without a placement."""
    placement = recorded.first.config.get("placement")
    if not concurrency_changed or not isinstance(placement, Mapping):
        return []
    return sorted(d for d, n in _device_uses(_thawed(placement)).items() if n > 1)


def speed_shared_note(devices: list[str]) -> str:
    """The caveat of a speed change on devices several recorded workers shared."""
    return (
        f"the recorded workers shared {', '.join(devices)}: a --speed factor changes those "
        "spans alone, where a real speed-up there changes what the others get too (the "
        "demo's trainer slowed 2x came out 20% off, docs/performance.md)"
    )


def not_predicted(settings: Mapping[str, Any]) -> str | None:
    """Why the prediction of ``settings`` (:attr:`Prediction.settings`) is none (None:
    it is one): an added worker on a device the recorded ones use, or a change of how
    much runs at once on a device they shared (both, when both)."""
    why = []
    if settings["shared"]:
        why.append(
            f"{', '.join(settings['shared'])} would share a device with the recorded "
            "workers (their placement): the model gives each engine and rank a device of "
            "its own, so what it adds there is overstated"
        )
    if settings["contended"]:
        why.append(contended_why(settings["contended"]))
    return "; and ".join(why) or None


def contended_why(devices: list[str]) -> str:
    """Why a prediction with :func:`contended_devices` is none, in the report's words."""
    return (
        f"the recorded workers shared {', '.join(devices)} (their placement), so their "
        "recorded times hold what running at once cost them; this change runs more or "
        "less of their work at once, where the model keeps those times"
    )


def _device_uses(placement: Mapping[str, Any]) -> Counter[str]:
    """How many of the placement's workers use each device."""
    return Counter(d for worker in placement.values() for d in worker.get("devices", ()))


def _device_of(
    placement: dict[str, Any], template: str, name: str, peers: list[str]
) -> dict[str, Any]:
    """Worker ``name``'s entry, ``template``'s with devices of its own (named after the
    worker) when each of ``peers`` had devices no other worker used, else the shared
    ones (the demo's workers all on one host's CPU)."""
    entry: dict[str, Any] = copy.deepcopy(placement[template])
    used = _device_uses(placement)
    own = all(
        placement[p].get("devices") and all(used[d] == 1 for d in placement[p]["devices"])
        for p in peers
    )
    if name != template and own:
        entry["devices"] = [
            d.replace(template, name) if template in d else f"{d}/{name}" for d in entry["devices"]
        ]
    return entry


def _at(event: Event, run_id: str, ns: int, offset: int) -> Event:
    return msgspec.structs.replace(
        event, run_id=run_id, monotonic_ns=ns, wall_ns=max(0, ns + offset)
    )


def predicted_events(
    recorded: Recorded, plan: Plan, timeline: Timeline, changes: dict[str, Any]
) -> Iterator[Event]:
    """The predicted run's log, in order."""
    first = recorded.first
    run_id = first.run_id + SUFFIX
    offset = recorded.wall_offset_ns
    yield msgspec.structs.replace(first, run_id=run_id, config=_config(recorded, plan, changes))
    for event in recorded.setup_events:
        yield msgspec.structs.replace(event, run_id=run_id)
    end = timeline.end_ns
    shift = end - (recorded.finished.monotonic_ns if recorded.finished else end)
    timed: list[tuple[int, int, Event]] = []
    for it, begin in timeline.begins.items():
        timed.append((begin, 0, IterationStarted(run_id, begin, begin + offset, it)))
    for t in recorded.trainer:
        ends = timeline.piece_ends.get(t.iteration, [])
        for before, since, event in t.events:
            after = ends[before - 1] if before else timeline.ready[t.iteration]
            # (after the last piece: as recorded)
            into = (
                _into(t.pieces[before], since, ends[before] - after)
                if before < len(ends)
                else since
            )
            at = after + into
            timed.append((at, 1, _at(event, run_id, at, offset)))
    for event in timeline.published:
        timed.append((event.monotonic_ns, 1, msgspec.structs.replace(event, run_id=run_id)))
    spans = sorted([*recorded.setup_spans, *timeline.spans], key=lambda s: s.end_ns)
    spans += [shifted(s, shift) for s in recorded.teardown_spans]
    timed.sort(key=_order)
    last = yield from _with_batches(timed, spans, run_id, first, offset)
    end = max(end, last)
    finished = recorded.finished
    if finished is None:
        finished = RunFinished(run_id, end, end + offset, status="error", error="no run_finished")
    yield msgspec.structs.replace(
        finished,
        run_id=run_id,
        monotonic_ns=end,
        wall_ns=end + offset,
        terminal_totals={},
        process_wall_ns=None,
    )


def _into(piece: Piece, since: int, stretch: int) -> int:
    """Where an event recorded ``since`` after the end of the piece before ``piece``
    goes, now that ``piece``'s gap and duration take ``stretch``: in the gap (kept as
    recorded), as recorded; in the piece, as far into it as it was."""
    if since <= piece.gap_ns or not piece.duration_ns:
        return since
    duration = stretch - piece.gap_ns
    return piece.gap_ns + (since - piece.gap_ns) * duration // piece.duration_ns


def _order(item: tuple[int, int, Event]) -> tuple[int, int, int]:
    """At one time: an iteration's own events before the next one's start, and an
    iteration's start before its own events."""
    at, kind, event = item
    iteration = getattr(event, "iteration", None)
    return at, iteration if isinstance(iteration, int) else -1, kind


def _with_batches(
    timed: list[tuple[int, int, Event]],
    spans: list[Span],
    run_id: str,
    first: RunStarted,
    offset: int,
) -> Generator[Event, None, int]:
    """``timed`` in order, each ``iteration_started`` preceded by a batch of the spans
    finished by then; the rest in one last batch. Returns the last event's time."""
    k = 0
    last = first.monotonic_ns
    for at, _, event in timed:
        if isinstance(event, IterationStarted):
            done = []
            while k < len(spans) and spans[k].end_ns <= at:
                done.append(spans[k])
                k += 1
            if done:
                yield SpanBatch(run_id, at, at + offset, "main", first.anchor, tuple(done))
        last = max(last, at)
        yield event
    if k < len(spans):
        at = max(last, spans[-1].end_ns)
        yield SpanBatch(run_id, at, at + offset, "main", first.anchor, tuple(spans[k:]))
        last = at
    return last


def write_prediction(
    events: Iterator[Event], out_dir: str | os.PathLike[str], *, force: bool = False
) -> ReplayResult:
    """The predicted run's directory (its log and every output), written by a replay
    with the built-in observers only (a plugin would count a prediction as a run)."""
    return replay(events, Path(out_dir), autoload=False, force=force)
