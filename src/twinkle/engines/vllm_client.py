"""A small HTTP client for one running vLLM server (the OpenAI API plus its dev endpoints).

Plain :mod:`http.client`, one connection per request (so one client may be shared by
threads) and never a proxy: the engines listen on loopback. What it speaks, as measured
on vLLM 0.32:

* ``POST /v1/completions`` with ``prompt`` as lists of token ids, ``logprobs: 0`` and
  ``return_token_ids`` / ``return_tokens_as_token_ids``: each choice carries
  ``prompt_token_ids``, ``token_ids`` and ``logprobs.token_logprobs``;
* ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path":
  DIR}}`` (the server needs ``VLLM_SERVER_DEV_MODE=1``) answers ``{"results": [null]}``,
  one per worker. A directory that does not exist kills the engine core, so the client
  checks it first;
* ``POST /reset_prefix_cache``: after a reload, since cached prefixes keep the old
  weights' results;
* ``GET /metrics``: Prometheus text, read into ``{sample name: value summed over labels}``
  with ``prometheus_client``'s parser when it is installed (the ``demo`` extra), else with
  :func:`parse_prometheus_text`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final
from urllib.parse import urlsplit

from twinkle.checks import check_seconds
from twinkle.errors import InvalidArgumentError, TwinkleError

__all__ = [
    "Completion",
    "VllmClient",
    "VllmHttpError",
    "VllmReloadError",
    "family_of",
    "parse_prometheus_text",
]

_BODY_SNIPPET_CHARS: Final = 500


class VllmHttpError(TwinkleError):
    """A request to a vLLM server failed (names the engine, the endpoint and the reply)."""


class VllmReloadError(VllmHttpError):
    """An engine did not reload weights; it may be dead (names the engine and the path)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One prompt's completion: the prompt, the generated ids and their logprobs."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # natural log, one per generated token
    finish_reason: str | None  # "length", "stop", ... as vLLM says


