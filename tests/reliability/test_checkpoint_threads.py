"""Checkpoints of a run whose events come from several threads at once, dispatched on
the observers' own thread (the default): killed outright at any point, its restart
from the newest checkpoint writes what a restart from the whole log writes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reliability._scripted import CONFIG, killed_when_ready, segment
from reliability.test_checkpoint import HOUR, assert_resumes_agree


def _busy_segment(out: Path, every: int, ready_at: int) -> None:
    """A process runs (or resumes) run ``r`` in ``out`` with three threads publishing
    beside its loop (spans, samples, scalars, memory readings), a checkpoint every
    ``every`` events, and is killed outright ``ready_at`` iterations in (once it has a
    checkpoint: a busy host may lag). Its loop takes an optimizer step right after each
    boundary: the order moves on while the dispatch thread takes the boundary's
    checkpoint."""
    script = textwrap.dedent(
        f"""
        import sys
        import threading
        import time
        sys.path[:0] = {[str(p) for p in Path(__file__).resolve().parents[:2]]!r}
        import twinkle.run._checkpointing
        from twinkle.run import RunSession
        twinkle.run._checkpointing.CHECKPOINT_EVERY = {every}
        with RunSession(out_dir={str(out)!r}, run_id="r", config={CONFIG!r},
                        autoload=False, resume=True) as run:
            first = run.resumed.next_iteration if run.resumed else 0
            steps = run.resumed.optimizer_steps if run.resumed else 0
            current = [first]
            stop = threading.Event()

            def engine(name):
                while not stop.is_set():
                    it = current[0]
                    with run.recorder.span("generate", iteration=it, engine=name):
                        time.sleep(0.0005)
                    run.bus.samples(iteration=it, phase="rollout", lengths=[5, 7], groups=1)

            def watcher():
                while not stop.is_set():
                    run.bus.scalars(iteration=current[0], name="watch", values={{"x": 1.0}})
                    run.read_memory(iteration=current[0])
                    time.sleep(0.001)

            threads = [threading.Thread(target=engine, args=(f"engine{{k}}",)) for k in (0, 1)]
            threads.append(threading.Thread(target=watcher))
            for t in threads:
                t.start()
            for i in range(first, first + 100000):
                current[0] = i
                run.bus.iteration_started(i)
                steps += 1  # (right after the boundary: the dispatch thread is on it)
                run.bus.optimizer_step(iteration=i, step=steps, samples=1)
                with run.recorder.span("train.step", iteration=i):
                    time.sleep(0.002)
                run.bus.samples(iteration=i, phase="train", lengths=[5], groups=1)
                if i == first + {ready_at}:  # (once a checkpoint is there: a busy host)
                    deadline = time.monotonic() + 60
                    checkpoint = run.out_dir / "checkpoint.bin"
                    while not checkpoint.exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    print("ready", flush=True)
        """
    )
    killed_when_ready(script)


@pytest.mark.parametrize(("every", "ready_at"), [(25, 3), (7, 12), (60, 30)])
def test_a_busy_run_killed_outright_resumes_from_its_checkpoint_as_from_its_log(
    tmp_path: Path, every: int, ready_at: int
) -> None:
    _busy_segment(tmp_path / "with", every=every, ready_at=ready_at)
    assert_resumes_agree(tmp_path, lambda out: segment(out, iterations=2, wall_offset_ns=HOUR))
