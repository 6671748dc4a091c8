"""The "ping engine": a real subprocess engine that binds reserved ports and answers pings.

Used by the tests and the benchmark to exercise the pool and the port reservation with
real processes and real sockets, without an inference engine. Each engine gets
``inherited`` ports as already-bound sockets (passed fds, never free in between) and the
rest as numbers it binds itself (the way vLLM binds its ports).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Final

from twinkle.engines._subprocess import SubprocessEngine, launch_subprocess, wait_for_line
from twinkle.engines.pool import EngineFactory, StartContext
from twinkle.engines.ports import PortRegistry
from twinkle.errors import InvalidArgumentError

__all__ = ["PING_SERVER", "ping", "ping_engine_factory"]

PING_SERVER: Final = Path(__file__).with_name("_ping_server.py")


def ping_engine_factory(
    registry: PortRegistry,
    *,
    ports: int = 2,
    inherited: int = 1,
    init_delay_s: float = 0.0,
    host: str = "127.0.0.1",
    python: str = sys.executable,
) -> EngineFactory[SubprocessEngine]:
    """A factory for ping engines serving ``ports`` reserved ports on ``host``."""
    if not 0 <= inherited <= ports or ports < 1:
        raise InvalidArgumentError(
            f"ports={ports!r}, inherited={inherited!r}: need ports >= 1 and 0 <= inherited <= ports"
        )

    def factory(ctx: StartContext) -> SubprocessEngine:
        reservation = registry.reserve(ports, label=ctx.name, host=host)
        try:
            argv = [python, "-I", "-S", str(PING_SERVER), ctx.name, "--host", host]
            argv += ["--init-delay-s", repr(init_delay_s)]
            fds: list[int] = []
            for i in range(inherited):
                sock = reservation.socket(i)
                sock.listen(64)  # connections queue from now on, before the child is up
                fds.append(sock.fileno())
                argv += ["--fd", str(sock.fileno())]
            for i in range(inherited, ports):
                argv += ["--port", str(reservation.ports[i])]
            reservation.close_sockets(*range(inherited, ports))
        except BaseException:
            reservation.release()
            raise
        return launch_subprocess(
            ctx,
            argv,
            ready=wait_for_line("ready"),
            reservation=reservation,
            pass_fds=fds,
            capture_stdout=True,
            stop_timeout_s=5.0,
        )

    return factory


def ping(port: int, *, host: str = "127.0.0.1", timeout_s: float = 5.0) -> str:
    """Send one ping to ``host:port`` and return the reply line (``"pong NAME PORT"``)."""
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(b"ping\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                break
            reply += chunk
    return reply.decode().strip()
