"""The plugin scraped by a real Prometheus server (Debian's ``prometheus``, started here on
loopback with a scrape config pointing at the plugin) and read back through its HTTP
API: the values it stored are the run's records, and every panel of the shipped Grafana
dashboard finds data."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twinkle_prometheus import DASHBOARD, LINGER_ENV, PORT_ENV, PrometheusSink, served

from twinkle.errors import ConfigError
from twinkle.reporting import read_jsonl
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs Debian's prometheus (make test installs it)"
)
# scripted_run's configuration, with generation streaming beside training
CONFIG = {**SCRIPTED_CONFIG, "streaming": {"generation": "rollout", "training": "train"}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus server on loopback scraping 127.0.0.1:<port> every second: its API's
    base URL and the port it scrapes."""
    target, api = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: twinkle\n    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )
    assert PROMETHEUS is not None
    with (tmp_path / "prometheus.log").open("wb") as log:  # (the child holds its own copy)
        server = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{api}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    base = f"http://127.0.0.1:{api}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError((tmp_path / "prometheus.log").read_text()) from None
                time.sleep(0.2)
        # Targets are taken up every 5 s: wait until it scrapes ours (down until the run).
        while not any(
            t["lastScrape"] > "0001"
            for t in _get(f"{base}/api/v1/targets")["data"]["activeTargets"]
        ):
            assert time.monotonic() < deadline, "Prometheus never scraped its target"
            time.sleep(0.2)
        yield base, target
    finally:
        server.terminate()
        server.wait(timeout=30)


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    found = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert found["status"] == "success", found
    return list(found["data"]["result"])


def _run(out: Path, iterations: int) -> Path:
    """A run on the real clock, slow enough for a few scrapes while it runs."""
    with RunSession(out_dir=out, run_id="p", config=CONFIG, autoload=False,
                    plugins=[("prometheus", PrometheusSink())]) as run:  # fmt: skip
        for i in range(iterations):
            run.bus.iteration_started(i)
            with run.recorder.span("generate", iteration=i):
                time.sleep(0.15)
            run.bus.samples(iteration=i, phase="rollout", lengths=[30 + i, 40], groups=1)
            with run.recorder.span("train.step", iteration=i):
                time.sleep(0.25)
            run.bus.samples(iteration=i, phase="train", lengths=[30 + i, 40])
            run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
            run.read_memory(iteration=i)
            run.bus.scalars(iteration=i, name="grpo", values={"reward_mean": 0.1 * i})
    return out / "p"


