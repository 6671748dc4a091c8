"""twinkle.demo.vllm without vLLM: the rollout engine against a stand-in server on
127.0.0.1 (its counters, gauges, completions and abort), and the rig's clean-up paths."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import twinkle.demo.vllm as demo_vllm
from _vllm_stand_in import Reply, StandIn
from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutBatch, Trajectory, seed_for
from twinkle.demo.task import EOS, max_response_tokens, reward
from twinkle.demo.vllm import (
    ENGINE_COUNTERS,
    ENGINE_GAUGES,
    VllmRolloutEngine,
    _GaugePeaks,
    vllm_rig,
)
from twinkle.engines import VllmClient, VllmHttpError
from twinkle.errors import InvalidArgumentError
from twinkle.perf import TimeRecorder

ENGINE = "vllm-0"
CFG = DemoConfig(
    engine="vllm", prompts_per_iteration=2, completions_per_prompt=2, engines=1, seed=7
)
# Counters at the start, and what one /v1/completions request adds: values exact in
# binary, so the differences are exact.
START = {
    "vllm:prompt_tokens_total": 100.0,
    "vllm:generation_tokens_total": 40.0,
    "vllm:request_success_total": 3.0,
    "vllm:request_queue_time_seconds_sum": 0.5,
    "vllm:request_prefill_time_seconds_sum": 1.25,
    "vllm:request_decode_time_seconds_sum": 2.0,
    "vllm:request_inference_time_seconds_sum": 3.25,
    "vllm:prefix_cache_queries_total": 80.0,
    "vllm:prefix_cache_hits_total": 16.0,
}
STEP = {
    "vllm:prompt_tokens_total": 10.0,
    "vllm:generation_tokens_total": 6.0,
    "vllm:request_success_total": 2.0,
    "vllm:request_queue_time_seconds_sum": 0.125,
    "vllm:request_prefill_time_seconds_sum": 0.25,
    "vllm:request_decode_time_seconds_sum": 0.75,
    "vllm:request_inference_time_seconds_sum": 1.0,
    "vllm:prefix_cache_queries_total": 10.0,
    "vllm:prefix_cache_hits_total": 5.0,
}
GAUGES = {
    "vllm:kv_cache_usage_perc": 0.375,
    "vllm:num_requests_running": 2.0,
    "vllm:num_requests_waiting": 1.0,
}
LABELS = '{engine="0",model_name="tiny"}'


def metrics_text(values: dict[str, float]) -> str:
    """Prometheus text as vLLM serves it: counters, histograms (buckets, count, sum) and
    gauges with their HELP/TYPE lines, plus a family the engine does not read. A sample
    missing from ``values`` is left out."""
    lines = [
        "# HELP process_cpu_seconds_total Total user and system CPU time.",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 12.5",
    ]
    for sample, value in values.items():
        if sample.endswith("_sum"):
            family = sample.removesuffix("_sum")
            lines += [
                f"# HELP {family} Histogram of seconds.",
                f"# TYPE {family} histogram",
                f'{family}_bucket{{engine="0",le="0.5",model_name="tiny"}} 1.0',
                f'{family}_bucket{{engine="0",le="+Inf",model_name="tiny"}} 2.0',
                f"{family}_count{LABELS} 2.0",
                f"{sample}{LABELS} {value!r}",
            ]
        else:
            kind = "counter" if sample.endswith("_total") else "gauge"
            lines += [
                f"# HELP {sample} A vLLM {kind}.",
                f"# TYPE {sample} {kind}",
                f"{sample}{LABELS} {value!r}",
            ]
    return "\n".join(lines) + "\n"


@dataclass
class Engine:
    """The stand-in's state as a vLLM engine: counters that grow by STEP per completions
    request, gauges, and the samples it leaves out."""

    counters: dict[str, float] = field(default_factory=lambda: dict(START))
    gauges: dict[str, float] = field(default_factory=lambda: dict(GAUGES))
    missing: frozenset[str] = frozenset()
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics(self, _body: Any) -> Reply:
        with self.lock:
            values = {**self.counters, **self.gauges}
        text = metrics_text({k: v for k, v in values.items() if k not in self.missing})
        return 200, text.encode()

    def count_request(self) -> None:
        with self.lock:
            for sample, step in STEP.items():
                self.counters[sample] += step


def response(prompt: list[int], i: int) -> list[int]:
    """Completion ``i`` of ``prompt``: the first copies the digits, the second only the
    first digit (rewards 1.0 and less)."""
    digits = prompt[1:-1]
    return [*digits, EOS] if i % 2 == 0 else [digits[0], EOS]


def logprobs(ids: list[int], i: int) -> list[float]:
    return [-0.25 * (i + 1) * (j + 1) for j in range(len(ids))]


def choices(body: Any, prompt_ids: Callable[[int, list[int]], list[int]]) -> list[dict[str, Any]]:
    """``n`` choices per prompt, numbered as vLLM does (prompt p's i-th is p * n + i), in
    reverse order (the reply's order is not promised)."""
    n = body["n"]
    out = []
    for p, prompt in enumerate(body["prompt"]):
        for i in range(n):
            ids = response(prompt, i)
            out.append(
                {
                    "index": p * n + i,
                    "prompt_token_ids": prompt_ids(p, prompt),
                    "token_ids": ids,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": logprobs(ids, i),
                    },
                    "finish_reason": "stop",
                }
            )
    return out[::-1]


def serve(
    stand_in: StandIn,
    engine: Engine,
    *,
    before_reply: Callable[[], None] = lambda: None,
    prompt_ids: Callable[[int, list[int]], list[int]] = lambda _p, prompt: prompt,
) -> None:
    stand_in.routes["GET", "/metrics"] = engine.metrics

    def complete(body: Any) -> Reply:
        before_reply()
        engine.count_request()
        return 200, json.dumps({"choices": choices(body, prompt_ids)}).encode()

    stand_in.routes["POST", "/v1/completions"] = complete


def rollout_engine(stand_in: StandIn, *, observe: bool = True) -> VllmRolloutEngine:
    client = VllmClient(stand_in.root, timeout_s=30.0, name=ENGINE)
    return VllmRolloutEngine(ENGINE, 0, CFG, TimeRecorder(), client, observe=observe)


def completion_requests(stand_in: StandIn) -> list[Any]:
    return [body for method, path, body in stand_in.seen if path == "/v1/completions"]


# -- VllmRolloutEngine ---------------------------------------------------------------


def test_rollout_returns_the_completions_with_rewards_and_the_engines_counter_differences(
    stand_in: StandIn,
) -> None:
    engine_state = Engine()
    in_flight = threading.Event()
    gauge_reads = threading.Semaphore(0)
    metrics = engine_state.metrics

    def metrics_route(body: Any) -> Reply:
        if in_flight.is_set():  # a read while the request generates: a gauge sample
            gauge_reads.release()
        return metrics(body)

    def before_reply() -> None:
        # Reply once the sampler has read twice: its first sample is then surely in.
        in_flight.set()
        for _ in range(2):
            assert gauge_reads.acquire(timeout=10)
        in_flight.clear()

    serve(stand_in, engine_state, before_reply=before_reply)
    stand_in.routes["GET", "/metrics"] = metrics_route
    engine = rollout_engine(stand_in)
    # Read at construction, the counters' families only (their buckets and counts too).
    assert {s: engine.last_metrics[s] for s in START} == START
    assert "process_cpu_seconds_total" not in engine.last_metrics
    assert "vllm:kv_cache_usage_perc" not in engine.last_metrics
    engine.loaded(2)  # iteration 3 is due version max(0, 3 - lag 1)

    batch = engine.rollout(3)

    (body,) = completion_requests(stand_in)
    prompts = engine.prompts(3)
    assert body["prompt"] == prompts
    assert body["n"] == CFG.completions_per_prompt == 2
    assert body["allowed_token_ids"] == [*range(10), 12]
    assert body["seed"] == seed_for(CFG.seed, 3, 2, 0) % 2**31
    assert body["max_tokens"] == max_response_tokens(CFG.max_digits) == 5
    assert body["temperature"] == CFG.temperature
    expected = tuple(
        Trajectory(
            tuple(prompts[g]),
            tuple(response(prompts[g], i)),
            reward(prompts[g], response(prompts[g], i)),
            g,
            tuple(logprobs(response(prompts[g], i), i)),
        )
        for g in range(2)
        for i in range(2)
    )
    # The copies score full marks, the one-digit answers a third of the digits' 0.8.
    assert [t.reward for t in expected] == pytest.approx([1.0, 0.8 / 3, 1.0, 0.8 / 3])
    figures = dict(batch.engine_figures)
    assert figures.pop("gauge_samples") >= 1
    assert figures == {
        **{key: STEP[sample] for key, sample in ENGINE_COUNTERS.items()},
        "tokens": STEP["vllm:prompt_tokens_total"] + STEP["vllm:generation_tokens_total"],
        **{key: GAUGES[sample] for key, sample in ENGINE_GAUGES.items()},
    }
    assert batch == RolloutBatch(3, ENGINE, 2, expected, batch.engine_figures)
    assert {s: engine.last_metrics[s] for s in START} == {s: START[s] + STEP[s] for s in START}


def test_a_second_rollout_reports_only_the_counters_since_the_first(stand_in: StandIn) -> None:
    engine_state = Engine()
    serve(stand_in, engine_state)
    engine = rollout_engine(stand_in)
    engine.loaded(0)
    engine.rollout(0)
    engine.rollout(1)  # iteration 1 is due version max(0, 1 - 1) = 0 as well
    with engine_state.lock:
        engine_state.counters["vllm:prompt_tokens_total"] += 1000.0  # served between reads

    engine.loaded(1)
    figures = engine.rollout(2).engine_figures

    assert figures["prompt_tokens"] == STEP["vllm:prompt_tokens_total"] + 1000.0
    assert figures["requests"] == STEP["vllm:request_success_total"]
    assert figures["tokens"] == 1010.0 + STEP["vllm:generation_tokens_total"]


def test_without_observe_engine_figures_are_empty_and_metrics_are_read_only_at_construction(
    stand_in: StandIn,
) -> None:
    serve(stand_in, Engine())
    engine = rollout_engine(stand_in, observe=False)
    assert stand_in.metrics_reads() == 1
    engine.loaded(0)

    batch = engine.rollout(0)
    engine.rollout(1)

    assert batch.engine_figures == {}
    assert len(batch.trajectories) == 4
    assert len(completion_requests(stand_in)) == 2
    assert stand_in.metrics_reads() == 1


@pytest.mark.parametrize("sample", sorted([*ENGINE_COUNTERS.values(), *ENGINE_GAUGES.values()]))
def test_a_server_without_one_of_the_counters_or_gauges_is_refused_at_construction_naming_it(
    stand_in: StandIn, sample: str
) -> None:
    serve(stand_in, Engine(missing=frozenset({sample})))
    client = VllmClient(stand_in.root, timeout_s=30.0, name=ENGINE)

    with pytest.raises(InvalidArgumentError) as info:
        VllmRolloutEngine(ENGINE, 0, CFG, TimeRecorder(), client)

    message = str(info.value)
    assert f"engine {ENGINE!r} ({stand_in.root}/metrics) has no {sample}:" in message
    assert "--vllm-python" in message
    others = {*ENGINE_COUNTERS.values(), *ENGINE_GAUGES.values()} - {sample}
    assert [o for o in others if o in message] == []


def test_a_reply_with_other_prompt_ids_than_sent_raises_naming_the_engine(
    stand_in: StandIn,
) -> None:
    serve(
        stand_in,
        Engine(),
        prompt_ids=lambda p, prompt: [prompt[0], *prompt[:0:-1]] if p == 1 else prompt,
    )
    engine = rollout_engine(stand_in)
    engine.loaded(0)
    prompt = engine.prompts(0)[1]
    answered = [prompt[0], *prompt[:0:-1]]
    assert answered != prompt

    with pytest.raises(RuntimeError) as info:
        engine.rollout(0)

    assert str(info.value) == (
        f"engine {ENGINE} answered prompt 1 with prompt ids {answered}, expected {prompt}"
    )
    assert engine.generated_through == -1  # the iteration is not done


def test_close_aborts_the_rollout_in_flight_promptly_and_refuses_new_ones(
    stand_in: StandIn,
) -> None:
    arrived = threading.Event()

    def block() -> None:
        arrived.set()
        stand_in.release.wait(30)

    serve(stand_in, Engine(), before_reply=block)
    engine = rollout_engine(stand_in)
    engine.loaded(0)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            engine.rollout(0)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert arrived.wait(10)
    closed_at = time.monotonic()
    engine.close()
    thread.join(10)
    took = time.monotonic() - closed_at

    assert not thread.is_alive()
    assert took < 2.0
    (exc,) = outcome
    assert isinstance(exc, VllmHttpError)
    assert str(exc).startswith(f"engine {ENGINE!r} ({stand_in.root}): POST /v1/completions")
    assert "aborted, the client was closed" in str(exc)
    with pytest.raises(RuntimeError, match=f"^engine {ENGINE} closed$"):
        engine.rollout(1)
    assert len(completion_requests(stand_in)) == 1


# -- _GaugePeaks ---------------------------------------------------------------------


def _join_sampler(name: str) -> None:
    """Wait for the sampling thread (not joined by the engine): a sample in flight when
    the block ended lands, so what the server served is what the peaks saw."""
    for thread in threading.enumerate():
        if thread.name == f"twinkle-gauges-{name}":
            thread.join(10)
            assert not thread.is_alive()


@dataclass
class Gauges:
    """What a stand-in served for the gauges: each read's values, and a semaphore
    released once per read (a test waits for reads, never for a time)."""

    served: list[dict[str, float]] = field(default_factory=list)
    reads: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def wait_for(self, n: int) -> None:
        for _ in range(n):
            assert self.reads.acquire(timeout=10), "the sampler did not read in 10 s"


def _varying_gauges(stand_in: StandIn) -> Gauges:
    """Serve gauges that change with every read (the peak is not the last)."""
    gauges = Gauges()
    kv = [0.5, 0.875, 0.25, 0.625]
    running = [3.0, 1.0, 4.0, 2.0]
    waiting = [0.0, 6.0, 2.0, 5.0]

    def metrics(_body: Any) -> Reply:
        k = len(gauges.served) % 4
        values = {
            "vllm:kv_cache_usage_perc": kv[k],
            "vllm:num_requests_running": running[k],
            "vllm:num_requests_waiting": waiting[k],
        }
        gauges.served.append(values)
        gauges.reads.release()
        return 200, metrics_text({**START, **values}).encode()

    stand_in.routes["GET", "/metrics"] = metrics
    return gauges


def test_gauge_peaks_keep_the_maximum_served_while_a_long_block_runs(stand_in: StandIn) -> None:
    gauges = _varying_gauges(stand_in)
    peaks = _GaugePeaks(VllmClient(stand_in.root, timeout_s=30.0, name=ENGINE))

    with peaks.sampling():
        gauges.wait_for(3)  # the block lasts until the sampler has read three times
    _join_sampler(ENGINE)

    taken = peaks.take()
    served = gauges.served
    assert taken["gauge_samples"] == len(served) >= 3
    assert taken == {
        **{key: max(s[sample] for s in served) for key, sample in ENGINE_GAUGES.items()},
        "gauge_samples": float(len(served)),
    }


def test_a_block_that_ends_at_once_has_no_samples_and_zero_peaks_even_after_a_sampled_one(
    stand_in: StandIn,
) -> None:
    gauges = _varying_gauges(stand_in)
    peaks = _GaugePeaks(VllmClient(stand_in.root, timeout_s=30.0, name=ENGINE))
    assert peaks.take() == {**dict.fromkeys(ENGINE_GAUGES, 0.0), "gauge_samples": 0.0}
    with peaks.sampling():
        gauges.wait_for(1)
    _join_sampler(ENGINE)
    assert peaks.take()["gauge_samples"] == len(gauges.served) >= 1
    reads = len(gauges.served)

    with peaks.sampling():
        pass  # ends long before the first sample is due
    _join_sampler(ENGINE)

    assert peaks.take() == {**dict.fromkeys(ENGINE_GAUGES, 0.0), "gauge_samples": 0.0}
    assert len(gauges.served) == reads


# -- vllm_rig's clean-up -------------------------------------------------------------


@dataclass
class FakeRig:
    """What vllm_rig was given in place of vLLM and the model: the work directory, and
    what the engine factory found there."""

    workdir: list[Path] = field(default_factory=list)
    model_written: list[bool] = field(default_factory=list)
    configs: list[Any] = field(default_factory=list)


@pytest.fixture
def fake_rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeRig:
    rig = FakeRig()

    def mkdtemp(prefix: str) -> str:
        path = tempfile.mkdtemp(prefix=prefix, dir=tmp_path)
        rig.workdir.append(Path(path))
        return path

    def write_model(_model: object, directory: Path) -> Path:
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"weights")
        return directory

    monkeypatch.setattr(demo_vllm, "check_vllm_python", lambda python, ask: Path("/no/python"))
    monkeypatch.setattr(demo_vllm, "tempfile", SimpleNamespace(mkdtemp=mkdtemp))
    monkeypatch.setattr(demo_vllm, "tiny_llama", lambda seed: object())  # ~10 s for real
    monkeypatch.setattr(demo_vllm, "write_model", write_model)
    return rig


