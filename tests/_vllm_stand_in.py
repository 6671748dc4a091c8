"""A stand-in vLLM server on 127.0.0.1 for tests that need no vLLM (the ``stand_in``
fixture of ``tests/conftest.py``).

It answers each (method, path) with what ``routes`` says (a function of the request's
JSON body returning ``(status, body bytes)``, 404 otherwise) and records every request.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Reply = tuple[int, bytes]


@dataclass
class StandIn:
    """The server's routes and what it was asked: ``seen`` holds (method, path, body)."""

    routes: dict[tuple[str, str], Callable[[Any], Reply]] = field(default_factory=dict)
    seen: list[tuple[str, str, Any]] = field(default_factory=list)
    root: str = ""  # http://127.0.0.1:<port>
    #: set at teardown, so a route blocked on it lets the server stop
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        """The OpenAI API's base URL, as ``VllmEngine.base_url`` gives it."""
        return self.root + "/v1"

    def metrics_reads(self) -> int:
        return sum(1 for method, path, _ in self.seen if (method, path) == ("GET", "/metrics"))


@contextlib.contextmanager
def serve() -> Iterator[StandIn]:
    """Run a stand-in server until the block ends."""
    state = StandIn()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            state.seen.append((method, self.path, body))
            route = state.routes.get((method, self.path))
            status, raw = route(body) if route else (404, b'{"detail":"Not Found"}')
            with contextlib.suppress(OSError):  # the client may have hung up meanwhile
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.root = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
