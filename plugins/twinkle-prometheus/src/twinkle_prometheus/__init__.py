"""Prometheus for twinkle: a run's figures on a ``/metrics`` endpoint, for Grafana.

Installed, this plugin is loaded by every twinkle run of the environment (the observer
``prometheus`` in the entry-point group ``twinkle.observers``): the run's process
serves ``http://127.0.0.1:9464/metrics`` (prometheus_client's exposition format and
HTTP server), updated as the run's records arrive. Leave it out of one run with
``--block prometheus``, of all with ``TWINKLE_DISABLE_PLUGIN_AUTOLOAD=1``.

**Where it listens.** ``TWINKLE_PROMETHEUS_ADDR`` (default ``127.0.0.1``: this host
only; ``0.0.0.0`` for a Prometheus on another host) and ``TWINKLE_PROMETHEUS_PORT``
(default 9464), or the run's config ``x_prometheus: {"addr": ..., "port": ...}``
(the environment wins). One server per process and address: a second run of the
process is served by the same one, beside the first's last figures (the last
:data:`KEPT_RUNS` runs are kept). The server starts on the backend's own thread (its
``open()``); a port in use leaves the plugin's backend out of the run, named in
``summary.json`` (``backends`` -> ``prometheus`` -> ``setup_error``), and the run goes
on. A replay serves nothing.

**The last figures.** A job's process often ends right after its run: its endpoint goes
with it, and the run's last records (its run-level figures among them) would never be
scraped. So when the endpoint was scraped while the run ran, closing the run waits until
each scraper scraped it once more, at most ``TWINKLE_PROMETHEUS_LINGER_S`` seconds
(default 20; 0: never wait, as for a Pushgateway instead; keep it under the run's
backend timeout, ``--backend-timeout``, default 30 s, which cuts a longer wait off);
nobody scraping, it waits not at all. A scraper is told by its address and user agent
(two Prometheus servers of an HA pair on two hosts are two; a ``curl`` beside a
Prometheus is another); one that scraped once only while the run ran (a person's
look) is not waited for, unless no scraper came twice. Two scrapers from one address
with one user agent (two Prometheus servers on one host) are one to it: the first of
them to scrape ends the wait.

**What it serves** (every series labelled ``run_id``):

* ``twinkle_record_value{scope, kind, key}``: the latest value of every key of every
  record kind, exactly ``metrics_raw.jsonl``'s (a ``null`` is not served; nor is an
  iteration cut short by a crash, :func:`~twinkle.reporting.cut_short`, which the other
  sinks leave out too: its part-iteration figures, a resume's first to be served as it
  rebuilds, would read as a drop to 0);
* ``twinkle_iteration``, ``twinkle_optimizer_step``: the latest record's;
* ``twinkle_tokens_per_second_per_device{phase}``: each throughput phase's (its
  record's ``tokens_per_s_per_device``) and ``phase="iteration"``: the iteration's
  over its window;
* ``twinkle_phase_seconds{phase, view}``: the latest iteration's ``timing`` record:
  ``window_<phase>_seconds`` (``view="window"``), ``attributed_<phase>_seconds``
  (``view="attributed"``);
* ``twinkle_limit{verdict}``: 1 for the latest window's verdict (``training-bound``,
  ``generation-bound``, ``publish-bound``, ``mixed``, ``abstain``), 0 for the others;
* ``twinkle_tokens_total{phase}`` (counter): each throughput phase's tokens, added up
  over its iteration records; ``twinkle_records_total{kind}`` (counter);
* ``twinkle_memory_bytes{worker, field}``: each worker's latest memory reading, per
  field (``host_rss``, ``device_allocated_peak``, ...), from the run's memory events.

``grafana-dashboard.json`` beside this module is a Grafana dashboard of them
(``twinkle_prometheus.DASHBOARD``).
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from twinkle.errors import ConfigError, ReporterError
from twinkle.events import MemoryReadings
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import DEFAULT_BACKEND_TIMEOUT_S, MetricRecord, cut_short

__all__ = ["DASHBOARD", "KEPT_RUNS", "PrometheusBackend", "PrometheusSink", "served"]

_log = logging.getLogger("twinkle_prometheus")

ADDR_ENV, PORT_ENV = "TWINKLE_PROMETHEUS_ADDR", "TWINKLE_PROMETHEUS_PORT"
DEFAULT_ADDR, DEFAULT_PORT = "127.0.0.1", 9464
#: how long a run's close waits for a scrape of its last figures (under a backend's
#: default bound, 30 s)
LINGER_ENV, DEFAULT_LINGER_S = "TWINKLE_PROMETHEUS_LINGER_S", 20.0
#: the runs whose last figures a process keeps serving (the latest)
KEPT_RUNS = 8
#: the Grafana dashboard of the served figures
DASHBOARD = Path(__file__).with_name("grafana-dashboard.json")
_VERDICTS = ("training-bound", "generation-bound", "publish-bound", "mixed", "abstain")
_MEMORY_FIELDS = (
    "device_allocated", "device_allocated_peak", "device_reserved", "device_reserved_peak",
    "host_rss", "host_peak_rss",
)  # fmt: skip


class _Run:
    """One run's figures, as its records and memory readings left them."""

    def __init__(self, phases: Sequence[str], rated: Sequence[str]) -> None:
        self.phases, self.rated = tuple(phases), frozenset(rated)
        self.values: dict[tuple[str, str, str], float] = {}
        self.iteration: int | None = None
        self.step: int | None = None
        self.rates: dict[str, float] = {}
        self.seconds: dict[tuple[str, str], float] = {}
        self.verdict: str | None = None
        self.tokens: dict[str, float] = {}
        self.records: dict[str, int] = {}
        self.memory: dict[tuple[str, str], int] = {}

    def take(self, record: MetricRecord) -> None:
        kind, values = record.kind, record.values
        self.records[kind] = self.records.get(kind, 0) + 1
        if cut_short(record):  # (a crashed iteration's part: a false drop, as elsewhere)
            return
        for key, value in values.items():
            if value is not None:
                self.values[(record.scope, kind, key)] = float(value)
        if record.scope != "iteration":
            return
        self.iteration, self.step = record.iteration, record.step
        rate, tokens = values.get("tokens_per_s_per_device"), values.get("tokens")
        if (kind in self.rated or kind == "iteration") and rate is not None:
            self.rates[kind] = float(rate)
        if kind in self.rated and tokens is not None:
            self.tokens[kind] = self.tokens.get(kind, 0.0) + float(tokens)
        if kind == "timing":
            for phase in self.phases:
                for view, key in (("window", f"window_{phase}_seconds"),
                                  ("attributed", f"attributed_{phase}_seconds")):  # fmt: skip
                    seconds = values.get(key)
                    if seconds is not None:
                        self.seconds[(phase, view)] = float(seconds)
            verdict = record.attrs.get("window_verdict")
            self.verdict = verdict if isinstance(verdict, str) else self.verdict


