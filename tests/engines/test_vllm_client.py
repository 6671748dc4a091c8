"""twinkle.engines.vllm_client against a stand-in vLLM server on 127.0.0.1 (no vLLM)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _vllm_stand_in import Reply, StandIn
from twinkle.engines import (
    Completion,
    VllmClient,
    VllmHttpError,
    VllmReloadError,
    family_of,
    parse_prometheus_text,
)
from twinkle.errors import InvalidArgumentError

METRICS = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 11.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 4.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 0.75
"""


def _json(obj: Any, status: int = 200) -> Callable[[Any], Reply]:
    return lambda _body: (status, json.dumps(obj).encode())


def _choice(index: int, prompt: list[int], ids: list[int], lps: list[float]) -> dict[str, Any]:
    return {
        "index": index,
        "prompt_token_ids": prompt,
        "token_ids": ids,
        "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lps},
        "finish_reason": "length",
    }


def _weights_dir(tmp_path: Path) -> Path:
    path = tmp_path / "v1"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x")
    return path


def test_complete_sends_token_ids_and_returns_completions_in_prompt_order(
    stand_in: StandIn,
) -> None:
    choices = [_choice(1, [4, 5], [6], [-0.5]), _choice(0, [1, 2, 3], [7, 8], [-0.1, -0.2])]
    stand_in.routes["POST", "/v1/completions"] = _json({"choices": choices})
    client = VllmClient(stand_in.url)
    out = client.complete(
        [[1, 2, 3], (4, 5)], max_tokens=2, temperature=0.0, seed=3, stop_token_ids=[9]
    )
    assert out == [
        Completion((1, 2, 3), (7, 8), (-0.1, -0.2), "length"),
        Completion((4, 5), (6,), (-0.5,), "length"),
    ]
    (_, _, body) = stand_in.seen[0]
    assert body == {
        "prompt": [[1, 2, 3], [4, 5]],
        "max_tokens": 2,
        "temperature": 0.0,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "seed": 3,
        "stop_token_ids": [9],
    }


def test_complete_with_n_groups_each_prompts_completions_and_sends_allowed_ids(
    stand_in: StandIn,
) -> None:
    # vLLM numbers choice i of prompt p as p * n + i; the reply's order is not promised.
    choices = [
        _choice(3, [4], [2], [-0.4]),
        _choice(0, [1], [5], [-0.1]),
        _choice(2, [4], [1], [-0.3]),
        _choice(1, [1], [6], [-0.2]),
    ]
    stand_in.routes["POST", "/v1/completions"] = _json({"choices": choices})
    out = VllmClient(stand_in.url).complete(
        [[1], [4]], max_tokens=1, temperature=1.0, n=2, allowed_token_ids=[1, 2, 5, 6]
    )
    assert [(c.prompt_token_ids, c.token_ids) for c in out] == [
        ((1,), (5,)),
        ((1,), (6,)),
        ((4,), (1,)),
        ((4,), (2,)),
    ]
    (_, _, body) = stand_in.seen[0]
    assert body["n"] == 2 and body["allowed_token_ids"] == [1, 2, 5, 6]


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_complete_refuses_a_bad_n(stand_in: StandIn, n: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"n=.* must be an int >= 1"):
        VllmClient(stand_in.url).complete([[1]], max_tokens=1, temperature=0.0, n=n)
    assert stand_in.seen == []


def test_complete_with_n_refuses_a_reply_short_of_choices(stand_in: StandIn) -> None:
    stand_in.routes["POST", "/v1/completions"] = _json({"choices": [_choice(0, [1], [5], [-0.1])]})
    with pytest.raises(VllmHttpError, match=r"1 choices for 1 prompts x n=2"):
        VllmClient(stand_in.url).complete([[1]], max_tokens=1, temperature=0.0, n=2)


