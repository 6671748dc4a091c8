"""What shipping a worker's observations to the run costs, per span and per iteration.

A worker process records into a :class:`~twinkle.perf.WorkerRecorder` and ships a
:class:`~twinkle.perf.WorkerReport` with its results. Here both ends run in one process
(the transport is Ray's or gloo's, measured by them), and each round is:

1. the worker's ``report()`` (drain and, per iteration, one memory reading);
2. ``to_bytes()``, then ``from_bytes()`` on the other side (the reports' msgpack, with
   every field checked on arrival);
3. the run's ``receive()``: one span batch and one memory event, through every built-in
   observer and the event log (files in a temp dir).

* ``remote.span``: ns per span of a 1,000-span report, against the same spans published
  from a recorder in the run's own process (a ``flush_spans``). The ratio is what
  coming from another process adds.
* ``remote.iteration``: µs and bytes per iteration of the trainer's report in the
  2-rank demo (23 spans with their attributes, one memory reading), against the same
  per-iteration mix published locally.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from bench._harness import Row, best_ns_per_call
from twinkle.perf import WorkerRecorder, WorkerReport
from twinkle.run import RunSession

CONFIG = {
    "phases": {"train": ["train.*", "advantage", "old_logprobs", "ref_logprobs"]},
    "throughput": {"train": {"samples": "train", "devices": 1}},
}
#: The trainer rank's spans per demo iteration: advantage, old and ref log-probs, then
#: per micro-batch a forward and a backward, per step an optimizer step.
ITERATION_SPANS = (
    ["advantage", "old_logprobs", "ref_logprobs"]
    + ["train.forward", "train.backward"] * 8
    + ["train.optimizer_step"] * 4
)
SPAN_TARGET = 3.0  # x a local flush, per span
ITERATION_TARGET_US = 1_000.0  # per iteration


def _record(worker: WorkerRecorder, names: list[str], iteration: int) -> None:
    for micro, name in enumerate(names):
        with worker.span(name, iteration=iteration, micro=micro):
            pass


def _remote_round(
    run: RunSession, worker: WorkerRecorder, names: list[str], memory: bool
) -> Callable[[int], None]:
    counter = [0]

    def ship(n: int) -> None:
        for _ in range(n):
            counter[0] += 1
            _record(worker, names, counter[0])
            data = worker.report(memory=memory).to_bytes()
            run.receive(WorkerReport.from_bytes(data), iteration=None)

    return ship


def _local_round(run: RunSession, names: list[str], memory: bool) -> Callable[[int], None]:
    counter = [0]

    def ship(n: int) -> None:
        for _ in range(n):
            counter[0] += 1
            for micro, name in enumerate(names):
                with run.recorder.span(name, iteration=counter[0], micro=micro):
                    pass
            run.bus.flush_spans()
            if memory:
                run.read_memory(iteration=None)

    return ship


def _measure(names: list[str], memory: bool, rounds: int) -> tuple[float, float, int]:
    """ns per round shipped remotely and locally, and the bytes of one report."""
    with (
        tempfile.TemporaryDirectory(prefix="twinkle-bench-remote-") as tmp,
        RunSession(out_dir=tmp, run_id="r", config=CONFIG, autoload=False) as run,
    ):
        worker = WorkerRecorder("rank1")
        _record(worker, names, 0)
        size = len(worker.report(memory=memory).to_bytes())
        remote = best_ns_per_call(_remote_round(run, worker, names, memory), rounds)
        local = best_ns_per_call(_local_round(run, names, memory), rounds)
    return remote, local, size


def run(smoke: bool) -> list[Row]:
    spans = ["train.forward"] * 1000
    remote, local, size = _measure(spans, memory=False, rounds=2 if smoke else 20)
    per_span, local_span = remote / len(spans), local / len(spans)
    it_remote, it_local, it_size = _measure(
        ITERATION_SPANS, memory=True, rounds=5 if smoke else 200
    )
    return [
        Row(
            "remote.span",
            "a worker's span shipped to the run (report, msgpack both ways, receive)",
            per_span,
            "ns",
            ratio=per_span / local_span,
            baseline=f"a span of the run's own process ({local_span:,.0f} ns)",
            target=f"<= {SPAN_TARGET:g}x",
            met=None if smoke else per_span / local_span <= SPAN_TARGET,
            note=f"1,000-span reports of {size / 1000:,.0f} bytes a span",
        ),
        Row(
            "remote.iteration",
            f"a trainer rank's iteration ({len(ITERATION_SPANS)} spans, 1 memory reading)",
            it_remote / 1e3,
            "us",
            ratio=it_remote / it_local,
            baseline=f"the same published locally ({it_local / 1e3:,.0f} us)",
            target=f"<= {ITERATION_TARGET_US:,.0f} us",
            met=None if smoke else it_remote / 1e3 <= ITERATION_TARGET_US,
            note=f"{it_size:,} bytes per report",
        ),
    ]
