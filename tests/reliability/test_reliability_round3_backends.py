"""Reliability round 3, items 1, 2, 4 and 5: a plugin's record backend — hanging,
raising, slow or unable to set up — never holds the run's own files, ``finish()`` or
Ctrl-C, and what it did is counted per backend in ``summary.json``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinkle.errors import PluginError, ReporterError
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import (
    IsolatedBackend,
    JsonlBackend,
    MetricRecord,
    MetricsReporter,
    make_record,
    read_jsonl,
)
from twinkle.run import RunSession, replay
from twinkle.testing import scripted_run


class Backend:
    """A plugin's backend that records what it got, and may hang or raise."""

    def __init__(self, *, hang_in: str | None = None, raise_in: str | None = None) -> None:
        self.name = "TestBackend"
        self.hang_in = hang_in
        self.raise_in = raise_in
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: list[int] = []

    def _call(self, call: str) -> None:
        if call == self.hang_in:
            self.entered.set()
            self.release.wait()
        if call == self.raise_in:
            raise ConnectionError(f"{call}: tracking server gone")

    def write(self, records: Sequence[MetricRecord]) -> None:
        self._call("write")
        self.got.extend(r.seq or 0 for r in records)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")


class Sink:
    """A third-party observer whose one backend is ``backend``."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Any]:
        return [self.backend]


@pytest.fixture
def released() -> Iterator[list[Backend]]:
    """Backends whose hung threads the test lets end afterwards."""
    made: list[Backend] = []
    yield made
    for backend in made:
        backend.release.set()


def _raw(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(run_dir / "metrics_raw.jsonl"))


def _summary(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def _assert_replay_identical(run_dir: Path, out: Path) -> None:
    replay(run_dir / "events.jsonl", out, autoload=False)
    for name in ("metrics_raw.jsonl", "metrics.jsonl", "summary.json"):
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


# -- item 1: a hanging backend -------------------------------------------------------------


def test_a_backend_that_never_returns_holds_neither_the_run_files_nor_finish(
    tmp_path: Path, released: list[Backend], caplog: pytest.LogCaptureFixture
) -> None:
    hang = Backend(hang_in="write")
    released.append(hang)
    with RunSession(
        out_dir=tmp_path,
        run_id="r",
        autoload=False,
        plugins=[("hang", Sink(hang))],
        backend_timeout_s=1.0,
    ) as run:
        for i in range(20):
            run.bus.iteration_started(i)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 1.0 / (i + 1)})
        assert hang.entered.wait(5)  # the plugin's backend is stuck in its first write
        deadline = time.monotonic() + 5
        while len(_raw(tmp_path / "r")) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)  # the run's own file fills meanwhile (0.2 s hand-overs)
        assert len(_raw(tmp_path / "r")) >= 15
        started = time.monotonic()
    took = time.monotonic() - started
    assert took < 3.0  # finish waited at most the bound for the stuck plugin
    summary = _summary(tmp_path / "r")
    assert summary["status"] == "ok"
    health = summary["backends"]["hang"]
    assert health["isolated"] is True
    assert health["cut_off"] == "write() did not return within 1 s"
    assert health["records_written"] == 0
    assert health["records_lost"] == health["records"] == len(_raw(tmp_path / "r"))
    assert summary["backends"]["metrics_raw"]["records_written"] == health["records"]
    assert "backend 'hang' cut off" in caplog.text
    _assert_replay_identical(tmp_path / "r", tmp_path / "replayed")


def test_the_reporter_never_blocks_on_a_hanging_backend_however_many_records(
    tmp_path: Path, released: list[Backend]
) -> None:
    hang = Backend(hang_in="write")
    released.append(hang)
    isolated = IsolatedBackend(hang, name="hang", timeout_s=60, max_records=1_000)
    path = tmp_path / "raw.jsonl"
    reporter = MetricsReporter(
        [JsonlBackend(path), isolated], run_id="r", background=True, queue_size=512
    )
    started = time.monotonic()
    for i in range(70_000):  # far past both queues' bounds
        reporter.report(
            make_record(
                kind="k",
                scope="iteration",
                run_id="r",
                iteration=i,
                step=0,
                wall_ns=0,
                monotonic_ns=i,
                values={"x": i},
            )
        )
    reporter.flush()
    assert time.monotonic() - started < 60
    assert len(list(read_jsonl(path))) == 70_000  # every record in the run's own file
    health = isolated.health()
    assert health.records == 70_000 and health.records_lost >= 70_000 - 1_000 - 1_024
    isolated.timeout_s = 0.2  # (then close gives up on it quickly)
    reporter.close()
    assert isolated.health().records_lost == 70_000


def test_ctrl_c_while_finish_waits_for_a_hanging_close_stops_the_process(
    tmp_path: Path,
) -> None:
    script = textwrap.dedent(
        f"""
        import sys, threading
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_reliability_round3_backends import Backend, Sink
        from twinkle.run import RunSession

        hang = Backend(hang_in="close")
        with RunSession(out_dir={str(tmp_path)!r}, run_id="r", autoload=False,
                        plugins=[("hang", Sink(hang))], backend_timeout_s=600) as run:
            for i in range(3):
                run.bus.iteration_started(i)
            print("finishing", flush=True)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"finishing"
    time.sleep(0.5)  # inside finish(), waiting for the plugin's close
    child.send_signal(signal.SIGINT)
    try:
        code = child.wait(timeout=20)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        assert child.stderr is not None
        child.stderr.close()
    assert code != 0  # interrupted, as asked, within seconds (not the 600 s bound)
    events = list(read_jsonl(tmp_path / "r" / "events.jsonl"))
    assert [e["type"] for e in events][-2:] == ["run_finished", "backends_closed"]
    summary = _summary(tmp_path / "r")  # written before the interrupt went on up
    assert summary["status"] == "ok"  # the run had finished; its plugin was given up on
    assert summary["backends"]["hang"]["cut_off"] == "closing was interrupted (KeyboardInterrupt)"
    _assert_replay_identical(tmp_path / "r", tmp_path / "replayed")