def test_an_http_error_names_the_engine_endpoint_status_and_body(stand_in: StandIn) -> None:
    stand_in.routes["POST", "/v1/completions"] = lambda _b: (400, b'{"error":"max_tokens bad"}')
    client = VllmClient(stand_in.url, name="vllm-0")
    with pytest.raises(VllmHttpError) as info:
        client.complete([[1]], max_tokens=1, temperature=1.0)
    message = str(info.value)
    assert "'vllm-0'" in message and stand_in.url.removesuffix("/v1") in message
    assert "POST /v1/completions" in message and "400" in message and "max_tokens bad" in message


def test_a_reply_without_token_ids_is_an_error_not_an_empty_completion(
    stand_in: StandIn,
) -> None:
    stand_in.routes["POST", "/v1/completions"] = _json({"choices": [{"index": 0, "text": "a"}]})
    with pytest.raises(VllmHttpError, match="without token ids"):
        VllmClient(stand_in.url).complete([[1]], max_tokens=1, temperature=0.0)


def test_a_server_that_is_not_there_is_named_with_the_endpoint() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = VllmClient(f"http://127.0.0.1:{port}", timeout_s=2.0, name="gone")
    with pytest.raises(VllmHttpError, match=r"'gone'.*GET /metrics failed.*is the server up"):
        client.metrics()


def test_bad_arguments_are_refused_before_any_request(stand_in: StandIn) -> None:
    client = VllmClient(stand_in.url)
    with pytest.raises(InvalidArgumentError, match="prompts="):
        client.complete([[]], max_tokens=1, temperature=0.0)
    with pytest.raises(InvalidArgumentError, match="max_tokens=0"):
        client.complete([[1]], max_tokens=0, temperature=0.0)
    with pytest.raises(InvalidArgumentError, match="base_url="):
        VllmClient("127.0.0.1:8000")
    for bad in (0, -1.0, float("nan"), float("inf"), True, "60"):
        with pytest.raises(
            InvalidArgumentError, match=r"^timeout_s=.* must be a finite number of seconds > 0"
        ):
            VllmClient(stand_in.url, timeout_s=bad)  # type: ignore[arg-type]
    assert VllmClient(stand_in.url, timeout_s=1).timeout_s == 1.0
    assert stand_in.seen == []


def test_reload_weights_checks_the_directory_before_asking_the_engine(
    stand_in: StandIn, tmp_path: Path
) -> None:
    client = VllmClient(stand_in.url, name="vllm-1")
    with pytest.raises(InvalidArgumentError, match=r"not a directory holding \*\.safetensors"):
        client.reload_weights(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="'vllm-1' was not asked"):
        client.reload_weights(tmp_path / "empty")
    assert stand_in.seen == []


def test_reload_weights_posts_collective_rpc_and_accepts_null_results(
    stand_in: StandIn, tmp_path: Path
) -> None:
    stand_in.routes["POST", "/collective_rpc"] = _json({"results": [None]})
    path = _weights_dir(tmp_path)
    VllmClient(stand_in.url).reload_weights(path)
    assert stand_in.seen == [
        (
            "POST",
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(path.resolve())}},
        )
    ]


@pytest.mark.parametrize(
    "status, reply",
    [(500, b"Internal Server Error"), (200, b'{"results": ["boom"]}'), (200, b"{}")],
)
def test_a_failed_reload_names_the_engine_and_says_it_may_be_dead(
    stand_in: StandIn, tmp_path: Path, status: int, reply: bytes
) -> None:
    stand_in.routes["POST", "/collective_rpc"] = lambda _b: (status, reply)
    with pytest.raises(VllmReloadError, match="may be dead") as info:
        VllmClient(stand_in.url, name="vllm-0").reload_weights(_weights_dir(tmp_path))
    assert "'vllm-0'" in str(info.value) and "v1" in str(info.value)
    assert isinstance(info.value, VllmHttpError)


def test_reset_prefix_cache_posts_to_the_server_root(stand_in: StandIn) -> None:
    stand_in.routes["POST", "/reset_prefix_cache"] = lambda _b: (200, b"")
    VllmClient(stand_in.url).reset_prefix_cache()
    assert stand_in.seen == [("POST", "/reset_prefix_cache", None)]


