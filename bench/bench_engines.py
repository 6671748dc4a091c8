"""Start-up of 8 engines that each take T to initialise: concurrent pool vs global lock.

The status quo in RL stacks serialises engine start-up on a host under one global lock
around the whole initialisation (to dodge the port race), so 8 engines take 8·T. The
pool starts them concurrently and serialises only the port choice, so they take about
T. Each engine is a real subprocess (the ping engine) that sleeps T, then binds its
reserved ports and reports ready. Both variants run interleaved; best of the repeats.
"""

from __future__ import annotations

import tempfile
import time

from bench._harness import Row
from twinkle.engines import EngineFactory, EnginePool, PortRegistry, StartContext
from twinkle.engines._ping import ping_engine_factory
from twinkle.engines._subprocess import SubprocessEngine
from twinkle.locks import FileLock
from twinkle.perf import TimeRecorder

ENGINES = 8


def _start_all(factory: EngineFactory[SubprocessEngine]) -> float:
    """Seconds until all engines are ready (shutdown not included)."""
    with EnginePool[SubprocessEngine](recorder=TimeRecorder(), start_timeout_s=120) as pool:
        t0 = time.perf_counter()
        pool.start({f"e{i}": factory for i in range(ENGINES)})
        return time.perf_counter() - t0


def run(smoke: bool) -> list[Row]:
    init_s = 0.2 if smoke else 0.5
    repeats = 1 if smoke else 3
    best = {"concurrent": float("inf"), "serialised": float("inf")}
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-engines-") as tmp:
        registry = PortRegistry()  # the host-wide one: other runs on this host coordinate
        concurrent = ping_engine_factory(registry, init_delay_s=init_s)
        global_lock = FileLock("global-engine-init", directory=tmp, timeout_s=None)

        def serialised(ctx: StartContext) -> SubprocessEngine:
            with global_lock:  # the status quo: one lock around each whole initialisation
                return concurrent(ctx)

        for _ in range(repeats):
            best["concurrent"] = min(best["concurrent"], _start_all(concurrent))
            best["serialised"] = min(best["serialised"], _start_all(serialised))
    c, s = best["concurrent"], best["serialised"]
    target = f"< 2·T (T={init_s:g} s)"
    return [
        Row(
            benchmark="engines",
            subject=f"start {ENGINES} engines, concurrent (EnginePool + port registry)",
            value=c * 1e3,
            unit="ms",
            ratio=c / s,
            baseline="global lock around each init",
            target=target,
            met=c < 2 * init_s,
        ),
        Row(
            benchmark="engines",
            subject=f"start {ENGINES} engines, serialised (global lock, status quo)",
            value=s * 1e3,
            unit="ms",
            ratio=s / init_s,
            baseline="T",
            target=f"≈ {ENGINES}·T",
        ),
    ]