@final
class VllmClient:
    """Talks to one vLLM server at ``base_url`` (``http://host:port``, ``/v1`` optional).

    Every request waits at most ``timeout_s``; ``name`` (default: the URL) names the
    engine in errors. :meth:`close` aborts the requests in flight (from any thread) and
    refuses new ones.
    """

    __slots__ = (
        "_closed",
        "_host",
        "_in_flight",
        "_lock",
        "_path_prefix",
        "_port",
        "name",
        "root_url",
        "timeout_s",
    )

    def __init__(self, base_url: str, timeout_s: float = 60.0, *, name: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise InvalidArgumentError(
                f"base_url={base_url!r} is not an http://host:port URL; pass a vLLM "
                "server's address, e.g. VllmEngine.base_url"
            )
        timeout_s = check_seconds(
            "timeout_s", timeout_s, zero_ok=False, means="how long each request waits at most"
        )
        self._host = parts.hostname
        self._port = parts.port or 80
        path = parts.path.rstrip("/").removesuffix("/v1")
        self.root_url = f"http://{parts.netloc}{path}"
        self._path_prefix = path
        self.timeout_s = timeout_s
        self.name = name or base_url
        self._lock = threading.Lock()
        self._in_flight: set[http.client.HTTPConnection] = set()
        self._closed = False

    def close(self) -> None:
        """Abort every request in flight (each raises :class:`VllmHttpError` saying the
        client was closed) and refuse new ones; the server is left running."""
        with self._lock:
            self._closed = True
            conns = list(self._in_flight)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading

    # -- the API -----------------------------------------------------------------------

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        temperature: float,
        n: int = 1,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
    ) -> list[Completion]:
        """``n`` completions per prompt (token ids in and out), grouped by prompt in the
        prompts' order.

        ``seed`` makes sampling reproducible (vLLM seeds a prompt's ``n`` completions
        ``seed``, ``seed + 1``, ...); ``allowed_token_ids`` restricts sampling to those
        ids. The logprobs are what the server's ``--logprobs-mode`` says: the raw
        model's by default, ``processed_logprobs`` for the distribution sampled from
        (after temperature and ``allowed_token_ids``).
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InvalidArgumentError(
                f"prompts={[list(p) for p in prompts]!r}: pass one or more non-empty lists "
                "of token ids"
            )
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens={max_tokens!r} must be >= 1")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"n={n!r} must be an int >= 1 (completions per prompt)")
        if not temperature >= 0:
            raise InvalidArgumentError(f"temperature={temperature!r} must be >= 0")
        body: dict[str, Any] = {
            "prompt": [[int(t) for t in p] for p in prompts],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "n": n,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        if stop_token_ids is not None:
            body["stop_token_ids"] = [int(t) for t in stop_token_ids]
        if allowed_token_ids is not None:
            body["allowed_token_ids"] = [int(t) for t in allowed_token_ids]
        if ignore_eos:
            body["ignore_eos"] = True
        reply = self._json("POST", "/v1/completions", body)
        try:
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            out = [
                Completion(
                    prompt_token_ids=tuple(c["prompt_token_ids"]),
                    token_ids=tuple(c["token_ids"]),
                    logprobs=tuple(float(lp) for lp in c["logprobs"]["token_logprobs"]),
                    finish_reason=c.get("finish_reason"),
                )
                for c in choices
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise VllmHttpError(
                f"engine {self.name!r}: POST /v1/completions answered without token ids or "
                f"logprobs ({exc!r}): {_snippet(json.dumps(reply))}; is it vLLM >= 0.10?"
            ) from exc
        if len(out) != n * len(prompts) or any(len(c.logprobs) != len(c.token_ids) for c in out):
            raise VllmHttpError(
                f"engine {self.name!r}: POST /v1/completions gave {len(out)} choices for "
                f"{len(prompts)} prompts x n={n} (or logprobs not one per token): "
                f"{_snippet(json.dumps(reply))}"
            )
        return out

    def reload_weights(self, path: str | Path) -> None:
        """Reload the engine's weights from the safetensors files in directory ``path``.

        The directory is checked here first: vLLM's engine core dies on a missing one.
        Raises :class:`VllmReloadError` when the engine does not confirm.
        """
        weights = Path(path)
        if not weights.is_dir() or not any(weights.glob("*.safetensors")):
            raise InvalidArgumentError(
                f"weights path {str(weights)!r} is not a directory holding *.safetensors "
                f"files; engine {self.name!r} was not asked to reload (a missing directory "
                "would kill its engine core)"
            )
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights.resolve())}}
        try:
            reply = self._json("POST", "/collective_rpc", body)
        except VllmHttpError as exc:
            if self._closed:  # our own abort, not the engine's failure
                raise
            raise VllmReloadError(
                f"engine {self.name!r} did not reload weights from {str(weights)!r}; the "
                f"engine may be dead (check its log): {exc}"
            ) from exc
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list) or not results or any(r is not None for r in results):
            raise VllmReloadError(
                f"engine {self.name!r} answered reload_weights from {str(weights)!r} with "
                f"{_snippet(json.dumps(reply))} (expected {{'results': [null, ...]}}); the "
                "engine may be dead or only partly reloaded (check its log)"
            )

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (they hold the old weights' keys and values)."""
        self._request("POST", "/reset_prefix_cache", None)

    def metrics(self, families: Collection[str] | None = None) -> dict[str, float]:
        """``GET /metrics``: every sample's value, summed over its labels.

        ``families`` (e.g. ``{"vllm:prompt_tokens", "vllm:kv_cache_usage_perc"}``) keeps
        only those metric families, and parses only their lines: a vLLM server serves
        ~50 KB, which ``prometheus_client`` parses in ~18 ms here.
        """
        text = self._request("GET", "/metrics", None).decode(errors="replace")
        if families is not None:
            text = _only_families(text, frozenset(families))
        try:
            from prometheus_client.parser import text_string_to_metric_families
        except ImportError:
            return parse_prometheus_text(text)
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
        return totals

    def __repr__(self) -> str:
        return f"VllmClient({self.name!r}, root_url={self.root_url!r})"

    # -- HTTP --------------------------------------------------------------------------

    def _json(self, method: str, endpoint: str, body: Any) -> Any:
        raw = self._request(method, endpoint, body)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise VllmHttpError(
                f"engine {self.name!r} ({self.root_url}): {method} {endpoint} answered "
                f"with no JSON: {_snippet(raw.decode(errors='replace'))}"
            ) from exc

    def _request(self, method: str, endpoint: str, body: Any) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        where = f"engine {self.name!r} ({self.root_url}): {method} {endpoint}"
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        with self._lock:
            if self._closed:
                raise VllmHttpError(f"{where}: the client was closed; make a new VllmClient")
            self._in_flight.add(conn)
        try:
            conn.connect()
            if self._closed:  # closed while connecting: its shutdown found no socket
                raise OSError("closed")
            conn.request(method, self._path_prefix + endpoint, body=data, headers=headers)
            reply = conn.getresponse()
            raw = reply.read()
            if self._closed:  # a body cut short by the abort may read as complete
                raise OSError("closed")
        except (OSError, http.client.HTTPException) as exc:
            if self._closed:
                raise VllmHttpError(f"{where}: aborted, the client was closed") from exc
            raise VllmHttpError(
                f"{where} failed: {exc!r} (is the server up? timeout_s={self.timeout_s})"
            ) from exc
        finally:
            with self._lock:
                self._in_flight.discard(conn)
            conn.close()
        if not 200 <= reply.status < 300:
            raise VllmHttpError(
                f"{where} answered {reply.status} {reply.reason}: "
                f"{_snippet(raw.decode(errors='replace'))}"
            )
        return raw