def run_beside_a_hung_and_a_failing_backend(
    out: Path, iterations: int, released: list[Backend], figures: Any
) -> None:
    """A run of ``iterations`` whose one plugin backend hangs in its first write and
    another raises in every write: the run's own files hold every record, ``finish()``
    is bounded, both backends are counted."""
    hang, failing = Backend(hang_in="write"), Backend(raise_in="write")
    released.append(hang)
    bound_s = 2.0
    with RunSession(
        out_dir=out,
        run_id="soak",
        autoload=False,
        plugins=[("hang", Sink(hang)), ("failing", Sink(failing))],
        backend_timeout_s=bound_s,
    ) as run:
        for i in range(iterations):
            run.bus.iteration_started(i)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 1.0 / (i + 1)})
        finishing = time.monotonic()
    finish_s = time.monotonic() - finishing
    raw = _raw(out / "soak")
    assert [r["iteration"] for r in raw if r["kind"] == "grpo"] == list(range(iterations))
    summary = _summary(out / "soak")
    assert summary["status"] == "ok"
    hung, failed = summary["backends"]["hang"], summary["backends"]["failing"]
    assert hung["cut_off"] is not None and hung["records_lost"] == len(raw)
    assert failed["records_failed"] == len(raw) and failed["cut_off"] is None
    assert summary["backends"]["metrics_raw"]["records_written"] == len(raw)
    assert finish_s < bound_s + 5.0  # the hung plugin waited for once, at most its bound
    _assert_replay_identical(out / "soak", out / "replayed")  # the files hold every record
    figures(
        iterations=iterations,
        records_written=len(raw),
        lost=0,
        hung_backend_records_lost=hung["records_lost"],
        failing_backend_records_failed=failed["records_failed"],
        finish_s=round(finish_s, 2),
    )


def test_a_run_beside_a_hung_and_a_failing_backend_keeps_every_record(
    tmp_path: Path, sizes: Any, figures: Any, released: list[Backend]
) -> None:
    run_beside_a_hung_and_a_failing_backend(
        tmp_path, sizes.hung_backend_iterations, released, figures
    )


@pytest.mark.soak
def test_soak_a_run_beside_a_hung_and_a_failing_backend(
    tmp_path: Path, sizes: Any, figures: Any, released: list[Backend]
) -> None:
    run_beside_a_hung_and_a_failing_backend(
        tmp_path, sizes.hung_backend_iterations, released, figures
    )


# -- item 2: failures counted per backend ----------------------------------------------------


def test_backend_failures_are_counted_per_backend_in_the_summary(tmp_path: Path) -> None:
    flaky = Backend(raise_in="write")
    log = scripted_run(
        tmp_path,
        "r",
        5,
        autoload=False,
        plugins=[("flaky", Sink(flaky)), ("fine", Sink(Backend()))],
    )
    summary = _summary(log.parent)
    records = len(_raw(log.parent))
    flaky_health = summary["backends"]["flaky"]
    assert flaky_health["calls_failed"] >= 1
    assert flaky_health["records_failed"] == flaky_health["records"] == records
    assert flaky_health["records_written"] == 0
    fine = summary["backends"]["fine"]
    assert (fine["records_written"], fine["calls_failed"], fine["cut_off"]) == (records, 0, None)
    assert summary["status"] == "ok"  # the run is fine: one of its sinks is not
    assert summary["segments"][-1]["backends"] == summary["backends"]
    _assert_replay_identical(log.parent, tmp_path / "replayed")


# -- item 4: the run's files do not lag behind a slow sink ------------------------------------


