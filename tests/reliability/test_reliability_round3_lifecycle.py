"""Reliability round 3, lifecycle faults (issue 26, item 9): what a process killed
outright, a deleted log or a leaked thread used to leave behind, and what is left now.

* a local Ray cluster's driver killed outright (SIGKILL): Ray's dashboard and runtime-env
  agents used to stay a minute and more, and every cluster left a world-writable session
  directory in ``$TMPDIR/ray``; now the reaper ends them and removes the session
  directory, which lies in twinkle's per-user runtime directory (0700);
* a DDP demo's rank 0 killed outright: its ranks end with it, and the next DDP trainer
  removes the rendezvous directory it left;
* ``events.jsonl`` deleted, replaced or truncated while the run writes it: written back
  whole from the open file (or named when it cannot be), and the run ends ``error``; a
  run directory whose log was deleted between runs is refused, not appended to;
* a kill right after the run's start: the log holds the segment's first event (it used
  to be empty in 11 of 31 kills before iteration 0);
* a plugin that leaks a non-daemon thread: the ``twinkle`` command still exits, naming
  the thread.

Every process here is real, and every kill a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from twinkle.errors import ReporterError
from twinkle.hookspecs import hookimpl
from twinkle.locks import process_dir
from twinkle.plugins import DISABLE_AUTOLOAD_ENV
from twinkle.run import RunSession, replay
from twinkle.testing import scripted_run

#: a bound far below what each fault used to take (Ray's agents: 60 s and more; a DDP
#: rank waiting on a dead rank 0: its 60 s collective timeout, or forever at rendezvous)
GONE_WITHIN_S = 20.0


def gone(proc: psutil.Process) -> bool:
    """Whether ``proc`` ended (a zombie has: in a container whose pid 1 reaps nothing,
    an orphan stays one)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_until(done: Any, within_s: float) -> float:
    """Poll ``done()`` until true; the seconds it took (fails past ``within_s``)."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > within_s:
            pytest.fail(f"not done within {within_s} s")
        time.sleep(0.1)
    return time.monotonic() - start


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory of this test (TWINKLE_RUNTIME_DIR, here and in the
    processes it starts): short, under /tmp, since Ray puts unix sockets below it."""
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp")) / "rt"
    monkeypatch.setenv("TWINKLE_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def log_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in (run_dir / "events.jsonl").read_bytes().splitlines()]


def iterations(events: list[dict[str, Any]]) -> list[int]:
    return [e["iteration"] for e in events if e["type"] == "iteration_started"]


# -- a Ray driver killed outright -------------------------------------------------------

RAY_DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    from twinkle.cluster import init_ray

    ray = init_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    node = ray._private.worker._global_node
    raylet = node.all_processes["raylet"][0].process.pid
    print(json.dumps({
        "raylet": raylet,
        "session_dir": node.get_session_dir_path(),
        "children": [p.pid for p in psutil.Process(raylet).children(recursive=True)],
    }), flush=True)
    time.sleep(600)
    """
)


def with_raylet_env(raylet: int) -> list[psutil.Process]:
    """The processes whose environment names the raylet (its workers)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAY_RAYLET_PID") == str(raylet) and not gone(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(240)
def test_a_killed_ray_driver_leaves_no_agents_and_no_session_dir(runtime: Path) -> None:
    pytest.importorskip("ray")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(
        [sys.executable, "-c", RAY_DRIVER], stdout=subprocess.PIPE, text=True, env=env
    )
    cluster: list[psutil.Process] = []
    try:
        assert driver.stdout is not None
        started = json.loads(driver.stdout.readline() or "{}")
        assert started, f"the driver did not start Ray (exit code {driver.poll()})"
        raylet = psutil.Process(started["raylet"])
        session = Path(started["session_dir"])
        cluster = [raylet]
        for pid in started["children"]:
            try:
                cluster.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        names = {p.name() for p in cluster if not gone(p)}
        # the agents Ray leaves behind a killed driver are there to be left behind
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        # private: the runtime dir, its ray/ and the session dir (Ray makes them 0777)
        assert session.parent == runtime / "ray" and session.is_dir()
        assert (mode(runtime), mode(runtime / "ray"), mode(session)) == (0o700,) * 3

        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)

        took = wait_until(
            lambda: (
                all(gone(p) for p in cluster)
                and not with_raylet_env(raylet.pid)
                and not session.exists()
            ),
            GONE_WITHIN_S,
        )
        assert took < GONE_WITHIN_S
        assert list((runtime / "ray").iterdir()) == []  # session_latest went with it
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
        for proc in cluster:  # (what this test started, when the fault is back)
            if not gone(proc):
                proc.kill()