def test_prometheus_stores_the_runs_records_and_the_dashboard_finds_them(
    prometheus: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, port = prometheus
    monkeypatch.setenv(PORT_ENV, str(port))
    run_dir = _run(tmp_path / "runs", iterations=8)
    records = list(read_jsonl(run_dir / "metrics_raw.jsonl"))
    counts: dict[str, int] = {}
    for r in records:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
    # Wait for a scrape that holds the run's last record.
    deadline = time.monotonic() + 30
    while sum(float(s["value"][1]) for s in _query(base, "twinkle_records_total")) < len(records):
        assert time.monotonic() < deadline, "Prometheus never scraped the run's last records"
        time.sleep(0.5)
    # Every key's latest value, as Prometheus stored it: the records', exactly.
    latest = {
        (r["scope"], r["kind"], k): v
        for r in records
        for k, v in r["values"].items()
        if v is not None
    }
    stored = {
        (s["metric"]["scope"], s["metric"]["kind"], s["metric"]["key"]): float(s["value"][1])
        for s in _query(base, 'twinkle_record_value{run_id="p"}')
    }
    assert stored == {key: float(v) for key, v in latest.items()}
    assert len(stored) > 80
    assert {
        s["metric"]["kind"]: float(s["value"][1]) for s in _query(base, "twinkle_records_total")
    } == counts
    tokens = sum(
        r["values"]["tokens"]
        for r in records
        if (r["kind"], r["scope"]) == ("rollout", "iteration")
    )
    assert float(_query(base, 'twinkle_tokens_total{phase="rollout"}')[0]["value"][1]) == tokens
    last = [r for r in records if r["scope"] == "iteration"][-1]["iteration"]
    assert float(_query(base, "twinkle_iteration")[0]["value"][1]) == last
    verdict = [s["metric"]["verdict"] for s in _query(base, "twinkle_limit == 1")]
    timing = [r for r in records if (r["kind"], r["scope"]) == ("timing", "iteration")]
    assert verdict == [timing[-1]["attrs"]["window_verdict"]]
    # Each worker's memory: its last reading in the log.
    readings = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        for reading in event.get("readings", []) if event["type"] == "memory" else []:
            readings[reading["worker_id"]] = reading["host_rss_bytes"]
    memory = {s["metric"]["worker"]: float(s["value"][1])
              for s in _query(base, 'twinkle_memory_bytes{field="host_rss"}')}  # fmt: skip
    assert memory == {w: float(v) for w, v in readings.items()}
    # Every panel of the dashboard finds data (a rate: once two scrapes hold the counter).
    while not _query(base, "count_over_time(twinkle_tokens_total[5m]) >= 2"):
        assert time.monotonic() < deadline + 30, "Prometheus never scraped twice"
        time.sleep(0.5)
    # ... and every value it stored on the way was one of that key's records'.
    span = f"[{int((records[-1]['wall_ns'] - records[0]['wall_ns']) / 1e9) + 60}s]"
    scraped = 0
    for key in ("reward_mean", "window_idle_seconds", "tokens_per_s_per_device"):
        for series in _query(base, f'twinkle_record_value{{key="{key}",scope="iteration"}}{span}'):
            scraped = max(scraped, len({v for _, v in series["values"]}))
            kind = series["metric"]["kind"]
            rows = [r for r in records if (r["kind"], r["scope"]) == (kind, "iteration")]
            values = {float(r["values"][key]) for r in rows if r["values"].get(key) is not None}
            assert {float(v) for _, v in series["values"]} <= values, kind
    assert scraped >= 2  # (scraped while the run ran: values changed between scrapes)
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # (Grafana's $__rate_interval: 4 scrape intervals at least, 4 s here)
            expr = target["expr"].replace("$run_id", "p").replace("$__rate_interval", "4s")
            assert "$" not in expr, expr
            assert _query(base, expr), f"panel {panel['title']!r}: {expr} finds nothing"


def test_a_port_in_use_leaves_the_backend_out_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv(PORT_ENV, str(taken.getsockname()[1]))
        run_dir = _run(tmp_path / "runs", iterations=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    error = summary["backends"]["prometheus"]["setup_error"]
    assert "cannot serve Prometheus metrics on 127.0.0.1" in error and PORT_ENV in error


def test_a_bad_port_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from twinkle_prometheus import _where

    monkeypatch.setenv(PORT_ENV, "http")
    with pytest.raises(ConfigError, match=PORT_ENV):
        _where({})
    assert served  # (the module's server function is public)


#: a run in a process of its own, which exits as soon as the run is done
_CHILD_RUN = """
import sys, time
from twinkle_prometheus import PrometheusSink
from twinkle.run import RunSession
from twinkle.testing import SCRIPTED_CONFIG

with RunSession(out_dir=sys.argv[1], run_id="short", config=SCRIPTED_CONFIG, autoload=False,
                plugins=[("prometheus", PrometheusSink())]) as run:
    for i in range(int(sys.argv[2])):
        run.bus.iteration_started(i)
        with run.recorder.span("generate", iteration=i):
            time.sleep(0.6)
        run.bus.samples(iteration=i, phase="rollout", lengths=[30, 40], groups=1)
        run.bus.optimizer_step(iteration=i, step=i + 1, samples=2)
print(time.monotonic())
"""


def test_a_process_that_ends_with_its_run_is_scraped_once_more_first(
    prometheus: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its endpoint went with the process: Prometheus never stored the run's last
    records (its run-level figures among them). Scraped while it ran, the run's close
    waits for one more scrape (Prometheus here scrapes every second)."""
    base, port = prometheus
    env = {**os.environ, PORT_ENV: str(port)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_RUN, str(tmp_path), "4"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"for one more scrape of http://127.0.0.1:{port}/metrics" in done.stderr
    assert f"({LINGER_ENV}=0 never waits)" in done.stderr  # (why the process waits)
    records = list(read_jsonl(tmp_path / "short" / "metrics_raw.jsonl"))
    stored = _query(base, 'twinkle_records_total{run_id="short"}')
    assert sum(float(s["value"][1]) for s in stored) == len(records)
    assert _query(base, 'twinkle_record_value{run_id="short",scope="run",key="wall_seconds"}')


def test_each_scraper_reads_the_last_figures_not_only_the_first_to_come(
    prometheus: tuple[str, int], tmp_path: Path
) -> None:
    """Another client polls the endpoint ten times a second (a dashboard, a health
    check): its scrape after the run's end came first, and the process went with the
    last figures before Prometheus (every second) read them. The close now waits for
    each scraper that came back while the run ran, Prometheus among them."""
    base, port = prometheus
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            stop.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD_RUN, str(tmp_path), "6"],
            env={**os.environ, PORT_ENV: str(port)}, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
    finally:
        stop.set()
        poller.join(timeout=10)
    assert done.returncode == 0, done.stderr
    waited = re.search(r"one more scrape of \S+ by (.*), which reads", done.stderr)
    assert waited is not None, done.stderr
    assert "127.0.0.1 (Prometheus/" in waited[1] and "127.0.0.1 (Python-urllib/" in waited[1]
    records = list(read_jsonl(tmp_path / "short" / "metrics_raw.jsonl"))
    stored = _query(base, 'twinkle_records_total{run_id="short"}')
    assert sum(float(s["value"][1]) for s in stored) == len(records)


def test_the_end_names_each_scraper_it_waits_for_and_any_that_did_not_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two scrapers from one address, told by their user agents: the end waits for both,
    and names the one that did not come back within the wait."""
    from twinkle_prometheus import PrometheusBackend

    port = _free_port()
    backend = PrometheusBackend("two", "127.0.0.1", port, [], [], linger_s=1.0)
    backend.open()

    def scrape(agent: str) -> None:
        url = f"http://127.0.0.1:{port}/metrics"
        request = urllib.request.Request(url, headers={"User-Agent": agent})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    for agent in ("Prometheus/2.0", "curl/8", "Prometheus/2.0", "curl/8"):
        scrape(agent)
    again = threading.Timer(0.2, scrape, ["Prometheus/2.0"])  # (while the end waits)
    again.start()
    with caplog.at_level("WARNING", logger="twinkle_prometheus"):
        backend.close()
    again.join()
    said = [r.getMessage() for r in caplog.records]
    assert any(" by 127.0.0.1 (Prometheus/2.0), 127.0.0.1 (curl/8), which" in m for m in said)
    late = "twinkle: run 'two': no scrape of its last figures by 127.0.0.1 (curl/8) within 1 s"
    assert late in said


def test_a_bad_linger_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from twinkle_prometheus import LINGER_ENV, _linger_s

    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(LINGER_ENV, bad)
        with pytest.raises(ConfigError, match=LINGER_ENV):
            _linger_s()
    monkeypatch.setenv(LINGER_ENV, "0")
    assert _linger_s() == 0.0


def test_a_linger_past_the_backend_timeout_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's backend timeout (30 s by default) would cut such a wait off, naming the
    backend cut off: said at the start, with the setting that lets it wait."""
    from twinkle_prometheus import LINGER_ENV, _linger_s

    monkeypatch.setenv(LINGER_ENV, "60")
    assert _linger_s() == 60.0
    (said,) = [r.getMessage() for r in caplog.records if LINGER_ENV in r.getMessage()]
    assert "default timeout (30 s)" in said and "--backend-timeout" in said
    caplog.clear()
    monkeypatch.setenv(LINGER_ENV, "20")
    assert _linger_s() == 20.0 and not caplog.records


def test_an_iteration_cut_short_is_not_served_as_the_latest_figures() -> None:
    """A resume rebuilds the killed segment's records first, its last iteration cut
    short (partial, no step of its own): its part-iteration throughput would be served
    as a drop to 0; it is left out, as the other sinks leave it, and still counted."""
    from twinkle_prometheus import _Run

    from twinkle.reporting import make_record

    def rollout(iteration: int, rate: float, **attrs: Any) -> Any:
        return make_record(kind="rollout", scope="iteration", run_id="r", step=iteration,
                           iteration=iteration, wall_ns=iteration, monotonic_ns=iteration,
                           values={"tokens_per_s_per_device": rate, "tokens": 10 * rate},
                           attrs=attrs)  # fmt: skip

    run = _Run(["rollout"], ["rollout"])
    run.take(rollout(4, 25.0, window_flags=[], iteration_steps=1))
    run.take(rollout(5, 0.0, window_flags=["partial"], iteration_steps=0))
    assert run.rates == {"rollout": 25.0} and run.tokens == {"rollout": 250.0}
    assert run.values[("iteration", "rollout", "tokens_per_s_per_device")] == 25.0
    assert (run.iteration, run.records) == (4, {"rollout": 2})
    run.take(rollout(6, 30.0, window_flags=["partial"], iteration_steps=1))  # (it stepped)
    assert (run.iteration, run.rates) == (6, {"rollout": 30.0})
