"""What the predicted run's workers do: the recorded run's work under :class:`Changes`
(docs/metrics.md, "What if: predicting another configuration").

* **Speed**: ``speed[key] = k`` makes the work of a phase (``key`` a phase name) or of a
  worker (an engine's name, or ``trainer``) ``k`` times as fast: its pieces take their
  recorded time over ``k``. The gaps between pieces (host work no phase names) are kept.
* **Engines**: with the recorded number, each engine makes its recorded items. With
  another number ``E'``, the iteration's work is shared equally: each engine generates
  ``T / E'`` of the iteration's ``T`` recorded generation tokens, in the time its line
  (:mod:`twinkle.whatif._fit`) gives, times its template's pace on the iteration (that
  recorded engine's time over what its line gives: :func:`_paces`); an item's other
  pieces (a reward, say) scale with its share of tokens. Each new engine keeps a
  recorded engine's gaps and load times.
* **Trainer ranks**: the training phase's pieces take ``R / R'`` of their time
  (data-parallel work split evenly; the all-reduce's cost is assumed not to grow).
* **Lag, buffer**: taken as given, else as recorded; the buffer grows with the engines
  (``buffer * E' / E``) unless given.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from twinkle.checks import is_integer
from twinkle.demo.config import MAX_LAG
from twinkle.errors import InvalidArgumentError
from twinkle.whatif._fit import Fit, fit_engines, generated_tokens
from twinkle.whatif._recorded import EngineRecord, Piece, Recorded
from twinkle.whatif._schedule import EnginePlan, Plan

__all__ = ["Changes", "plan_for"]

#: the trainer's worker name, for a speed factor
TRAINER = "trainer"


#: the most engines or trainer ranks a prediction re-simulates (its time grows with
#: them: ~50 s at 2,000 engines), and the largest buffer
MAX_WORKERS = 1024
MAX_BUFFER = 65_536
#: the largest speed factor, and its inverse the smallest (times scaled past them
#: leave what the recorded run can say)
MAX_SPEED = 1000.0


@dataclass(frozen=True, slots=True)
class Changes:
    """What to change: None keeps the recorded value."""

    engines: int | None = None
    ranks: int | None = None
    lag: int | None = None
    buffer: int | None = None
    speed: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, most in (
            ("engines", MAX_WORKERS),
            ("ranks", MAX_WORKERS),
            ("buffer", MAX_BUFFER),
        ):
            value = getattr(self, name)
            if value is not None and (not is_integer(value) or not 1 <= value <= most):
                raise InvalidArgumentError(
                    f"--{name} must be an integer in [1, {most}], got {value!r} (the "
                    "re-simulation's time grows with it)"
                )
        if self.lag is not None and (not is_integer(self.lag) or not 0 <= self.lag <= MAX_LAG):
            raise InvalidArgumentError(
                f"--lag must be an integer in [0, {MAX_LAG}], got {self.lag!r}"
            )
        for key, k in self.speed.items():
            if (
                not isinstance(k, int | float)
                or isinstance(k, bool)
                or not math.isfinite(k)
                or not 1 / MAX_SPEED <= k <= MAX_SPEED
            ):
                raise InvalidArgumentError(
                    f"--speed {key}=...: the factor must be a number in [{1 / MAX_SPEED:g}, "
                    f"{MAX_SPEED:g}] (2: twice as fast, 0.5: twice as slow), got {k!r}"
                )
        object.__setattr__(self, "speed", MappingProxyType(dict(self.speed)))  # (read-only)

    @property
    def none(self) -> bool:
        """Whether nothing changes (the recorded configuration)."""
        return (self.engines, self.ranks, self.lag, self.buffer) == (None,) * 4 and not any(
            k != 1 for k in self.speed.values()
        )


def _factor(speed: Mapping[str, float], phase: str | None, worker: str) -> float:
    return speed.get(phase or "", 1.0) * speed.get(worker, 1.0)


def _scaled(
    pieces: tuple[Piece, ...], speed: Mapping[str, float], worker: str
) -> tuple[Piece, ...]:
    """``pieces`` of ``worker``, each taking its time over its speed factor."""
    return tuple(
        replace(p, duration_ns=round(p.duration_ns / _factor(speed, p.phase, worker)))
        for p in pieces
    )


def _shared_piece(  # noqa: PLR0917 - a piece and how it is shared, each used once
    p: Piece, share: float, generation: str, fit: Fit, name: str, pace: float
) -> Piece:
    """A piece of an engine's item holding ``share`` of the recorded item's tokens: a
    generation span's time from the fit (its ``tokens`` the share) times the
    iteration's ``pace``, any other's scaled by the share; on engine ``name``."""
    tokens = generated_tokens(p, generation)
    if tokens is None:
        return replace(
            p, duration_ns=round(p.duration_ns * share), attrs={**p.attrs, "engine": name}
        )
    new = tokens * share
    attrs = {**p.attrs, "engine": name, "tokens": round(new)}
    return replace(p, duration_ns=round(fit.ns(new) * pace), attrs=attrs)


def _paces(
    recs: list[EngineRecord], fits: Mapping[str, Fit], generation: str
) -> dict[tuple[str, int], float]:
    """Per recorded engine and iteration, its pace: the engine's recorded generation time
    on the iteration over what its line gives for the same spans' tokens. An engine
    made after it (its template) keeps it: a slow iteration (the machine busy, long
    prompts) stays slow, and the engines' spread within an iteration stays theirs; the
    lines alone would spread the run's time evenly over its iterations and engines."""
    times: dict[tuple[str, int], list[float]] = {}
    for rec in recs:
        fit = fits.get(rec.name)
        for it, pieces in rec.items.items():
            for p in pieces:
                tokens = generated_tokens(p, generation)
                if fit is not None and tokens is not None:
                    pair = times.setdefault((rec.name, it), [0.0, 0.0])
                    pair[0] += p.duration_ns
                    pair[1] += fit.ns(tokens)
    return {key: took / fitted for key, (took, fitted) in times.items() if fitted > 0}


