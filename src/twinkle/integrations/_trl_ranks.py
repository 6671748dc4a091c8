"""A TRL run on several ranks (``torchrun``, ``accelerate launch``) observed as one
twinkle run (docs/scale-out.md, "TRL on several ranks").

Rank 0 holds the run. Every rank's :class:`~twinkle.integrations._trl_run.ObservedRun`
publishes through a :class:`RankBus`: rank 0's passes everything to the run's bus but
its samples, which it holds; another rank's holds its samples and drops the rest (its
spans go to a :class:`~twinkle.perf.WorkerRecorder`). At each step's end, which every
rank reaches at the same optimizer step, :meth:`RankLink.exchange` gathers each rank's
held samples and (but rank 0's) its :class:`~twinkle.perf.WorkerReport` to rank 0 in
one collective, over a gloo group of the run's own (on the CPU: apart from the
training's collectives and their device); rank 0 receives the reports and publishes
the step's samples of all ranks, one event per iteration and phase (the ranks' lengths
in rank order).

A rank that died makes the collective fail on the others: rank 0 then names the ranks
of its host whose processes are gone (their pids were exchanged when the ranks joined),
in the run's error.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import psutil

from twinkle.errors import TwinkleError, WorkerError
from twinkle.perf import WorkerReport
from twinkle.perf.dist import all_gather_json, gather_bytes, initialised_dist

__all__ = [
    "DEAD_WAIT_S",
    "GATHER_WAIT",
    "JOIN_TIMEOUT",
    "RankBus",
    "RankLink",
    "check_alone",
    "lone_rank",
    "merged_samples",
    "publish_merged",
    "sigterm_held",
    "whole_groups",
]

log = logging.getLogger("twinkle.integrations.trl")

#: how long the ranks' ``train()`` starts may lie apart (each makes the run's group)
JOIN_TIMEOUT = datetime.timedelta(minutes=10)
#: how long a failed collective looks for the peers that died
DEAD_WAIT_S = 1.0
#: the wait a rank's ``accelerator.gather`` is timed as: the ranks meet in it (TRL's
#: completions' lengths at the end of each generation), the first waiting for the last
#: (docs/metrics.md, "Stragglers": not its own work)
GATHER_WAIT = "wait.gather"


class RankBus:
    """What an observed ``train()`` publishes through on one rank of several: ``bus``
    (rank 0's run) for everything but the samples, which are held for the step's
    exchange; without a bus (another rank), the samples only."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus
        self.held: list[dict[str, Any]] = []

    def own_work(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self._bus is None else self._bus.own_work(name)

    def samples(self, **sample: Any) -> None:
        self.held.append(sample)

    def take(self) -> list[dict[str, Any]]:
        """The samples held since the last exchange (as lists: the exchange's JSON)."""
        held, self.held = self.held, []
        return [{k: list(v) if k.endswith("lengths") else v for k, v in s.items()} for s in held]

    def iteration_started(self, iteration: int) -> None:
        if self._bus is not None:
            self._bus.iteration_started(iteration)

    def optimizer_step(self, **step: Any) -> None:
        if self._bus is not None:
            self._bus.optimizer_step(**step)

    def scalars(self, **scalars: Any) -> None:
        if self._bus is not None:
            self._bus.scalars(**scalars)


class RankLink:
    """This rank's part in the run's collectives: a process group of its own over gloo
    (on the CPU, apart from the training's collectives and their device), made when
    ``train()`` begins; every rank must make it, within :data:`JOIN_TIMEOUT`."""

    def __init__(self, rank: int, world: int) -> None:
        dist = initialised_dist()
        if dist is None or dist.get_world_size() != world:
            raise TwinkleError(
                f"TwinkleCallback on rank {rank} of {world}: torch.distributed has "
                f"{'no process group' if dist is None else f'{dist.get_world_size()} ranks'}"
                f"; launch the training with torchrun or accelerate launch (which set one "
                "up for the Trainer), or train on one process"
            )
        try:
            self.group = dist.new_group(backend="gloo", timeout=JOIN_TIMEOUT)
        except Exception as exc:  # (a rank that never makes it: its ranks time out)
            raise TwinkleError(
                f"TwinkleCallback on rank {rank} of {world} could not join the other ranks "
                f"within {JOIN_TIMEOUT.total_seconds():g} s ({type(exc).__name__}: "
                f"{str(exc)[:200]}): give every rank the same TwinkleCallback (not rank 0's "
                "alone), or train on one process"
            ) from exc
        self.dist = dist
        self.rank = rank
        #: per rank: (pid, host), from :meth:`join`
        self.processes: list[tuple[int, str]] = []

    def close(self) -> None:
        """Destroy the run's group (once: each ``train()`` makes its own)."""
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(Exception):  # (a group a dead peer broke)
                self.dist.destroy_process_group(group)

    def join(self, opening: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``opening`` (rank 0's: how the run began, or why it could not),
        with its process; a collective every rank makes once, at ``train()``'s start."""
        mine = {**opening, "pid": os.getpid(), "host": socket.gethostname()}
        with self._naming_the_dead():
            every = all_gather_json(self.dist, self.group, mine)
        self.processes = [(int(o["pid"]), str(o["host"])) for o in every]
        return every

    def exchange(
        self, samples: list[dict[str, Any]], report: WorkerReport | None
    ) -> list[tuple[list[dict[str, Any]], WorkerReport | None]] | None:
        """Every rank's held samples and report, in rank order, on rank 0 (None on the
        others); a collective."""
        payload = msgspec.msgpack.encode(
            {"samples": samples, "report": None if report is None else report.to_bytes()}
        )
        with self._naming_the_dead():
            parts = gather_bytes(self.dist, self.group, payload)
        if parts is None:
            return None
        out = []
        for part in parts:
            data = msgspec.msgpack.decode(part)
            sent = data["report"]
            out.append((data["samples"], None if sent is None else WorkerReport.from_bytes(sent)))
        return out

    @contextlib.contextmanager
    def _naming_the_dead(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            with sigterm_held(True):  # (the launcher's SIGTERM: not while looking)
                dead = self.dead()
            if not dead:
                raise
            raise WorkerError(
                f"{', '.join(dead)} died: the collective of rank {self.rank} failed "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc

    def dead(self, wait_s: float = DEAD_WAIT_S) -> list[str]:
        """The other ranks of this host whose processes are gone (exited, killed: a
        zombie its launcher has not reaped yet counts), looked for up to ``wait_s``:
        a peer's sockets close a moment before its process is seen to end."""
        here = socket.gethostname()
        peers = [
            (rank, pid, host)
            for rank, (pid, host) in enumerate(self.processes)
            if rank != self.rank and host == here
        ]
        deadline = time.monotonic() + wait_s
        while True:
            dead = [f"rank {r} (pid {pid} on {host})" for r, pid, host in peers if _gone(pid)]
            if dead or not peers or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)


def lone_rank(world_size: int) -> str | None:
    """Why this process is observed alone although ``torch.distributed`` holds several
    ranks: its trainer's ``args.world_size`` is ``world_size`` 1 (transformers did not
    run it distributed, as on CPU ranks without ``use_cpu``); None when it is not so."""
    dist = initialised_dist()
    if world_size != 1 or dist is None or dist.get_world_size() <= 1:
        return None
    return (
        f"this process is rank {dist.get_rank()} of a torch.distributed group of "
        f"{dist.get_world_size()}, but its trainer trains alone (args.world_size is 1: "
        "transformers does not run it distributed), so each rank is a run of its own; "
        "on CPU ranks pass use_cpu=True and ddp_backend='gloo' to the training arguments "
        "(ms-swift: --use_cpu true --ddp_backend gloo)"
    )


def check_alone(world_size: int, run_id: str | None) -> None:
    """Say so when this process is observed alone although ``torch.distributed`` holds
    several ranks (:func:`lone_rank`): refused when ``run_id`` names the run (every
    rank would write it: they would race for its directory), else warned of."""
    alone = lone_rank(world_size)
    if alone is not None and run_id is not None:
        raise TwinkleError(f"{alone}; they would all write run {run_id!r}")
    if alone is not None:
        log.warning("twinkle: %s", alone)


@contextlib.contextmanager
def sigterm_held(hold: bool) -> Iterator[None]:
    """SIGTERM ignored (``hold``) while rank 0 looks into a failure of several ranks'
    training and finishes its run: the launcher (torchrun) sends it to the ranks left
    when one ends, and would kill this one half-way through writing the run's summary
    and trace (it sends SIGKILL after its grace period). Only in the main thread, where
    handlers can be set; a handler not set from Python comes back as the default."""
    if not hold or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped has)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:  # (another user's: alive)
        return False


def merged_samples(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The ranks' held samples (in rank order) as one ``bus.samples`` call per iteration
    and phase, in the order they first appear: the lengths of every rank, and their
    prompt lengths when every rank gave them. A sample's ``per_group`` (the completions
    of one prompt, which a group may spread over ranks) makes the groups the merged
    lengths' count over it, when it divides them (else 0)."""
    merged: dict[tuple[int, str], dict[str, Any]] = {}
    for samples in parts:
        for sample in samples:
            key = (sample["iteration"], sample["phase"])
            prompts = list(sample.get("prompt_lengths") or ())
            into = merged.setdefault(
                key,
                {
                    "iteration": sample["iteration"],
                    "phase": sample["phase"],
                    "lengths": [],
                    "prompt_lengths": [],
                    "per_group": sample.get("per_group", 0),
                },
            )
            if into["prompt_lengths"] is not None and (prompts or not sample["lengths"]):
                into["prompt_lengths"].extend(prompts)
            else:
                into["prompt_lengths"] = None
            into["lengths"].extend(sample["lengths"])
    out = []
    for m in merged.values():
        m["groups"] = whole_groups(len(m["lengths"]), m.pop("per_group"))
        m["prompt_lengths"] = m["prompt_lengths"] or ()
        out.append(m)
    return out


def publish_merged(bus: Any, parts: list[list[dict[str, Any]]], iteration: int | None) -> int:
    """The ranks' held samples (:func:`merged_samples`) published on rank 0's run's
    ``bus``; their training samples of ``iteration``."""
    trained = 0
    for sample in merged_samples(parts):
        bus.samples(**sample)
        if sample["phase"] == "train" and sample["iteration"] == iteration:
            trained += len(sample["lengths"])
    return trained


def whole_groups(completions: int, per_group: int) -> int:
    """The groups ``completions`` make of ``per_group`` each (a prompt's completions),
    when they make whole ones; else 0 (not grouped, or not known)."""
    return completions // per_group if per_group and completions % per_group == 0 else 0