def test_a_slow_backend_does_not_delay_the_run_files(tmp_path: Path) -> None:
    class Slow(Backend):
        def write(self, records: Sequence[MetricRecord]) -> None:
            time.sleep(2.0)
            super().write(records)

    slow = Slow()
    with RunSession(
        out_dir=tmp_path, run_id="r", autoload=False, plugins=[("slow", Sink(slow))]
    ) as run:
        for i in range(6):
            run.bus.iteration_started(i)
            run.bus.scalars(iteration=i, name="grpo", values={"loss": 1.0})
        started = time.monotonic()
        while not any(r["kind"] == "grpo" and r["iteration"] == 5 for r in _raw(tmp_path / "r")):
            assert time.monotonic() - started < 1.5, "the run's own file waited for the sink"
            time.sleep(0.02)
        assert slow.got == []  # still in its first write
    assert _summary(tmp_path / "r")["backends"]["slow"]["records_lost"] == 0


# -- item 5: a plugin that cannot set up is left out -----------------------------------------


class CannotConfigure:
    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        raise ReporterError("tensorboard/ is read-only")


class CannotMakeBackends:
    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Any]:
        raise ReporterError("cannot create the MLflow store: no space left on device")


class CannotOpen:
    """Set-up in the backend's open(), on its own thread (off the run's start)."""

    class _Backend(Backend):
        def open(self) -> None:
            raise OSError(30, "Read-only file system")

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Any]:
        return [self._Backend()]


LEFT_OUT = [("cfg", CannotConfigure()), ("make", CannotMakeBackends()), ("open", CannotOpen())]


def test_plugins_that_cannot_set_up_are_left_out_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    log = scripted_run(tmp_path, "r", 3, autoload=False, plugins=LEFT_OUT)
    summary = _summary(log.parent)
    assert summary["status"] == "ok"
    left = summary["plugins_left_out"]
    assert left["cfg"] == "twinkle_configure raised ReporterError: tensorboard/ is read-only"
    assert "no space left on device" in left["make"]
    assert left["open"] == "its backend could not open: OSError: [Errno 30] Read-only file system"
    assert summary["backends"]["open"]["records_lost"] == len(_raw(log.parent))
    started = next(read_jsonl(log))
    assert set(started["plugins_left_out"]) == {"cfg", "make"}  # known at the start
    for name in ("cfg", "make", "open"):
        assert f"plugin {name!r}" in caplog.text
    _assert_replay_identical(log.parent, tmp_path / "replayed")


def test_a_resume_goes_on_without_a_plugin_that_cannot_set_up(tmp_path: Path) -> None:
    scripted_run(tmp_path, "r", 2, autoload=False)
    log = scripted_run(tmp_path, "r", 2, autoload=False, plugins=LEFT_OUT)
    summary = _summary(log.parent)
    assert summary["status"] == "ok" and len(summary["segments"]) == 2
    assert summary["segments"][0]["plugins_left_out"] == {}
    assert set(summary["segments"][1]["plugins_left_out"]) == {"cfg", "make", "open"}


@pytest.mark.parametrize("name", ["cfg", "make", "open"])
def test_a_required_plugin_that_cannot_set_up_stops_the_start(tmp_path: Path, name: str) -> None:
    with pytest.raises((ReporterError, PluginError), match=r"read-only|no space|Read-only"):
        RunSession(
            out_dir=tmp_path,
            run_id="r",
            autoload=False,
            plugins=LEFT_OUT,
            required_plugins=[name],
        ).start()
    assert not (tmp_path / "r").exists()  # nothing left behind


def test_requiring_a_plugin_the_run_does_not_load_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match=r"required plugin\(s\) 'mlflow' not loaded"):
        RunSession(out_dir=tmp_path, run_id="r", autoload=False, required_plugins=["mlflow"])
    with pytest.raises(Exception, match=r"pass \['mlflow'\]"):
        RunSession(out_dir=tmp_path, run_id="r", autoload=False, required_plugins="mlflow")


def test_a_slow_set_up_is_off_the_start(tmp_path: Path, released: list[Backend]) -> None:
    class SlowOpen(Backend):
        def open(self) -> None:
            self.entered.set()
            self.release.wait()

    slow = SlowOpen()
    released.append(slow)
    started = time.monotonic()
    session = RunSession(
        out_dir=tmp_path,
        run_id="r",
        autoload=False,
        plugins=[("slow", Sink(slow))],
        backend_timeout_s=0.5,
    )
    with session as run:
        assert time.monotonic() - started < 2.0
        run.bus.iteration_started(0)
    assert session.summary is not None
    assert session.summary["backends"]["slow"]["cut_off"] == "open() did not return within 0.5 s"
    assert os.path.exists(tmp_path / "r" / "metrics_raw.jsonl")