def _engine_plans(recorded: Recorded, changes: Changes) -> tuple[EnginePlan, ...]:
    recs = list(recorded.engines.values())
    count = changes.engines or len(recs)
    speed, generation = changes.speed, recorded.generation
    if count == len(recs):
        return tuple(_same_engine(rec, speed, recorded) for rec in recs)
    fitted = fit_engines(recs, generation)
    if fitted is None:
        raise InvalidArgumentError(
            f"{recorded.path}: no generation span carries a 'tokens' attribute: twinkle "
            "whatif cannot share an iteration's work among another number of engines"
        )
    fits, typical = fitted
    paces = _paces(recs, fits, generation)
    totals: dict[int, int] = {}
    for rec in recs:
        for it, tokens in rec.tokens.items():
            totals[it] = totals.get(it, 0) + tokens
    threads = itertools.count(max(r.thread for r in recs) + 1)
    names = _names(recorded.engines, count)
    plans = []
    for k, name in enumerate(names):
        template = recs[k % len(recs)]
        fit = fits.get(name, typical)
        plans.append(
            _shared_engine(template, name, fit, (totals, paces), count, changes, recorded, threads)
        )
    return tuple(plans)


def _names(recorded: Mapping[str, EngineRecord], count: int) -> list[str]:
    """``count`` engine names: the recorded ones first, then ``engine<k>`` (a name no
    recorded engine has)."""
    names = list(recorded)[:count]
    k = 0
    while len(names) < count:
        if f"engine{k}" not in recorded and f"engine{k}" not in names:
            names.append(f"engine{k}")
        k += 1
    return names


def _same_engine(rec: EngineRecord, speed: Mapping[str, float], recorded: Recorded) -> EnginePlan:
    publish = recorded.config.publish
    load_k = 1 / _factor(speed, publish, rec.name)
    return EnginePlan(
        name=rec.name,
        pid=rec.pid,
        thread=rec.thread,
        load_thread=rec.thread + 1_000_000,
        start_ns=rec.start_ns,
        item_gap_ns=rec.item_gap_ns,
        load_gap_ns=rec.load_gap_ns,
        items=lambda it: _scaled(rec.items[it], speed, rec.name),
        load_ns=lambda v: round(rec.load_ns(v) * load_k),
    )


def _shared_engine(  # noqa: PLR0917 - one engine's inputs, each used once
    template: EngineRecord,
    name: str,
    fit: Fit,
    shares: tuple[Mapping[int, int], Mapping[tuple[str, int], float]],
    count: int,
    changes: Changes,
    recorded: Recorded,
    threads: Any,
) -> EnginePlan:
    generation, speed = recorded.generation, changes.speed
    thread = template.thread if name == template.name else next(threads)
    totals, paces = shares  # (per iteration its generation tokens; per engine, its pace)

    def items(it: int) -> tuple[Piece, ...]:
        pieces = template.items.get(it) or template.items[max(template.items)]
        tokens = totals.get(it, 0) / count
        share = tokens / template.tokens[it] if template.tokens.get(it) else 1 / count
        pace = paces.get((template.name, it), 1.0)
        shared = tuple(_shared_piece(p, share, generation, fit, name, pace) for p in pieces)
        return _scaled(shared, speed, name)

    load_k = 1 / _factor(speed, recorded.config.publish, name)
    return EnginePlan(
        name=name,
        pid=template.pid,
        thread=thread,
        load_thread=thread + 1_000_000,
        start_ns=template.start_ns,
        item_gap_ns=template.item_gap_ns,
        load_gap_ns=template.load_gap_ns,
        items=items,
        load_ns=lambda v: round(template.load_ns(v) * load_k),
    )