@pytest.mark.parametrize("parser", ["prometheus_client", "fallback"])
def test_metrics_sum_each_sample_over_its_labels(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch, parser: str
) -> None:
    if parser == "fallback":  # as if prometheus_client were not installed
        monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    else:
        pytest.importorskip("prometheus_client")
    stand_in.routes["GET", "/metrics"] = lambda _b: (200, METRICS.encode())
    metrics = VllmClient(stand_in.url).metrics()
    assert metrics == {
        "vllm:prompt_tokens_total": 15.0,
        "vllm:e2e_request_latency_seconds_bucket": 5.0,
        "vllm:e2e_request_latency_seconds_count": 3.0,
        "vllm:e2e_request_latency_seconds_sum": 0.75,
    }


@pytest.mark.parametrize("parser", ["prometheus_client", "fallback"])
def test_metrics_of_named_families_only(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch, parser: str
) -> None:
    if parser == "fallback":
        monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    else:
        pytest.importorskip("prometheus_client")
    stand_in.routes["GET", "/metrics"] = lambda _b: (200, METRICS.encode())
    client = VllmClient(stand_in.url)
    assert client.metrics(families={"vllm:prompt_tokens"}) == {"vllm:prompt_tokens_total": 15.0}
    histogram = client.metrics(families=["vllm:e2e_request_latency_seconds", "vllm:absent"])
    assert histogram == {
        "vllm:e2e_request_latency_seconds_bucket": 5.0,
        "vllm:e2e_request_latency_seconds_count": 3.0,
        "vllm:e2e_request_latency_seconds_sum": 0.75,
    }
    assert client.metrics(families=()) == {}


def test_a_samples_family_drops_its_suffix() -> None:
    assert family_of("vllm:prompt_tokens_total") == "vllm:prompt_tokens"
    assert family_of("vllm:e2e_request_latency_seconds_sum") == "vllm:e2e_request_latency_seconds"
    assert family_of("vllm:kv_cache_usage_perc") == "vllm:kv_cache_usage_perc"


def test_the_fallback_parser_reads_special_values_timestamps_and_quoted_braces() -> None:
    text = 'a_total{path="/x}{\\"y"} 2 1700000000\na_total 1\nb NaN\nc +Inf\n\n# c comment\n'
    parsed = parse_prometheus_text(text)
    assert parsed["a_total"] == 3.0 and parsed["c"] == float("inf")
    assert parsed["b"] != parsed["b"]  # NaN
    with pytest.raises(InvalidArgumentError, match=r"line 1 .* not a Prometheus sample"):
        parse_prometheus_text("not a sample line at all\n")


def test_close_aborts_a_request_in_flight_and_refuses_new_ones(stand_in: StandIn) -> None:
    import time

    release = threading.Event()

    def slow(_body: Any) -> Reply:
        release.wait(10)  # a generation that takes long
        return 200, b'{"choices": []}'

    stand_in.routes["POST", "/v1/completions"] = slow
    client = VllmClient(stand_in.url, timeout_s=30, name="e0")
    raised: list[BaseException] = []

    def call() -> None:
        try:
            client.complete([[1]], max_tokens=1, temperature=0.0)
        except BaseException as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 10
    while not stand_in.seen and time.monotonic() < deadline:  # the request has arrived
        time.sleep(0.01)
    t0 = time.monotonic()
    client.close()
    caller.join(timeout=5)
    release.set()
    assert not caller.is_alive() and time.monotonic() - t0 < 2
    (exc,) = raised
    assert isinstance(exc, VllmHttpError)
    assert "engine 'e0'" in str(exc) and "aborted, the client was closed" in str(exc)
    with pytest.raises(VllmHttpError, match=r"the client was closed; make a new VllmClient"):
        client.metrics()