def _factory_raising(
    rig: FakeRig, monkeypatch: pytest.MonkeyPatch, exc: BaseException, *, make_logs: bool
) -> None:
    def factory(config: Any) -> Any:
        rig.configs.append(config)
        rig.model_written.append((rig.workdir[0] / "model" / "model.safetensors").is_file())
        if make_logs:
            config.log_dir.mkdir()
            (config.log_dir / f"{ENGINE}.log").write_text("engine core died\n")
        raise exc

    monkeypatch.setattr(demo_vllm, "vllm_engine_factory", factory)


def _enter_rig() -> None:
    with vllm_rig(CFG, TimeRecorder(), first_iteration=0, on_step=lambda *a: None):
        pytest.fail("the rig started with an engine factory that raises")


def test_ctrl_c_while_starting_removes_the_work_directory_and_propagates(
    fake_rig: FakeRig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _factory_raising(fake_rig, monkeypatch, KeyboardInterrupt(), make_logs=True)

    with pytest.raises(KeyboardInterrupt):
        _enter_rig()

    (workdir,) = fake_rig.workdir
    assert workdir.name.startswith("twinkle-vllm-")
    assert fake_rig.model_written == [True]
    (config,) = fake_rig.configs
    assert config.log_dir == workdir / "logs"
    assert config.python == "/no/python"
    assert config.args[-2:] == ("--logprobs-mode", "processed_logprobs")
    assert not workdir.exists()  # even with logs written: Ctrl-C keeps nothing
    assert capsys.readouterr().err == ""


def test_a_failure_before_the_engines_wrote_logs_removes_the_work_directory_silently(
    fake_rig: FakeRig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _factory_raising(fake_rig, monkeypatch, RuntimeError("no vLLM here"), make_logs=False)

    with pytest.raises(RuntimeError, match=r"^no vLLM here$"):
        _enter_rig()

    (workdir,) = fake_rig.workdir
    assert fake_rig.model_written == [True]
    assert not workdir.exists()
    assert capsys.readouterr().err == ""


def test_a_failure_after_the_engines_wrote_logs_keeps_them_and_names_them_on_stderr(
    fake_rig: FakeRig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _factory_raising(fake_rig, monkeypatch, RuntimeError("engine died"), make_logs=True)

    with pytest.raises(RuntimeError, match=r"^engine died$"):
        _enter_rig()

    (workdir,) = fake_rig.workdir
    logs = workdir / "logs"
    assert (logs / f"{ENGINE}.log").read_text() == "engine core died\n"
    assert capsys.readouterr().err == (
        "twinkle demo: the vLLM demo's work directory (model, weights, the engines' logs "
        f"in logs/) is kept in {logs.parent}\n"
    )
