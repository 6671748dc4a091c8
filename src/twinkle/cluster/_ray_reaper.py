"""The reaper of a local Ray cluster started by :func:`twinkle.cluster.init_ray`: a
small process that makes the cluster end with its driver, however the driver ends.

Ray ties the processes the driver starts (GCS, raylet, dashboard, monitors) to it with
``PR_SET_PDEATHSIG``, but not those the raylet starts: its dashboard and runtime-env
agents notice the raylet's death, then spend a minute trying to tell the dead GCS, and
a driver killed outright leaves them behind that long. The session directory, with
Ray's logs and sockets, is never removed.

So :func:`~twinkle.cluster.init_ray` starts this script (by path, in isolated mode: it
imports only the standard library and psutil), detached in a session of its own (a
Ctrl-C to the terminal does not stop it before its work). It watches twice a second;
once the driver is gone (its pid and start time) or the raylet is (``ray.shutdown()``),
it kills what is left of the cluster: the processes the driver started, every process
the raylet started (its children, as seen while it ran: the agents are started with
it, and a killed raylet's children are no longer its own) and every process whose
environment names the raylet (``RAY_RAYLET_PID``: the workers; not the agents, whose
``setproctitle`` title overwrites the environment ``/proc`` shows), then removes the
session directory when asked to (one under twinkle's per-user runtime directory) and
exits.

Its one argument is a JSON object: ``driver`` and ``raylet`` (each ``[pid, start_ms]``),
``processes`` (``[[pid, start_ms], ...]``: the driver's and the raylet's at the start),
``session_dir`` (str, or null to keep it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

POLL_S = 0.5
GONE_WITHIN_S = 10.0
#: the raylet's children are listed at every poll of the first minute (it starts its
#: agents as it starts), then at every tenth (a listing reads every process's stat)
_CHILDREN_EVERY_POLL_S = 60.0
_CHILDREN_EVERY = 10


def _alive(pid: int, start_ms: int) -> psutil.Process | None:
    """The process ``pid`` if it runs and is the one that started at ``start_ms``."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if abs(int(proc.create_time() * 1000) - start_ms) > 1000:
            return None  # a reused pid
    except psutil.Error:
        return None
    return proc


def _raylets_children(raylet: int, raylet_start_ms: int) -> list[psutil.Process]:
    """Every process whose environment names the raylet (started after it)."""
    wanted = str(raylet)
    found = []
    for proc in psutil.process_iter(["pid", "create_time", "uids"]):
        try:
            if proc.info["uids"] is None or proc.info["uids"].real != os.getuid():
                continue
            if int(proc.info["create_time"] * 1000) < raylet_start_ms - 1000:
                continue
            if proc.environ().get("RAY_RAYLET_PID") == wanted:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _children(raylet: psutil.Process) -> dict[int, int]:
    """The raylet's processes now (``{pid: start_ms}``; none once it is gone)."""
    found = {}
    with contextlib.suppress(psutil.Error):
        for proc in raylet.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found[proc.pid] = int(proc.create_time() * 1000)
    return found


def _kill(procs: list[psutil.Process]) -> None:
    """SIGKILL: Ray's agents catch SIGTERM and then wait on the dead GCS. Waits until
    each is gone or a zombie (a killed agent is init's child: it reaps it, or, in a
    container whose pid 1 reaps nothing, never)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (procs := [p for p in procs if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _remove(session_dir: Path) -> None:
    """The link to the session directory first, then the directory: once the directory
    is gone, nothing points at it (the other order leaves a dangling link a moment)."""
    latest = session_dir.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) == session_dir:
            latest.unlink()
    shutil.rmtree(session_dir, ignore_errors=True)


def main(spec: dict[str, Any]) -> None:
    driver, driver_start_ms = (int(x) for x in spec["driver"])
    raylet, raylet_start_ms = (int(x) for x in spec["raylet"])
    known = {int(p): int(s) for p, s in spec["processes"]}
    started = time.monotonic()
    polls = 0
    while _alive(driver, driver_start_ms) and (proc := _alive(raylet, raylet_start_ms)):
        if polls % _CHILDREN_EVERY == 0 or time.monotonic() - started < _CHILDREN_EVERY_POLL_S:
            known.update(_children(proc))
        polls += 1
        time.sleep(POLL_S)
    if proc := _alive(raylet, raylet_start_ms):  # (the driver went first)
        known.update(_children(proc))
    left = {p.pid: p for pid, start in known.items() if (p := _alive(pid, start)) is not None}
    for p in _raylets_children(raylet, raylet_start_ms):
        left.setdefault(p.pid, p)
    _kill(list(left.values()))
    session_dir = spec.get("session_dir")
    if isinstance(session_dir, str):
        _remove(Path(session_dir))


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # (its work is to outlive the driver)
    spec = json.loads(sys.argv[1])
    # Detached: the driver waits for this first process only (no zombie, no handle to
    # keep), and the reaper itself is nobody's child.
    if os.fork() == 0:
        main(spec)
    os._exit(0)
