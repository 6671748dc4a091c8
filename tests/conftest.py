"""Shared fixtures.

``ray_cluster``: one local Ray cluster per pytest run (2 CPUs on 127.0.0.1, no dashboard,
one custom resource ``twinkle_test_slot: 3``), shut down at the end of the session. Tests
that need Ray take this fixture; it skips them when ray is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

RAY_TEST_RESOURCES = {"twinkle_test_slot": 3}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        pytest.skip("ray is not installed (install the extra: pip install 'twinkle[ray]')")
    if ray.is_initialized():  # someone else's cluster: use it, leave it running
        yield ray
        return
    # A throwaway test cluster: no token set-up (it writes ~/.ray/auth_token), no
    # usage-stats prompt.
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        ray.init(
            address="local",
            num_cpus=2,
            resources=RAY_TEST_RESOURCES,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