#: who scrapes: (its address, its user agent)
Scraper = tuple[str, str]
#: the scraper of the request the server's thread serves (set around the library's app)
_SCRAPER = threading.local()


class Figures:
    """What a process serves: its runs' figures (the latest :data:`KEPT_RUNS`), read by
    the scrape on the server's thread while backends write them (one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, _Run] = {}
        #: the scrapes so far, each notified to :meth:`scrape_after`'s waiters
        self.scrapes = 0
        #: per scraper: its scrapes so far and the number of its last one
        self.scrapers: dict[Scraper, tuple[int, int]] = {}
        #: where they are served (:func:`served` sets it)
        self.url = ""
        self._scraped = threading.Condition(self.lock)

    def counts(self) -> tuple[int, dict[Scraper, int]]:
        """The scrapes so far, and each scraper's."""
        with self.lock:
            return self.scrapes, {who: n for who, (n, _) in self.scrapers.items()}

    def scrape_after(self, scrapes: int, timeout_s: float, by: Sequence[Scraper] = ()) -> bool:
        """Wait until a scrape after the first ``scrapes`` read the figures, by each of
        ``by`` (by anyone without them), at most ``timeout_s``; whether it did."""

        def done() -> bool:
            if not by:
                return self.scrapes > scrapes
            return all(self.scrapers.get(who, (0, 0))[1] > scrapes for who in by)

        with self._scraped:
            return self._scraped.wait_for(done, timeout_s)

    def _count_scrape(self) -> None:
        """(Under the lock, once the figures were read.)"""
        self.scrapes += 1
        who: Scraper = getattr(_SCRAPER, "who", ("", ""))
        n, _ = self.scrapers.get(who, (0, 0))
        self.scrapers[who] = (n + 1, self.scrapes)
        self._scraped.notify_all()

    def run(self, run_id: str, phases: Sequence[str], rated: Sequence[str]) -> None:
        with self.lock:
            self.runs.pop(run_id, None)
            self.runs[run_id] = _Run(phases, rated)
            while len(self.runs) > KEPT_RUNS:
                self.runs.pop(next(iter(self.runs)))

    def take(self, run_id: str, records: Sequence[MetricRecord]) -> None:
        with self.lock:
            run = self.runs.get(run_id)
            if run is not None:
                for record in records:
                    run.take(record)

    def memory(self, run_id: str, event: MemoryReadings) -> None:
        with self.lock:
            run = self.runs.get(run_id)
            if run is None:
                return
            for reading in event.readings:
                for field in _MEMORY_FIELDS:
                    value = getattr(reading, f"{field}_bytes", None)
                    if value is not None:
                        run.memory[(reading.worker_id, field)] = value

    def collect(self) -> Iterator[Any]:
        """The metric families of every run (prometheus_client's collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name: str, doc: str, labels: Sequence[str]) -> Any:
            return GaugeMetricFamily(name, doc, labels=["run_id", *labels])

        value = gauge("twinkle_record_value", "the latest value of each record key "
                      "(metrics_raw.jsonl)", ["scope", "kind", "key"])  # fmt: skip
        iteration = gauge("twinkle_iteration", "the latest record's iteration", [])
        step = gauge("twinkle_optimizer_step", "the latest record's optimizer step", [])
        rate = gauge("twinkle_tokens_per_second_per_device", "the latest iteration's tokens/s/"
                     "device, per throughput phase and the iteration's", ["phase"])  # fmt: skip
        seconds = gauge("twinkle_phase_seconds", "the latest iteration's seconds of each "
                        "phase (window and attributed views)", ["phase", "view"])  # fmt: skip
        limit = gauge("twinkle_limit", "1 for the latest window's verdict", ["verdict"])
        memory = gauge("twinkle_memory_bytes", "each worker's latest memory reading",
                       ["worker", "field"])  # fmt: skip
        tokens = CounterMetricFamily("twinkle_tokens", "tokens of each throughput phase",
                                     labels=["run_id", "phase"])  # fmt: skip
        records = CounterMetricFamily("twinkle_records", "records made, per kind",
                                      labels=["run_id", "kind"])  # fmt: skip
        with self.lock:
            for run_id, run in self.runs.items():
                for (scope, kind, key), v in run.values.items():
                    value.add_metric([run_id, scope, kind, key], v)
                if run.iteration is not None and run.step is not None:
                    iteration.add_metric([run_id], run.iteration)
                    step.add_metric([run_id], run.step)
                for phase, v in run.rates.items():
                    rate.add_metric([run_id, phase], v)
                for (phase, view), v in run.seconds.items():
                    seconds.add_metric([run_id, phase, view], v)
                if run.verdict is not None:
                    for verdict in dict.fromkeys((*_VERDICTS, run.verdict)):
                        limit.add_metric([run_id, verdict], float(verdict == run.verdict))
                for (worker, field), v in run.memory.items():
                    memory.add_metric([run_id, worker, field], v)
                for phase, v in run.tokens.items():
                    tokens.add_metric([run_id, phase], v)
                for kind, n in run.records.items():
                    records.add_metric([run_id, kind], n)
            self._count_scrape()
        yield from (value, iteration, step, rate, seconds, limit, memory, tokens, records)


_SERVERS: dict[tuple[str, int], tuple[Any, Figures]] = {}
_SERVERS_LOCK = threading.Lock()


def served(addr: str, port: int) -> Figures:
    """The figures this process serves on ``addr:port``: its server, started on the
    first call (:class:`~twinkle.errors.ReporterError` when it cannot listen there)."""
    with _SERVERS_LOCK:
        found = _SERVERS.get((addr, port))
        if found is not None:
            return found[1]
        from prometheus_client import CollectorRegistry

        figures = Figures()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(figures)
        try:
            server = _start_server(addr, port, registry)
        except OSError as exc:
            raise ReporterError(
                f"cannot serve Prometheus metrics on {addr}:{port} ({exc.strerror or exc}): "
                f"set {PORT_ENV} to a free port, or leave the plugin out (--block prometheus)"
            ) from exc
        _SERVERS[(addr, port)] = (server, figures)
        figures.url = f"http://{addr}:{server.server_port}/metrics"  # (port 0: the one bound)
        _log.info("twinkle: Prometheus metrics on %s", figures.url)
        return figures


def _start_server(addr: str, port: int, registry: Any) -> Any:
    """prometheus_client's ``start_http_server`` (its app, a threading WSGI server on a
    daemon thread), written out to wrap its app: the scrape's collect learns who
    scrapes, which the library hands no collector."""
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    app = make_wsgi_app(registry)
    found = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, *_, sockaddr = found[0]

    def told(environ: dict[str, Any], start_response: Any) -> Any:
        _SCRAPER.who = (environ.get("REMOTE_ADDR", ""), environ.get("HTTP_USER_AGENT", ""))
        try:
            return app(environ, start_response)
        finally:
            del _SCRAPER.who

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """No line per scrape on stderr."""

    server = make_server(str(sockaddr[0]), port, told, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="twinkle-prometheus", daemon=True).start()
    return server


class PrometheusBackend:
    """A twinkle reporting backend that hands each record to the figures the process
    serves; :meth:`open` (on the backend's own thread) starts the server."""

    def __init__(self, run_id: str, addr: str, port: int, phases: Sequence[str],
                 rated: Sequence[str], *, linger_s: float = DEFAULT_LINGER_S) -> None:  # fmt: skip
        self.run_id, self.addr, self.port = run_id, addr, port
        self.name = f"PrometheusBackend({addr}:{port})"
        self._phases, self._rated = phases, rated
        self.linger_s = linger_s
        self.figures: Figures | None = None
        self._at_open: dict[Scraper, int] = {}  # each scraper's scrapes before the run

    def open(self) -> None:
        figures = served(self.addr, self.port)
        figures.run(self.run_id, self._phases, self._rated)
        _, self._at_open = figures.counts()
        self.figures = figures

    def write(self, records: Sequence[MetricRecord]) -> None:
        if self.figures is None:
            raise ReporterError(f"{self.name} is not open: call its open() first")
        self.figures.take(self.run_id, records)

    def flush(self) -> None:
        """Nothing held back: a scrape reads the figures as they are."""

    def close(self) -> None:
        """The run's last figures stay served; when the endpoint was scraped while the
        run ran, wait until each scraper that came back while it ran (or, none did,
        anyone) scraped once more (at most ``linger_s``), which reads them: a process
        that ends with its run would take them with it."""
        figures = self.figures
        if figures is None or self.linger_s <= 0:
            return
        scrapes, now = figures.counts()
        during = {who: n - self._at_open.get(who, 0) for who, n in now.items()}
        if not any(during.values()):
            return
        by = sorted(who for who, n in during.items() if n >= 2)
        named = _named(by)
        _log.warning(
            "twinkle: run %r: waiting at most %g s for one more scrape of %s%s, which reads "
            "its last figures (%s=0 never waits)",
            self.run_id, self.linger_s, figures.url, f" by {named}" if by else "", LINGER_ENV,
        )  # fmt: skip
        if not figures.scrape_after(scrapes, self.linger_s, by):
            after = figures.counts()[1]
            late = [w for w in by if after.get(w, 0) == now[w]]
            _log.warning(
                "twinkle: run %r: no scrape of its last figures %swithin %g s",
                self.run_id, f"by {_named(late)} " if late else "", self.linger_s,
            )  # fmt: skip


def _named(scrapers: Sequence[Scraper]) -> str:
    """Scrapers in words: each one's address and user agent."""
    return ", ".join(f"{a or '?'} ({agent or 'no user agent'})" for a, agent in scrapers)


class PrometheusSink:
    """The observer: gives each live run a :class:`PrometheusBackend` and hands it the
    run's memory readings."""

    def __init__(self) -> None:
        self._backend: PrometheusBackend | None = None

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[PrometheusBackend] | None:
        if context.replay:
            return None  # a replay serves nothing
        addr, port = _where(context.config)
        config = context.config
        rated = [p for p in config.get("throughput", {})]
        self._backend = PrometheusBackend(
            context.run_id, addr, port, list(config.get("phases", {})), rated, linger_s=_linger_s()
        )
        return [self._backend]

    @hookimpl
    def twinkle_memory(self, event: MemoryReadings) -> None:
        backend = self._backend
        if backend is not None and backend.figures is not None:
            backend.figures.memory(backend.run_id, event)

    @hookimpl
    def twinkle_checkpoint_state(self) -> None:
        """Nothing to keep: the resumed run's backend is made for its segment, and a
        resume from the run's checkpoint hands it the earlier records from
        ``metrics_raw.jsonl`` (a restart need not feed the whole log again)."""
        return None

    @hookimpl
    def twinkle_unconfigure(self) -> None:
        self._backend = None


_LINGERS_SAID: set[float] = set()


def _linger_s() -> float:
    """``TWINKLE_PROMETHEUS_LINGER_S``: seconds >= 0 (a bad value is a
    :class:`~twinkle.errors.ConfigError` saying the fix)."""
    given = os.environ.get(LINGER_ENV) or str(DEFAULT_LINGER_S)
    try:
        linger = float(given)
    except ValueError:
        linger = -1.0
    if not 0 <= linger < float("inf"):
        raise ConfigError(
            f"{LINGER_ENV}={given!r} is not a number of seconds: set it to the longest "
            "wait for a last scrape at the run's end (0: none)"
        )
    if linger >= DEFAULT_BACKEND_TIMEOUT_S and linger not in _LINGERS_SAID:
        _LINGERS_SAID.add(linger)  # (once per process: each run of it reads the setting)
        _log.warning(
            "twinkle: %s=%g is not under a backend's default timeout (%g s): unless the "
            "run's backend timeout is longer (--backend-timeout, RunSession("
            "backend_timeout_s=)), a wait that long is cut off there and the backend named "
            "cut off in summary.json",
            LINGER_ENV, linger, DEFAULT_BACKEND_TIMEOUT_S,
        )  # fmt: skip
    return linger


def _where(config: Mapping[str, Any]) -> tuple[str, int]:
    """The address and port: the environment's, else ``config.x_prometheus``'s, else
    the defaults; a bad one is a :class:`~twinkle.errors.ConfigError` saying the fix."""
    given = config.get("x_prometheus") or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"config.x_prometheus must be an object, got {given!r:.100}")
    addr = os.environ.get(ADDR_ENV) or given.get("addr", DEFAULT_ADDR)
    port: Any = os.environ.get(PORT_ENV) or given.get("port", DEFAULT_PORT)
    try:
        port = int(port)
    except (TypeError, ValueError):
        port = -1
    if not isinstance(addr, str) or not addr or not 0 <= port <= 65535:
        raise ConfigError(
            f"the Prometheus endpoint {addr!r}:{port!r} is not an address and port: set "
            f"{ADDR_ENV} (e.g. 127.0.0.1) and {PORT_ENV} (0-65535)"
        )
    return addr, port