def test_a_dead_drivers_ray_session_dir_is_removed_as_the_next_cluster_starts(
    runtime: Path,
) -> None:
    from twinkle.cluster._ray import _ray_temp_dir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ray_dir = runtime / "ray"
    ray_dir.mkdir(parents=True)
    os.chmod(ray_dir, 0o777)  # (as Ray makes it)
    left = ray_dir / f"session_2026-01-01_00-00-00_000000_{dead.pid}"
    live = ray_dir / f"session_2026-01-01_00-00-00_000000_{os.getpid()}"
    for session in (left, live):
        (session / "logs").mkdir(parents=True)
    assert _ray_temp_dir() == ray_dir
    assert not left.exists() and live.is_dir()
    assert mode(ray_dir) == 0o700


# -- a DDP rank 0 killed outright ---------------------------------------------------------


def demo(out: Path, run_id: str, iterations: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "twinkle.cli",
        "demo",
        "--train-workers",
        "2",
        "--iterations",
        str(iterations),
        "--out",
        str(out),
        "--run-id",
        run_id,
        "--no-autoload",
    ]


def ranks_of(rank0: psutil.Process) -> list[psutil.Process]:
    """The DDP ranks that ``rank0`` spawned."""
    found = []
    for proc in rank0.children(recursive=True):
        try:
            if any("spawn_main" in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def loads_torch(rank: psutil.Process) -> bool:
    """Whether ``rank`` is loading torch: it has its orders from rank 0 (the object it
    runs, whose module imports torch), and goes to the rendezvous next."""
    try:
        return "libtorch" in Path(f"/proc/{rank.pid}/maps").read_text()
    except OSError:
        return False


def kill_rank0(out: Path, runtime: Path, run_id: str, *, running: bool) -> Path:
    """Start a DDP demo of two ranks and SIGKILL its rank 0: once its first iteration
    began (``running``), or while rank 1 loads torch (it waits at the rendezvous next,
    where no socket of a dead rank 0 can wake it, and rank 0 was gone before it could
    look at its parent). Asserts that every process rank
    0 had started ends within GONE_WITHIN_S; returns the rendezvous directory it left."""
    driver = subprocess.Popen(
        demo(out, run_id, 100_000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    children: list[psutil.Process] = []
    try:
        rank0 = psutil.Process(driver.pid)
        if running:
            log = out / run_id / "events.jsonl"
            wait_until(lambda: log.exists() and b'"iteration_started"' in log.read_bytes(), 120)
        else:
            wait_until(lambda: any(loads_torch(r) for r in ranks_of(rank0)), 120)
        assert len(ranks_of(rank0)) == 1  # world 2: rank 1
        children = rank0.children(recursive=True)
        (left,) = [d for d in (runtime / "ddp").iterdir() if d.name.startswith(f"{driver.pid}-")]
        assert mode(left) == 0o700

        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        # rank 1 (and multiprocessing's helper) end with rank 0
        took = wait_until(lambda: all(gone(p) for p in children), GONE_WITHIN_S)
        assert took < GONE_WITHIN_S
        return left
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for proc in children:  # (what this test started, when the fault is back)
            if not gone(proc):
                proc.kill()


@pytest.mark.timeout(300)
def test_a_killed_ddp_rank0_takes_its_ranks_along_and_the_next_removes_its_dir(
    runtime: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    starting = kill_rank0(tmp_path, runtime, "starting", running=False)
    assert starting.is_dir()  # nobody was left to remove it...
    running = kill_rank0(tmp_path, runtime, "running", running=True)
    assert not starting.exists()  # ...until the next DDP trainer: it removes a dead
    assert running.is_dir()  # owner's directory (and its own as it ends)
    done = subprocess.run(
        demo(tmp_path, "next", 1), capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    assert list((runtime / "ddp").iterdir()) == []


KILLED_OWNER = "from twinkle.locks import process_dir; print(process_dir('ddp'), flush=True)\n"


def test_a_process_dir_of_a_killed_owner_is_removed_by_the_next_one(runtime: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER + "import time; time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    theirs = Path(child.stdout.readline().strip())
    mine = process_dir("ddp")
    assert theirs.is_dir() and mine.is_dir()  # its owner runs: kept
    assert mode(theirs) == mode(mine) == mode(runtime / "ddp") == 0o700
    foreign = runtime / "ddp" / "not-one-of-ours"
    foreign.mkdir()
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()

    again = process_dir("ddp")
    assert not theirs.exists()
    assert mine.is_dir() and again.is_dir() and foreign.is_dir()  # live owner; not ours
    assert mine != again


# -- the event log: its first event, and the file kept the run's ---------------------------

KILLED_AT_START = textwrap.dedent(
    """
    import os, signal, sys
    from twinkle.run import RunSession

    RunSession(out_dir=sys.argv[1], run_id=sys.argv[2], autoload=False).start()
    os.kill(os.getpid(), signal.SIGKILL)  # the moment start() returns
    """
)


def kill_at_start(out: Path, run_id: str) -> None:
    child = [sys.executable, "-c", KILLED_AT_START, str(out), run_id]
    assert subprocess.run(child, check=False, timeout=120).returncode == -signal.SIGKILL


def test_a_kill_right_after_start_leaves_a_log_that_resumes(tmp_path: Path) -> None:
    for k in range(4):
        kill_at_start(tmp_path, f"k{k}")
        assert [e["type"] for e in log_lines(tmp_path / f"k{k}")] == ["run_started"], k
    # a resumed segment killed the same way: its run_resumed is there too
    kill_at_start(tmp_path, "k0")
    assert log_lines(tmp_path / "k0")[-1]["type"] == "run_resumed"

    with RunSession(out_dir=tmp_path, run_id="k0", autoload=False) as run:
        assert run.resumed is not None and run.resumed.previous_status is None
    events = log_lines(tmp_path / "k0")
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events].count("run_resumed") == 2
    replayed = replay(tmp_path / "k0" / "events.jsonl", tmp_path / "replayed")
    assert replayed.summary["status"] == "ok"


class Vandal:
    """At iteration ``at``: does ``act`` to the run's event log."""

    def __init__(self, log: Path, at: int, act: Any) -> None:
        self.log, self.at, self.act = log, at, act

    @hookimpl
    def twinkle_iteration_started(self, event: Any) -> None:
        if event.iteration == self.at:
            self.act(self.log)


def vandalised_run(out: Path, act: Any, iterations: int = 4) -> dict[str, Any]:
    """A scripted run whose log ``act`` hits at iteration 2: its summary (the
    ReporterError its end raised is in it)."""
    log = out / "r" / "events.jsonl"
    vandal = ("vandal", Vandal(log, 2, act))
    with pytest.raises(ReporterError) as raised:
        scripted_run(out, "r", iterations, autoload=False, plugins=[vandal])
    summary: dict[str, Any] = orjson.loads((out / "r" / "summary.json").read_bytes())
    assert summary["status"] == "error"
    assert str(raised.value) in summary["error"]
    return summary


def test_a_log_deleted_mid_run_is_written_back_and_the_run_ends_in_error(
    tmp_path: Path,
) -> None:
    summary = vandalised_run(tmp_path, os.unlink)
    assert "was deleted while the run wrote it" in summary["error"]
    assert "wrote it back whole" in summary["error"]
    run_dir = tmp_path / "r"
    events = log_lines(run_dir)
    assert [e["seq"] for e in events] == list(range(len(events)))  # whole, in order
    assert iterations(events) == [0, 1, 2, 3]
    assert [e["type"] for e in events].count("run_started") == 1
    # the log holds the run: it replays to the run's records, byte for byte
    replay(run_dir / "events.jsonl", tmp_path / "replayed")
    for name in ("metrics.jsonl", "metrics_raw.jsonl"):
        assert (tmp_path / "replayed" / name).read_bytes() == (run_dir / name).read_bytes()

    # the next run of that id resumes after iteration 3: no iteration twice
    scripted_run(tmp_path, "r", 2, autoload=False)
    events = log_lines(run_dir)
    assert iterations(events) == [0, 1, 2, 3, 4, 5]
    webui = [orjson.loads(x) for x in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [r["iteration"] for r in webui] == [0, 1, 2, 3, 4, 5]


def replace_log(log: Path) -> None:
    other = log.with_name("other")
    other.write_bytes(b'{"not":"the log"}\n')
    os.replace(other, log)


def test_a_log_replaced_mid_run_is_written_back_and_the_other_file_kept(tmp_path: Path) -> None:
    summary = vandalised_run(tmp_path, replace_log)
    assert "was replaced by another file while the run wrote it" in summary["error"]
    run_dir = tmp_path / "r"
    (aside,) = run_dir.glob("events.jsonl.replaced-*")
    assert aside.read_bytes() == b'{"not":"the log"}\n'
    assert aside.name in summary["error"]
    events = log_lines(run_dir)
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert iterations(events) == [0, 1, 2, 3]


def test_a_log_truncated_mid_run_is_named(tmp_path: Path) -> None:
    summary = vandalised_run(tmp_path, lambda log: os.truncate(log, 0))
    # (cut to 0; what the run appended after the cut, before its next check, is there)
    truncated = r"was truncated from \d+ to \d+ bytes while the run wrote it"
    assert re.search(truncated, summary["error"])


def test_a_run_dir_whose_log_was_deleted_is_refused_not_appended_to(tmp_path: Path) -> None:
    scripted_run(tmp_path, "r", 2, autoload=False)
    run_dir = tmp_path / "r"
    (run_dir / "events.jsonl").unlink()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(ReporterError, match=r"holds metrics_raw.jsonl, metrics.jsonl, trace"):
        scripted_run(tmp_path, "r", 2, autoload=False)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # untouched


# -- a leaked non-daemon thread -------------------------------------------------------------

LEAKY_PLUGIN = """
import os, threading
from twinkle.hookspecs import hookimpl

# a non-daemon thread nobody stops, started as the plugin is loaded (on the main
# thread): the interpreter would join it forever
threading.Thread(target=threading.Event().wait, name="leaky-plugin-thread").start()

class Leaky:
    @hookimpl
    def twinkle_configure(self, context):
        if "LEAKY_EXIT" in os.environ:
            raise SystemExit(int(os.environ["LEAKY_EXIT"]))  # (the plugin's failure)
"""


@pytest.fixture
def leaky_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``twinkle`` command that loads the ``leaky`` plugin (a real
    distribution: a ``*.dist-info`` beside its module on PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "leaky_mod.py").write_text(LEAKY_PLUGIN)
    info = site / "leaky_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leaky-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[twinkle.observers]\nleaky = leaky_mod:Leaky\n")
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(0, id="command-done"),
        # on the plugin's own thread: counted as its failure, not the command's exit
        pytest.param(3, id="plugin-sys-exit"),
    ],
)
def test_the_twinkle_command_exits_despite_a_leaked_thread_naming_it(
    leaky_env: dict[str, str], tmp_path: Path, status: int
) -> None:
    log = scripted_run(tmp_path / "live", "r", 2, autoload=False)
    out = tmp_path / "out"
    if status:
        leaky_env["LEAKY_EXIT"] = str(status)
    argv = [sys.executable, "-m", "twinkle.cli", "replay", str(log), "--out", str(out)]
    start = time.monotonic()
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=leaky_env, timeout=60
    )
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert (
        "twinkle: warning: exiting without waiting for 1 thread(s) left running 2 s after "
        "the command was done"
    ) in done.stderr
    assert "'leaky-plugin-thread' (at " in done.stderr
    assert took < 60
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["status"] == "ok"
    assert summary["observer_failures"] == ({"leaky": 1} if status else {})


def test_a_log_cut_between_a_check_and_a_larger_write_is_still_found(tmp_path: Path) -> None:
    from twinkle.observers._held_log import HeldLog

    log = tmp_path / "events.jsonl"
    log.write_bytes(b"x" * 100)
    held = HeldLog(log)
    assert held.check() is None
    os.truncate(log, 0)  # a cleaner cuts it right after the check...
    with log.open("ab") as out:  # ...and the run's next batch, larger than the file was
        out.write(b"y" * 500)
    held.wrote(500)
    damage = held.check()
    assert damage is not None and damage.what == "truncated from 600 to 500 bytes"
    assert not damage.restorable
    held.close()


def test_a_log_deleted_between_the_checks_two_reads_is_named_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check reads the held file, then the path: a log deleted in between is gone
    from its path with the links the first read saw. Deleted, not moved away (a run
    under load met this)."""
    import twinkle.observers._held_log as held_log

    log = tmp_path / "events.jsonl"
    log.write_bytes(b"x" * 100)
    held = held_log.HeldLog(log)
    stat = os.stat

    def deleted_first(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        os.unlink(log)  # (after the check's fstat of the held file)
        return stat(path, *args, **kwargs)

    monkeypatch.setattr("twinkle.observers._held_log.os.stat", deleted_first)
    damage = held.check()
    assert damage is not None and damage.what == "deleted" and damage.restorable
    held.close()