# A sample line: name, optional {labels}, value, optional timestamp. Label values are
# quoted strings that may hold escaped quotes and braces.
_SAMPLE: Final = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
    r"\s+(\S+)(?:\s+-?\d+)?\s*$"
)


def parse_prometheus_text(text: str) -> dict[str, float]:
    """The Prometheus text exposition format read into ``{sample name: value}``, the
    values of a sample name summed over its label sets.

    The fallback for when ``prometheus_client`` is not installed: comment lines
    (``# HELP``, ``# TYPE``) and blank lines are skipped, a trailing timestamp is
    ignored, ``NaN``/``+Inf``/``-Inf`` are floats; a line that is none of these raises
    :class:`InvalidArgumentError`. Sample names are as written (a counter's
    ``_total``, a histogram's ``_bucket``/``_sum``/``_count``).
    """
    totals: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _SAMPLE.match(stripped)
        value = _float(match[2]) if match else None
        if match is None or value is None:
            raise InvalidArgumentError(
                f"line {number} of the metrics text is not a Prometheus sample: {line!r}"
            )
        totals[match[1]] = totals.get(match[1], 0.0) + value
    return totals


# The suffixes a family's samples add to its name (counters, histograms, summaries, info).
_SUFFIXES: Final = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")
_NAME_END: Final = re.compile(r"[{\s]")


def family_of(sample: str) -> str:
    """The metric family of a sample name: ``vllm:prompt_tokens_total`` ->
    ``vllm:prompt_tokens`` (a family whose own name ends so keeps it only when it is
    listed as itself)."""
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def _only_families(text: str, families: frozenset[str]) -> str:
    """The lines of ``text`` (comments included) that belong to ``families``."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)  # "# TYPE name type", "# HELP name text"
            if len(parts) >= 3 and parts[2] in families:
                kept.append(line)
            continue
        match = _NAME_END.search(line)
        name = line if match is None else line[: match.start()]
        if name in families or family_of(name) in families:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _float(text: str) -> float | None:
    try:
        return float(text)  # also NaN, +Inf, -Inf
    except ValueError:
        return None


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _BODY_SNIPPET_CHARS else text[:_BODY_SNIPPET_CHARS] + "..."
