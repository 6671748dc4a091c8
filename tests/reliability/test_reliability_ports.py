"""Port reservation against ports held by other software, with real sockets.

A port held on either address family (IPv4, IPv6 only, dual stack) is never handed out;
a host without IPv6 only loses the IPv6 probe. Every socket here is bound to a loopback
or wildcard address on a port the kernel chose (``bind(..., 0)``), so the tests take no
port another test could want, and each is closed by its test.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from twinkle.engines.ports import PortRegistry, PortReservationError


def _v6_socket(*, v6only: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    return sock


def _ipv6_loopback_reason() -> str | None:
    """Why IPv6 tests cannot run here, or None."""
    if not socket.has_ipv6:
        return "Python was built without IPv6 (socket.has_ipv6 is false)"
    try:
        with closing(_v6_socket(v6only=True)) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return f"cannot bind [::1] on this host: {exc}"
    return None


needs_ipv6 = pytest.mark.skipif(
    _ipv6_loopback_reason() is not None, reason=str(_ipv6_loopback_reason())
)


def _free(port: int) -> bool:
    """Whether ``port`` can be bound on both loopbacks right now."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def _held(family: socket.AddressFamily, host: str, *, v6only: bool = True) -> socket.socket:
    """A listening socket on ``host`` and a port the kernel picked: foreign software."""
    sock = (
        _v6_socket(v6only=v6only)
        if family == socket.AF_INET6
        else socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    )
    sock.bind((host, 0))
    sock.listen()
    return sock


@pytest.fixture
def holders() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def _only(port: int, tmp_path: Path) -> PortRegistry:
    """A private registry whose range is the one port ``port``."""
    return PortRegistry(tmp_path, port_range=(port, port))


HOLDERS = [
    pytest.param(socket.AF_INET6, "::1", True, id="[::1]", marks=needs_ipv6),
    pytest.param(socket.AF_INET6, "::", True, id="[::]-v6only", marks=needs_ipv6),
    pytest.param(socket.AF_INET6, "::", False, id="[::]-dual-stack", marks=needs_ipv6),
    pytest.param(socket.AF_INET, "127.0.0.1", True, id="127.0.0.1"),
    pytest.param(socket.AF_INET, "0.0.0.0", True, id="0.0.0.0"),
]


@pytest.mark.parametrize(("family", "host", "v6only"), HOLDERS)
@pytest.mark.parametrize("reserve_on", ["127.0.0.1", "0.0.0.0"])
def test_port_held_on_any_address_family_is_not_handed_out(
    tmp_path: Path,
    holders: list[socket.socket],
    family: socket.AddressFamily,
    host: str,
    v6only: bool,
    reserve_on: str,
) -> None:
    holder = _held(family, host, v6only=v6only)
    holders.append(holder)
    port = holder.getsockname()[1]
    registry = _only(port, tmp_path)
    with pytest.raises(PortReservationError, match=rf"no 1 free port\(s\) in port_range \({port}"):
        registry.reserve(host=reserve_on)
    holder.close()  # the only reason it was refused: now it is free
    with registry.reserve(host=reserve_on) as res:
        assert res.ports == (port,)


@needs_ipv6
def test_contiguous_block_skips_a_port_held_on_ipv6_only(
    tmp_path: Path, holders: list[socket.socket]
) -> None:
    # Three consecutive ports the kernel gave us (retry until they are consecutive),
    # the middle one held on [::1] only: no block of 2 fits, a block of 1 is the first.
    for _ in range(50):
        first = _held(socket.AF_INET, "127.0.0.1")
        base = first.getsockname()[1]
        first.close()
        if base + 2 > 65535 or not _free(base + 2):
            continue  # the third port is someone else's (another test's server): again
        try:
            middle = _v6_socket(v6only=True)
            middle.bind(("::1", base + 1))
        except OSError:
            middle.close()
            continue
        middle.listen()
        holders.append(middle)
        break
    else:
        pytest.skip("found no free port with a free neighbour to hold")
    registry = PortRegistry(tmp_path, port_range=(base, base + 2))
    with pytest.raises(PortReservationError, match="consecutive"):
        registry.reserve(2, contiguous=True)
    with registry.reserve(2) as res:
        assert sorted(res.ports) == [base, base + 2]


@needs_ipv6
def test_reservation_on_an_ipv6_host_keeps_an_ipv6_socket(tmp_path: Path) -> None:
    probe = _held(socket.AF_INET6, "::1")
    port = probe.getsockname()[1]
    probe.close()
    registry = _only(port, tmp_path)
    with registry.reserve(host="::1", label="v6-engine") as res:
        sock = res.socket()
        assert sock.family == socket.AF_INET6
        assert sock.getsockname()[:2] == ("::1", port)
        # held: a second reservation finds nothing (the claim and the bind both say so)
        with pytest.raises(PortReservationError):
            PortRegistry(tmp_path / "other", port_range=(port, port)).reserve(host="::1")


@needs_ipv6
def test_host_without_ipv6_probes_ipv4_only_and_still_reserves(
    tmp_path: Path, holders: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a Python built without IPv6 sees: the IPv6 probe is skipped, not failed. (A
    # port held on [::1] is then invisible: such a host cannot have one.)
    holder = _held(socket.AF_INET6, "::1")
    holders.append(holder)
    port = holder.getsockname()[1]
    monkeypatch.setattr(socket, "has_ipv6", False)
    with _only(port, tmp_path).reserve() as res:
        assert res.ports == (port,)
        assert res.socket().family == socket.AF_INET
