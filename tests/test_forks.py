"""The one after-fork registry: each registered function runs once in a forked child,
in the order registered; registering one again changes nothing; the parent runs none."""

from __future__ import annotations

import os

import pytest

from twinkle import forks

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_a_forked_child_calls_each_registered_function_once_in_order() -> None:
    called: list[str] = []
    first, second = (lambda: called.append("first")), (lambda: called.append("second"))
    forks.forget_in_child(first)
    forks.forget_in_child(second)
    forks.forget_in_child(first)  # (again: still once, still first)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what ran, then leave without the parent's atexit
        try:
            os.write(write, ",".join(c for c in called if c in ("first", "second")).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        in_child = pipe.read().decode()
    os.waitpid(pid, 0)
    assert in_child == "first,second"
    assert called == []  # the parent forgets nothing
