"""The demo's trainer as several ``torch.distributed`` ranks (``twinkle demo
--train-workers N``): DDP over gloo on the CPU, on 127.0.0.1.

Rank 0 is this process, the one holding the run. Ranks 1..N-1 are processes it spawns,
each following rank 0's lead. Every iteration goes like this:

1. rank 0 broadcasts the iteration and its trajectories (msgpack bytes);
2. every rank trains its share of each optimizer step (``GRPOTrainer(data_parallel=True)``),
   and DDP averages the gradients;
3. each rank's spans and memory reading are gathered to rank 0 as a
   :class:`~twinkle.perf.WorkerReport`, on the rank's own clock anchor.

Rank 0 hands both to the run. Its own spans and memory are the run process's.

The group rendezvous through a file (no TCP store to listen), and gloo is pinned to the
loopback interface. The file lives in a directory of rank 0's own under the per-user
runtime directory (:func:`twinkle.locks.process_dir`): a rank 0 killed outright cannot
remove it, and the next one removes it (a dead owner's). The other ranks end when rank 0
does, however it ends: each watches that its parent is still rank 0.

A rank that dies or raises makes rank 0's next collective fail (or time out after
``COLLECTIVE_TIMEOUT``). The loop then gets a :class:`~twinkle.errors.WorkerError`
naming the rank, its pid and its exit code.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import Trajectory
from twinkle.demo.trainer import GRPOTrainer, IterationResult
from twinkle.demo.workers import ReportStash
from twinkle.errors import InvalidArgumentError, TwinkleError, WorkerError
from twinkle.locks import process_dir
from twinkle.perf import MemoryReading, WorkerRecorder, WorkerReport, gather_reports
from twinkle.perf.dist import broadcast_bytes
from twinkle.run import RunSession

__all__ = ["COLLECTIVE_TIMEOUT", "DDPTrainer"]

#: How long a collective waits for a silent rank before it fails.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
#: gloo's interface (Linux's loopback: its pairs listen on 127.0.0.1), unless the
#: environment names one.
_IFNAME = ("GLOO_SOCKET_IFNAME", "lo")
_JOIN_S = 30.0


def _init(rank: int, world: int, rendezvous: str) -> Any:
    import torch.distributed as dist

    os.environ.setdefault(*_IFNAME)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return dist


#: What rank 0 broadcasts: an iteration and its trajectories, or None (the end).
_Message = tuple[int, list[Trajectory]] | None


def _encode(message: _Message) -> bytes:
    return msgspec.msgpack.encode(message)


def _decode(payload: bytes) -> _Message:
    """Rank 0's message, every field checked (msgspec rebuilds the trajectories)."""
    return msgspec.msgpack.decode(payload, type=_Message)


def _end_with_parent(rank0_pid: int, interval_s: float = 0.5) -> None:
    """End this rank as soon as its parent, rank 0 (pid ``rank0_pid``), is gone (killed
    outright, it tells nobody): a daemon thread that watches the parent pid. A rank in
    the middle of a step would otherwise notice only at its next collective (or, waiting
    at the rendezvous, never). Rank 0's pid is given, not read here: one killed before
    this rank got here left it another parent already."""

    def watch() -> None:
        while os.getppid() == rank0_pid:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="twinkle-rank0-watch", daemon=True).start()


def follow(rank: int, world: int, rendezvous: str, config: dict[str, Any], rank0_pid: int) -> None:
    """A rank > 0: train what rank 0 broadcasts, report after each iteration, until rank
    0 broadcasts the end (a spawned process's target; it ends with rank 0, pid
    ``rank0_pid``). Its error, if any, is left in ``<rendezvous>.rank<N>.err`` for rank
    0 to name."""
    _end_with_parent(rank0_pid)
    try:
        import torch

        torch.set_num_threads(1)
        dist = _init(rank, world, rendezvous)
        try:
            worker = WorkerRecorder(f"rank{rank}", rank=rank)
            trainer = GRPOTrainer(DemoConfig(**config), worker.recorder, data_parallel=True)
            while (message := _decode(broadcast_bytes(dist, None, None))) is not None:
                iteration, trajs = message
                trainer.train_iteration(iteration, trajs)
                gather_reports(worker.report())
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        Path(f"{rendezvous}.rank{rank}.err").write_text(
            "".join(traceback.format_exception_only(type(exc), exc)).strip()
        )
        raise


