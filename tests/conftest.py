"""Shared fixtures.

``ray_cluster``: one local Ray cluster per pytest run (2 CPUs, no dashboard, one custom
resource ``twinkle_test_slot: 3``), started by :func:`twinkle.cluster.init_ray` so that it
binds 127.0.0.1 only, and shut down at the end of the session. The fixture asserts that
the node and every node's ``NodeManagerAddress`` are 127.0.0.1: test traffic never
leaves loopback, and no later change can quietly start Ray on another address. Tests that
need Ray take this fixture; it skips them when ray is not installed.

``stand_in``: a stand-in vLLM server on 127.0.0.1 (:mod:`_vllm_stand_in`), stopped
after the test.

Every checkpoint a test's run writes in this process is read back as a resume reads
it (``_checkpoints_read_back``): a class of the observers' state that the checkpoint's
unpickler does not make (its allow-list, :mod:`twinkle.run._state_pickle`) would make
every resume of such a run feed its whole log, with right figures and nothing failing.

Ctrl-C and a hang-up reach the processes the tests start: a shell starts a background
job (``make test &``, some CI runners) with SIGINT ignored, ``nohup`` with SIGHUP
ignored, every child inherits that, and Python then keeps it ignored; the tests that
send those signals would wait in vain. So this process handles them again
(:func:`twinkle.testing.handle_stop_signals`: its children start with both at their
defaults).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from _vllm_stand_in import StandIn, serve
from twinkle.run._checkpoint import write as write_checkpoint
from twinkle.run._state_pickle import read_state
from twinkle.testing import handle_stop_signals

RAY_TEST_RESOURCES = {"twinkle_test_slot": 3}

handle_stop_signals()


@pytest.fixture(autouse=True)
def _checkpoints_read_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    unreadable: list[str] = []

    def read_back_then_write(out_dir: Any, checkpoint: Any) -> None:
        try:
            read_state(io.BytesIO(checkpoint.payload))
        except Exception as exc:  # (the run logs a checkpoint it cannot write, and goes on)
            unreadable.append(f"{out_dir}: {type(exc).__name__}: {exc}")
        write_checkpoint(out_dir, checkpoint)

    monkeypatch.setattr("twinkle.run._checkpointing.write_checkpoint", read_back_then_write)
    yield
    assert not unreadable, f"checkpoints a resume could not read back: {unreadable}"


def assert_ray_on_loopback(ray: Any) -> None:
    """Fail, saying why, unless this process's Ray node and every node are 127.0.0.1."""
    addresses = {"ray.util.get_node_ip_address()": ray.util.get_node_ip_address()}
    for node in ray.nodes():
        addresses[f"node {node['NodeID'][:8]} NodeManagerAddress"] = node["NodeManagerAddress"]
    wrong = {where: ip for where, ip in addresses.items() if ip != "127.0.0.1"}
    assert not wrong, (
        f"the test Ray cluster is not on loopback: {wrong}. Test traffic must stay on "
        "127.0.0.1: start Ray with twinkle.cluster.init_ray() (it sets "
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before ray.init; Ray ignores "
        "_node_ip_address='127.0.0.1' for a local cluster)"
    )


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        pytest.skip("ray is not installed (install the extra: pip install 'twinkle[ray]')")
    from twinkle.cluster import LOOPBACK_ENV, init_ray

    if ray.is_initialized():  # someone else's cluster: use it (it too must be loopback)
        assert_ray_on_loopback(ray)
        yield ray
        return
    # A throwaway test cluster on loopback: no token set-up (it writes
    # ~/.ray/auth_token), no usage-stats reporting.
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **LOOPBACK_ENV}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        init_ray(
            num_cpus=2,
            resources=RAY_TEST_RESOURCES,
            include_dashboard=False,
            log_to_driver=False,
        )
        assert_ray_on_loopback(ray)
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    with serve() as server:
        yield server