def trainer_workers(recorded: Recorded) -> list[str]:
    """The workers of ``config.placement`` that ran the training phase (engines not)."""
    return [
        name
        for name, entry in recorded.config.placement.items()
        if name not in recorded.engines and recorded.training in entry.phases
    ]


def recorded_ranks(recorded: Recorded) -> int:
    """The number of trainer ranks: a rank per device of :func:`trainer_workers` (a
    worker placed with ``count`` 2 is two data-parallel ranks), at least 1."""
    placement = recorded.config.placement
    return max(1, sum(placement[name].count for name in trainer_workers(recorded)))


def check_speed(recorded: Recorded, changes: Changes, engines: list[str]) -> None:
    """Each ``--speed`` name is a phase, an engine of the prediction or ``trainer``."""
    known = [*recorded.config.phases, *engines, TRAINER]
    unknown = [name for name in changes.speed if name not in known]
    ranks = trainer_workers(recorded)
    if unknown and unknown[0] in ranks:
        raise InvalidArgumentError(
            f"--speed {unknown[0]}=...: {unknown[0]!r} is one of the trainer's ranks "
            f"({', '.join(ranks)}), which the model runs as one trainer, in step: one "
            f"rank's speed is no change it can make; name {TRAINER!r} (every rank) or the "
            f"training phase {recorded.training!r}"
        )
    if unknown:
        raise InvalidArgumentError(
            f"--speed {unknown[0]}=...: {unknown[0]!r} is no phase or worker of the run; "
            f"name one of {', '.join(known)}"
        )


def check_devices(recorded: Recorded, changes: Changes) -> None:
    """Another number of engines or ranks changes the devices: ``config.placement``
    must name each recorded engine, and the trainer's workers, to count them."""
    placement = recorded.config.placement
    unnamed = [name for name in recorded.engines if name not in placement]
    if changes.engines not in (None, len(recorded.engines)) and unnamed:
        raise InvalidArgumentError(
            f"--engines {changes.engines}: {recorded.path}'s config.placement does not name "
            f"engine(s) {', '.join(unnamed)} (a generation span's 'engine'), so their devices "
            "cannot be counted again; record a run whose placement lists each engine"
        )
    if changes.ranks is not None and not trainer_workers(recorded):
        raise InvalidArgumentError(
            f"--ranks {changes.ranks}: {recorded.path}'s config.placement names no worker of "
            f"the training phase {recorded.training!r}, so its devices cannot be counted "
            "again; record a run whose placement lists the trainer's ranks"
        )


def plan_for(recorded: Recorded, changes: Changes) -> Plan:
    """The simulation's plan: the recorded run under ``changes`` (checked first)."""
    check_devices(recorded, changes)
    check_speed(
        recorded, changes, _names(recorded.engines, changes.engines or len(recorded.engines))
    )
    engines = _engine_plans(recorded, changes)
    lag = recorded.lag if changes.lag is None else changes.lag
    buffer = changes.buffer
    if buffer is None and recorded.buffer_size is not None:
        buffer = max(1, round(recorded.buffer_size * len(engines) / len(recorded.engines)))
    ranks_k = recorded_ranks(recorded) / (changes.ranks or recorded_ranks(recorded))
    by_it = {t.iteration: t for t in recorded.trainer}
    training = recorded.training
    speed = changes.speed

    def trainer(it: int) -> tuple[Piece, ...]:
        pieces = by_it[it].pieces
        return tuple(
            replace(
                p,
                duration_ns=round(
                    p.duration_ns
                    * (ranks_k if p.phase == training else 1.0)
                    / _factor(speed, p.phase, TRAINER)
                ),
            )
            for p in pieces
        )

    return Plan(
        iterations=tuple(by_it),
        lag=lag,
        buffer=buffer,
        engines=engines,
        trainer=trainer,
        trainer_pid=recorded.trainer_pid,
        trainer_thread=recorded.trainer_thread,
        handoff_ns=recorded.handoff_ns,
        engine_wait=recorded.engine_wait,
        trainer_wait=recorded.trainer_wait,
        load_name=recorded.load_name,
    )