class DDPTrainer:
    """Rank 0 of a data-parallel trainer, as the demo's loop calls a trainer
    (``train_iteration``, ``state``, ``optimizer_steps``); a context manager that spawns
    the other ranks and stops them."""

    def __init__(
        self,
        cfg: DemoConfig,
        run: RunSession,
        on_step: Callable[[int, int, int], object],
        *,
        world: int,
    ) -> None:
        if world < 2:
            raise InvalidArgumentError(
                f"DDPTrainer needs world >= 2 ranks, got {world!r}; one rank is GRPOTrainer"
            )
        self._cfg = cfg
        self._run = run
        self._on_step = on_step
        self.world = world
        # Under the per-user runtime dir, not $TMPDIR: a rank 0 killed outright cannot
        # clean it up, and the next DDPTrainer removes the directories of dead owners.
        self._dir = process_dir("ddp")
        self._rendezvous = str(self._dir / "rendezvous")
        self._followers: list[multiprocessing.process.BaseProcess] = []
        self._dist: Any = None
        self._trainer: GRPOTrainer | None = None
        self._stash = ReportStash(run)  # the other ranks' readings, by iteration

    def __enter__(self) -> DDPTrainer:
        context = multiprocessing.get_context("spawn")  # (no fork of a process with threads)
        config = dataclasses.asdict(self._cfg)
        try:
            with self._run.recorder.span("workers.start", workers=self.world - 1):
                for rank in range(1, self.world):
                    process = context.Process(
                        target=follow,
                        args=(rank, self.world, self._rendezvous, config, os.getpid()),
                        name=f"twinkle-rank{rank}",
                        daemon=True,
                    )
                    process.start()
                    self._followers.append(process)
                self._dist = _init(0, self.world, self._rendezvous)
                self._trainer = GRPOTrainer(
                    self._cfg, self._run.recorder, self._on_step, data_parallel=True
                )
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    @property
    def trainer(self) -> GRPOTrainer:
        """Rank 0's trainer (once entered)."""
        if self._trainer is None:
            raise TwinkleError("DDPTrainer is not started: use it as `with DDPTrainer(...)`")
        return self._trainer

    @property
    def optimizer_steps(self) -> int:
        return 0 if self._trainer is None else self._trainer.optimizer_steps

    @property
    def pids(self) -> dict[str, int | None]:
        return {f"rank{rank}": p.pid for rank, p in enumerate(self._followers, start=1)}

    def state(self) -> Any:
        return self.trainer.state()

    def memory(self, iteration: int) -> list[MemoryReading]:
        """The other ranks' readings of ``iteration`` (rank 0 is the run's process)."""
        return self._stash.pop(iteration)

    def train_iteration(self, iteration: int, trajs: Sequence[Trajectory]) -> IterationResult:
        trainer, dist = self.trainer, self._dist
        try:
            broadcast_bytes(dist, None, _encode((iteration, list(trajs))))
            result = trainer.train_iteration(iteration, trajs)
            own = WorkerReport("rank0", self._run.recorder.anchor)  # (its spans are the run's)
            reports = gather_reports(own)
        except RuntimeError as exc:  # a collective failed: name the rank that went away
            raise self._failure(exc) from exc
        for report in reports[1:]:
            self._stash.receive(report, iteration)
        return result

    def _failure(self, exc: BaseException) -> WorkerError:
        """What rank 0's failed collective means: the first rank that exited (its own
        error when it left one), else the ranks that did not answer."""
        for process in self._followers:
            process.join(timeout=5.0)  # a dead rank's exit code is there at once
        for rank, process in enumerate(self._followers, start=1):
            if process.exitcode is None:
                continue
            err = Path(f"{self._rendezvous}.rank{rank}.err")
            raised = f" after it raised {err.read_text()}" if err.exists() else ""
            return WorkerError(
                f"worker 'rank{rank}' (torch.distributed rank {rank}, pid {process.pid}) "
                f"died with exit code {process.exitcode}{raised}; rank 0's collective "
                f"failed: {exc}"
            )
        alive = ", ".join(f"'rank{r}'" for r in range(1, self.world))
        return WorkerError(
            f"rank 0's collective failed while workers {alive} still run (a hung or "
            f"unreachable rank: gloo waits {COLLECTIVE_TIMEOUT.total_seconds():.0f} s): {exc}"
        )

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._dist is not None and exc_info[0] is None:
                try:
                    broadcast_bytes(self._dist, None, _encode(None))  # the end
                except RuntimeError as exc:
                    raise self._failure(exc) from exc
        finally:
            with self._run.recorder.span("workers.stop", workers=len(self._followers)):
                for process in self._followers:
                    process.join(timeout=_JOIN_S if exc_info[0] is None else 1.0)
                    if process.is_alive():
                        process.kill()
                        process.join(timeout=5.0)
                if self._dist is not None:
                    self._dist.destroy_process_group()
                    self._dist = None
            shutil.rmtree(self._dir, ignore_errors=True)
