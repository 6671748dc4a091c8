"""A fork server for the crash tests: imports twinkle once, then forks writers on demand.

Started as a script; reads one JSON command per line on stdin:

* ``{"op": "spawn", "mode": ..., "path": ..., "life": n}`` forks a writer and answers
  ``{"pid": ...}``. The writer writes until it is killed (or a safety limit);
* ``{"op": "reap", "pid": ...}`` waits for that writer and answers ``{"status": ...}``.

Forking from one warm process makes a kill point cost milliseconds instead of a fresh
interpreter. The server has no threads, so forking it is safe; writers may start theirs.

Writer modes:

* ``writer``: :class:`JsonlWriter` batches of 1-16 lines of up to 512 KiB (one
  ``os.write`` each, so a kill lands inside a write and tears a line);
* ``reporter`` / ``reporter-bg``: a :class:`MetricsReporter` (sync / background writer
  thread) with a :class:`JsonlBackend`;
* ``session``: a :class:`RunSession` running iterations of spans, samples, steps and
  scalars forever, writing ``events.jsonl`` and the records.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from twinkle.reporting import JsonlBackend, JsonlWriter, MetricsReporter, make_record
from twinkle.run import RunSession

RUN = "crash"
PAD = "x" * 120
LIMIT_S = 60.0  # a writer nobody kills stops by itself

CONFIG = {
    "phases": {"rollout": ["generate"], "train": ["train.*"]},
    "throughput": {
        "rollout": {"samples": "rollout", "devices": 1},
        "train": {"samples": "train", "devices": 1},
    },
    "window": {"samples": "rollout", "devices": 1},
    "total_steps": 1_000_000,
}


def _alive(start: float, parent: int) -> bool:
    return time.monotonic() - start < LIMIT_S and os.getppid() == parent


def write_lines(path: str, life: int, parent: int) -> None:
    # Big lines make the process spend its time inside write(): a SIGKILL then stops a
    # write part-way (the kernel returns after whole pages), which tears a line.
    rng = random.Random(life)
    pads = ["x" * (1 << k) for k in range(8, 20)]
    start = time.monotonic()
    i = 0
    with JsonlWriter(path) as w:
        while _alive(start, parent):
            n = rng.randint(1, 16)
            w.write({"life": life, "i": i + k, "pad": rng.choice(pads)} for k in range(n))
            i += n


def report_records(path: str, life: int, parent: int, background: bool) -> None:
    start = time.monotonic()
    reporter = MetricsReporter([JsonlBackend(path)], run_id=RUN, background=background)
    i = 0
    while _alive(start, parent):
        for _ in range(1000):
            reporter.report(
                make_record(
                    kind="train",
                    scope="iteration",
                    run_id=RUN,
                    step=i,
                    iteration=i,
                    wall_ns=1_700_000_000_000_000_000 + i,
                    monotonic_ns=i,
                    values={"i": i, "loss": 0.5},
                    attrs={"life": life, "pad": PAD},
                )
            )
            i += 1
    reporter.close()


def run_session(out_dir: str, life: int, parent: int) -> None:
    start = time.monotonic()
    with RunSession(out_dir=out_dir, run_id=f"crash-{life}", config=CONFIG, autoload=False) as run:
        rec, bus = run.recorder, run.bus
        i = 0
        while _alive(start, parent):
            bus.iteration_started(i)
            for k in range(20):
                with rec.span("generate", iteration=i, k=k):
                    pass
                with rec.span("train.micro", micro=k):
                    pass
            bus.samples(iteration=i, phase="rollout", lengths=[5 + i % 7, 9], groups=1)
            bus.samples(iteration=i, phase="train", lengths=[5 + i % 7, 9])
            bus.optimizer_step(iteration=i, step=i + 1, samples=2)
            bus.scalars(iteration=i, name="grpo", values={"loss": 1.0 / (i + 1)})
            i += 1


def child(cmd: dict[str, Any], parent: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    mode, path, life = cmd["mode"], cmd["path"], cmd["life"]
    if mode == "writer":
        write_lines(path, life, parent)
    elif mode in ("reporter", "reporter-bg"):
        report_records(path, life, parent, background=mode == "reporter-bg")
    elif mode == "session":
        run_session(path, life, parent)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "spawn":
            Path(cmd["path"]).parent.mkdir(parents=True, exist_ok=True)
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    child(cmd, parent)
                except BaseException:
                    code = 1
                os._exit(code)
            out.write(json.dumps({"pid": pid}) + "\n")
        elif cmd["op"] == "reap":
            _, status = os.waitpid(cmd["pid"], 0)
            out.write(json.dumps({"status": status}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
