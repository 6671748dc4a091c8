"""Ray: :func:`init_ray` (a local cluster on 127.0.0.1 only) and ``RayCluster``, the
resources of the Ray cluster this process is connected to."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from twinkle.cluster._resources import (
    ClusterResources,
    RayNotInstalledError,
    check_workers,
)
from twinkle.errors import ConfigError, InvalidArgumentError

__all__ = [
    "LOOPBACK_ENV",
    "RAY_DEVICE_TYPES",
    "RayCluster",
    "check_loopback",
    "import_ray",
    "init_ray",
]

#: Ray accelerator resource names -> torch device types.
RAY_DEVICE_TYPES = {"GPU": "cuda", "NPU": "npu", "HPU": "hpu", "TPU": "tpu"}
# Ray's bookkeeping entries, not resources a run schedules on.
_NOT_CUSTOM = ("CPU", "memory", "object_store_memory")
_NOT_CUSTOM_PREFIXES = ("node:", "accelerator_type:")


def import_ray() -> Any:
    """``ray``, or :class:`RayNotInstalledError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise RayNotInstalledError(
            "Ray is not installed; install the extra: pip install 'twinkle[ray]'"
        ) from exc
    return ray


LOOPBACK = "127.0.0.1"
#: Ray's own switch: false makes a local cluster bind and advertise the loopback address.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def init_ray(address: str | None = None, **init_kwargs: Any) -> Any:
    """Start (or join) Ray for this process; returns the ``ray`` module.

    ``address`` ``None`` or ``"local"`` starts a **local cluster bound to 127.0.0.1
    only**. Ray does not honour ``_node_ip_address="127.0.0.1"`` for a local cluster:
    the node, its raylet and the GCS still bind and advertise the host's network
    interface. Ray's own switch does it: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    (``ray_constants.ENABLE_RAY_CLUSTER`` false) a local node uses the loopback
    address. The variable is set in ``os.environ`` before ``ray.init`` (the processes
    Ray starts inherit it and read it at import), and the constant of an
    already-imported ``ray`` is set to match, so the order of imports does not matter.
    The cluster that comes up is checked: :class:`~twinkle.errors.ConfigError` if the
    node or any node's ``NodeManagerAddress`` is not 127.0.0.1 (it is shut down first).

    **A local cluster does not outlive its driver.** Ray kills the processes the driver
    starts when it dies, not the agents its raylet starts (a driver killed outright left
    them a minute), and never removes its session directory. So a small reaper process
    (:mod:`twinkle.cluster._ray_reaper`) watches the driver and the raylet: once either
    is gone it kills what is left of the cluster and removes the session directory. That
    directory is under twinkle's per-user runtime directory
    (:func:`twinkle.locks.runtime_dir`, mode 0700; Ray's own default, ``$TMPDIR/ray``,
    is world-writable), in ``ray/``, made 0700 too; session directories of drivers no
    longer running are removed there as a new cluster starts. A caller's ``_temp_dir``
    (or ``RAY_TMPDIR``) is used as given, and its session directories are kept.

    Any other ``address`` (``"auto"``, ``"ray://host:10001"``, ``"10.0.0.1:6379"``) is
    a cluster the caller chose: ``ray.init(address=address, **init_kwargs)`` runs
    unchanged and the environment is left alone.

    ``ray.init`` sets SIGTERM to ``sys.exit(15)`` in the main thread, whatever handled it
    before; a handler that was not the default one (:func:`twinkle.run.finish_on_signals`,
    the caller's own) is set back once Ray is up, so a ``kill`` still ends the run as
    that handler does.
    """
    ray = import_ray()
    with _sigterm_kept():
        return _init(ray, address, init_kwargs)


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """SIGTERM's handler set back after the block when it was not the default one (in
    the main thread: signals are handled there only)."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if before is not None and before not in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, before)


def _init(ray: Any, address: str | None, init_kwargs: dict[str, Any]) -> Any:
    if address not in (None, "local"):
        ray.init(address=address, **init_kwargs)
        return ray
    os.environ.update(LOOPBACK_ENV)
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    ours = "_temp_dir" not in init_kwargs and not os.environ.get("RAY_TMPDIR")
    if ours:
        init_kwargs["_temp_dir"] = str(_ray_temp_dir())
    ray.init(address="local", **init_kwargs)
    try:
        _start_reaper(ray, remove_session=ours)
        if ours:
            _make_private(ray)
        check_loopback(ray)
    except BaseException:
        ray.shutdown()
        raise
    return ray


#: Ray's longest socket path below its temp dir: /session_<date>_<time>_<us>_<pid>/sockets/
#: plasma_store (a pid of up to 7 digits)
_SOCKET_TAIL = len("/session_2024-01-01_00-00-00_000000_1234567/sockets/plasma_store")
_AF_UNIX_MAX = 107


def _ray_temp_dir() -> Path:
    """``<runtime dir>/ray`` (0700), cleared of dead drivers' session directories."""
    from twinkle.locks import process_alive, runtime_dir

    temp = runtime_dir() / "ray"
    if len(str(temp)) + _SOCKET_TAIL > _AF_UNIX_MAX:
        raise ConfigError(
            f"Ray's temp dir {str(temp)!r} is too long for the unix sockets Ray puts in it "
            f"({_AF_UNIX_MAX} bytes at most): set TWINKLE_RUNTIME_DIR to a shorter "
            "directory, or pass init_ray(_temp_dir=...)"
        )
    temp.mkdir(mode=0o700, exist_ok=True)
    os.chmod(temp, 0o700)
    for session in temp.glob("session_*_*"):
        pid = session.name.rsplit("_", 1)[-1]
        if pid.isdigit() and not session.is_symlink() and not process_alive(int(pid)):
            shutil.rmtree(session, ignore_errors=True)  # its driver and reaper were killed
    return temp


def _local_node(ray: Any) -> Any:
    """The node this process started (Ray's ``ray._private.worker._global_node``), None
    when there is none to look after (a stand-in ``ray`` module)."""
    return getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)


def _make_private(ray: Any) -> None:
    """Ray makes its directories world-writable (0777); ours are the user's alone."""
    node = _local_node(ray)
    if node is None:
        return
    session = Path(node.get_session_dir_path())
    for path in (session.parent, session):
        os.chmod(path, 0o700)


def _start_reaper(ray: Any, *, remove_session: bool) -> None:
    """Start the reaper of the local cluster this process just started (see
    :func:`init_ray`): it ends the cluster once this process or the raylet is gone."""
    import psutil

    node = _local_node(ray)
    if node is None:
        return

    def started(proc: Any) -> list[int]:
        pid = int(proc.process.pid)
        return [pid, int(psutil.Process(pid).create_time() * 1000)]

    processes = [started(p) for procs in node.all_processes.values() for p in procs]
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for child in raylet.children(recursive=True):  # its agents (and idle workers)
        with contextlib.suppress(psutil.Error):
            processes.append([child.pid, int(child.create_time() * 1000)])
    spec = {
        "driver": [os.getpid(), int(psutil.Process().create_time() * 1000)],
        "raylet": started(node.all_processes["raylet"][0]),
        "processes": processes,
        "session_dir": node.get_session_dir_path() if remove_session else None,
    }
    script = Path(__file__).with_name("_ray_reaper.py")
    # Its own session: a Ctrl-C or a signal to the driver's process group does not stop
    # it before its work; no pipe of the driver's held open (a reader would wait on it).
    # The script forks the reaper off and returns: the reaper runs once this returns.
    subprocess.run(
        [sys.executable, "-I", str(script), json.dumps(spec)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        check=True,
        timeout=60,
    )


def check_loopback(ray: Any) -> None:
    """:class:`~twinkle.errors.ConfigError` unless this process's Ray node and every
    node of the cluster are on 127.0.0.1."""
    addresses = {"ray.util.get_node_ip_address()": ray.util.get_node_ip_address()}
    for node in ray.nodes():
        addresses[f"node {node.get('NodeID', '?')} NodeManagerAddress"] = node.get(
            "NodeManagerAddress"
        )
    wrong = {where: ip for where, ip in addresses.items() if ip != LOOPBACK}
    if wrong:
        raise ConfigError(
            f"the local Ray cluster is not on loopback only: {wrong}; a local cluster must "
            f"bind {LOOPBACK} (test and demo traffic stays on this machine). Start it with "
            "twinkle.cluster.init_ray(), which sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
            "before ray.init, or set that variable in the environment before importing ray"
        )


class RayCluster:
    """The Ray cluster this process is connected to (``ray.init`` must have run).

    Nodes are the live nodes of ``ray.nodes()``; CPUs, devices (Ray's ``GPU`` is counted
    as ``cuda``, see :data:`RAY_DEVICE_TYPES`) and custom resources come from
    ``ray.cluster_resources()``.

    :param workers: ``{role: count}`` the caller knows.
    :param actor_roles: ``{role: name prefix}``: also count live named actors whose
        name starts with the prefix (e.g. ``{"rollout": "rollout-"}``), added to
        ``workers``.
    :param namespace: count named actors of this namespace only (default: all).
    """

    __slots__ = ("_actor_roles", "_namespace", "_workers")

    def __init__(
        self,
        *,
        workers: Mapping[str, int] | None = None,
        actor_roles: Mapping[str, str] | None = None,
        namespace: str | None = None,
    ) -> None:
        self._workers = check_workers(workers)
        roles = dict(actor_roles or {})
        for role, prefix in roles.items():
            if not isinstance(role, str) or not role or not isinstance(prefix, str) or not prefix:
                raise InvalidArgumentError(
                    f"actor_roles must map role names to non-empty actor name prefixes, got "
                    f"{role!r}: {prefix!r}"
                )
        self._actor_roles = roles
        self._namespace = namespace
        import_ray()  # fail at construction, where the fix is obvious

    def resources(self) -> ClusterResources:
        """Read the cluster's resources now."""
        ray = import_ray()
        if not ray.is_initialized():
            raise ConfigError(
                "Ray is not initialised in this process; call ray.init(address=...) first"
            )
        nodes = sum(1 for node in ray.nodes() if node.get("Alive", False))
        total: dict[str, float] = dict(ray.cluster_resources())
        devices: dict[str, int] = {}
        custom: dict[str, float] = {}
        for key, amount in total.items():
            if key in RAY_DEVICE_TYPES:
                devices[RAY_DEVICE_TYPES[key]] = int(amount)
            elif key not in _NOT_CUSTOM and not key.startswith(_NOT_CUSTOM_PREFIXES):
                custom[key] = float(amount)
        workers = dict(self._workers)
        if self._actor_roles:
            for role, count in self._count_actors(ray).items():
                workers[role] = workers.get(role, 0) + count
        return ClusterResources(
            nodes=nodes,
            cpus=int(total.get("CPU", 0)),
            devices={k: v for k, v in devices.items() if v > 0},
            workers=workers,
            custom=custom,
        )

    def _count_actors(self, ray: Any) -> dict[str, int]:
        from ray.util import list_named_actors

        counts = dict.fromkeys(self._actor_roles, 0)
        for entry in list_named_actors(all_namespaces=True):
            if self._namespace is not None and entry.get("namespace") != self._namespace:
                continue
            name = str(entry.get("name", ""))
            for role, prefix in self._actor_roles.items():
                if name.startswith(prefix):
                    counts[role] += 1
        return counts
