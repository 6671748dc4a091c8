"""twinkle.engines.ports: host-wide port reservation with stale-claim reclaim."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import orjson
import pytest

from twinkle.engines.ports import PortClaim, PortRegistry, PortReservationError, Reservation
from twinkle.errors import InvalidArgumentError, LockTimeoutError
from twinkle.locks import FileLock

# Private registries in these tests take ports below DEFAULT_PORT_RANGE: ports they bind
# (and the "foreign" sockets the tests bind) never collide with engines of concurrent
# runs, which reserve from the host-wide registry in the default range.
TEST_RANGE = (15000, 19999)


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def test_reserved_ports_are_bound_recorded_and_released(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=TEST_RANGE)
    with registry.reserve(3, label="engine-a") as res:
        assert len(set(res.ports)) == 3
        assert [s.getsockname() for s in res.sockets] == [("127.0.0.1", p) for p in res.ports]
        assert not any(_bindable(p) for p in res.ports)  # held: nobody can take them
        claims = registry.claims()
        assert sorted(c.port for c in claims) == sorted(res.ports)
        assert {(c.pid, c.label) for c in claims} == {(os.getpid(), "engine-a")}
        data = orjson.loads((tmp_path / "ports.json").read_bytes())
        assert len(data["claims"]) == 3
    assert res.released and res.sockets == ()
    assert registry.claims() == []
    assert all(_bindable(p) for p in res.ports)


def test_concurrent_reservations_never_share_a_port(tmp_path: Path) -> None:
    registries = [
        PortRegistry(tmp_path, port_range=TEST_RANGE) for _ in range(16)
    ]  # separate lock objects
    results: list[Reservation] = []
    barrier = threading.Barrier(16)

    def reserve(reg: PortRegistry) -> None:
        barrier.wait()
        results.append(reg.reserve(4))

    threads = [threading.Thread(target=reserve, args=(r,)) for r in registries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ports = [p for r in results for p in r.ports]
    assert len(ports) == 64 and len(set(ports)) == 64
    for res in results:
        res.release()


def test_a_port_bound_by_someone_else_is_never_handed_out(tmp_path: Path) -> None:
    base = _free_block(3)
    with socket.socket() as foreign:
        foreign.bind(("0.0.0.0", base + 1))  # not in the registry: only the bind test sees it
        registry = PortRegistry(tmp_path, port_range=(base, base + 2))
        res = registry.reserve(2)
        assert sorted(res.ports) == [base, base + 2]
        with pytest.raises(PortReservationError, match="port_range"):
            registry.reserve(1)
        res.release()


def test_contiguous_reservation_returns_consecutive_ports(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=TEST_RANGE)
    held = [registry.reserve(8, contiguous=True) for _ in range(5)]
    for res in held:
        assert list(res.ports) == list(range(res.ports[0], res.ports[0] + 8))
    assert len({c.port for c in registry.claims()}) == 40
    for res in held:
        res.release()


def test_contiguous_reservation_skips_a_hole(tmp_path: Path) -> None:
    base = _free_block(5)
    registry = PortRegistry(tmp_path, port_range=(base, base + 4))
    with socket.socket() as foreign:
        foreign.bind(("0.0.0.0", base + 1))
        with registry.reserve(3, contiguous=True) as res:
            assert res.ports == (base + 2, base + 3, base + 4)
            with pytest.raises(PortReservationError, match="consecutive"):
                registry.reserve(2, contiguous=True)


def test_stale_claims_of_a_killed_process_are_reclaimed(tmp_path: Path) -> None:
    base = _free_block(2)
    script = textwrap.dedent(
        """
        import sys, time
        from twinkle.engines.ports import PortRegistry
        registry = PortRegistry(sys.argv[1], port_range=(int(sys.argv[2]), int(sys.argv[2]) + 1))
        res = registry.reserve(2, label="doomed")
        res.close_sockets()  # like an engine that binds by number later
        print(*res.ports, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), str(base)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ports = [int(p) for p in proc.stdout.readline().split()]
    assert sorted(ports) == [base, base + 1]
    registry = PortRegistry(tmp_path, port_range=(base, base + 1))
    assert {c.pid for c in registry.claims()} == {proc.pid}
    with pytest.raises(PortReservationError):
        registry.reserve(1)  # both claimed by a live process although bindable
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    with registry.reserve(2) as res:  # reclaimed
        assert sorted(res.ports) == [base, base + 1]
        assert {c.label for c in registry.claims()} == {""}


def test_a_reused_pid_does_not_keep_a_claim_alive(tmp_path: Path) -> None:
    stale = PortClaim(
        port=20001,
        pid=os.getpid(),  # alive, but started at another time: a reused pid
        process_start_time_s=12345.0,
        reservation_id="x",
        label="old",
        reserved_unix_ns=0,
    )
    (tmp_path / "ports.json").write_bytes(orjson.dumps({"version": 1, "claims": [_as_dict(stale)]}))
    assert not stale.is_alive()
    assert PortRegistry(tmp_path, port_range=TEST_RANGE).claims() == []


def test_an_unreadable_registry_is_started_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "ports.json").write_bytes(b"{not json")
    registry = PortRegistry(tmp_path, port_range=TEST_RANGE)
    with registry.reserve(1) as res:
        assert "unreadable" in caplog.text
        assert [c.port for c in registry.claims()] == list(res.ports)


def test_registry_lock_timeout_names_the_lock_file(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=TEST_RANGE, lock_timeout_s=0.1)
    with FileLock("ports", directory=tmp_path):
        with pytest.raises(LockTimeoutError, match=r"ports\.lock"):
            registry.reserve(1)


def test_detached_fd_is_handed_to_a_child_that_serves_on_it(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=TEST_RANGE)
    with registry.reserve(1) as res:
        res.socket(0).listen()
        fd = res.detach_fd(0)
        script = (
            "import socket, sys; s = socket.socket(fileno=int(sys.argv[1])); "
            "c, _ = s.accept(); c.sendall(b'hi'); c.close()"
        )
        child = subprocess.Popen([sys.executable, "-c", script, str(fd)], pass_fds=(fd,))
        os.close(fd)
        with socket.create_connection(("127.0.0.1", res.ports[0]), timeout=10) as conn:
            assert conn.recv(2) == b"hi"
        assert child.wait(timeout=10) == 0
        assert res.sockets == ()
        with pytest.raises(InvalidArgumentError, match="detached"):
            res.socket(0)


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="port_range="):
        PortRegistry(tmp_path, port_range=(80, 90))
    registry = PortRegistry(tmp_path, port_range=(15000, 15009))
    with pytest.raises(InvalidArgumentError, match="count="):
        registry.reserve(11)
    with registry.reserve(1) as res, pytest.raises(InvalidArgumentError, match="index="):
        res.socket(3)


def _free_block(n: int) -> int:
    """A start port of ``n`` consecutive ports that are bindable right now."""
    for base in range(TEST_RANGE[0], TEST_RANGE[1] - n, 7):
        if all(_bindable(p, "0.0.0.0") for p in range(base, base + n)):
            return base
    raise RuntimeError("no free block")


def _as_dict(claim: PortClaim) -> dict[str, object]:
    return {f: getattr(claim, f) for f in claim.__dataclass_fields__}
