"""Host-wide port reservation: concurrent engine starts never race for a port.

The race being removed: an engine probes a free port (bind to port 0, read it, close
the socket) and binds it for real much later; a second engine starting meanwhile
probes the same port, and one of them dies with ``EADDRINUSE``. Serialising whole
engine start-ups under one global lock hides the race at the price of N-fold start-up.

Here only the *choice* of ports is serialised, by a short file lock around a JSON
registry of claims (port, owner pid, owner process start time). A port is handed out
only if no live claim names it and bind tests on the wildcard addresses succeed: the
IPv4 one (``0.0.0.0``) and, where the host has IPv6, the IPv6 one (``[::]``, IPv6 only),
so a port held on an IPv6 address alone (``[::1]``, a v6-only ``[::]``) is not handed
out either. The bound socket is kept open and can be handed over to the engine (inherited fd) so the
port is never free in between; an engine that insists on binding a number itself gets
the number, and the registry keeps other twinkle starts away from it until released.

Ports come from :data:`DEFAULT_PORT_RANGE`, below Linux's default ephemeral range
(32768-60999), so the kernel never hands them out for outgoing connections or
port-0 binds either.

The guarantee covers the processes that share one registry: keep the default
directory (the per-user runtime directory) for engines; a private directory only
coordinates its own users, and should then use a private ``port_range`` too. Software
that binds fixed numbers in the range without asking the registry can still collide
with a port reserved by number (not with a handed-over socket, which stays bound).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

import orjson
import psutil

from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.locks import FileLock

__all__ = [
    "DEFAULT_PORT_RANGE",
    "PortClaim",
    "PortRegistry",
    "PortReservationError",
    "Reservation",
]

_log = logging.getLogger(__name__)

DEFAULT_PORT_RANGE: Final[tuple[int, int]] = (20000, 32767)  # inclusive
_REGISTRY_VERSION: Final = 1
# psutil derives a start time from the boot time, which a wall-clock step can move;
# a pid reused within this window of the original's start is not a realistic case.
_START_TIME_TOLERANCE_S: Final = 1.0
# A port free on a family's wildcard is free on every address of that family.
_V4_WILDCARD: Final = "0.0.0.0"
_V6_WILDCARD: Final = "::"
# What binding an IPv6 socket fails with on a host without IPv6 (the kernel lacks it or
# it is disabled): the family is absent, not the port taken.
_NO_IPV6: Final = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})


class PortReservationError(TwinkleError, OSError):
    """No set of free ports could be found in the configured range."""


@dataclass(frozen=True, slots=True)
class PortClaim:
    """One registry entry: ``port`` is reserved by the process ``pid`` started at that time."""

    port: int
    pid: int
    process_start_time_s: float  # psutil create_time of the owner, guards against pid reuse
    reservation_id: str
    label: str  # caller's name for the user, e.g. the engine name
    reserved_unix_ns: int

    def is_alive(self) -> bool:
        """Whether the owning process still runs (same pid *and* same start time)."""
        return _process_alive(self.pid, self.process_start_time_s)


def _process_alive(pid: int, start_time_s: float) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started = float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # exists, owned by someone else: not ours to reclaim
    return abs(started - start_time_s) <= _START_TIME_TOLERANCE_S


@final
class Reservation:
    """Ports reserved for one engine; a context manager that releases them on exit.

    ``sockets[i]`` is bound to ``(host, ports[i])`` and kept open so the port cannot be
    taken in between. Hand it to the engine: ``listen()`` on it in-process, or pass its
    fd to a subprocess (``pass_fds``, :meth:`detach_fd`). For an engine that binds the
    number itself, :meth:`close_sockets` just before it starts; the registry entry keeps
    other twinkle starts off the port until :meth:`release`.
    """

    __slots__ = ("_owner_pid", "_registry", "_sockets", "host", "label", "ports", "reservation_id")

    def __init__(
        self,
        registry: PortRegistry,
        *,
        reservation_id: str,
        label: str,
        host: str,
        ports: tuple[int, ...],
        sockets: list[socket.socket | None],
    ) -> None:
        self._registry: PortRegistry | None = registry
        self._owner_pid = os.getpid()
        self._sockets = sockets
        self.reservation_id = reservation_id
        self.label = label
        self.host = host
        self.ports = ports

    @property
    def released(self) -> bool:
        return self._registry is None

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The bound sockets still held (closed or detached ones are left out)."""
        return tuple(s for s in self._sockets if s is not None)

    def socket(self, index: int = 0) -> socket.socket:
        """The bound socket for ``ports[index]``."""
        sock = self._sockets[self._check_index(index)]
        if sock is None:
            raise InvalidArgumentError(
                f"the socket for port {self.ports[index]} (index={index!r}) was already closed "
                "or detached; take sockets before close_sockets()/detach_fd()"
            )
        return sock

    def detach_fd(self, index: int = 0) -> int:
        """Give up ownership of the socket for ``ports[index]`` and return its fd.

        The caller now owns the fd (e.g. passes it with ``pass_fds`` and then
        ``os.close``-es it); the port stays reserved in the registry until release.
        """
        fd = self.socket(index).detach()
        self._sockets[index] = None
        return fd

    def close_sockets(self, *indices: int) -> None:
        """Close the held sockets (all, or those of ``indices``); the claims stay."""
        for i in indices or range(len(self._sockets)):
            sock = self._sockets[self._check_index(i)]
            if sock is not None:
                sock.close()
                self._sockets[i] = None

    def release(self) -> None:
        """Close the sockets and remove the claims from the registry. Idempotent.

        In a forked child that inherited this object only the sockets are closed: the
        claims belong to the process that made them.
        """
        self.close_sockets()
        registry, self._registry = self._registry, None
        if registry is not None and os.getpid() == self._owner_pid:
            registry.release(self.reservation_id)

    close = release

    def _check_index(self, index: int) -> int:
        if not 0 <= index < len(self.ports):
            raise InvalidArgumentError(
                f"index={index!r} is out of range for a reservation of {len(self.ports)} port(s)"
            )
        return index

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"Reservation(label={self.label!r}, host={self.host!r}, ports={self.ports}, {state})"


@final
class PortRegistry:
    """The host-wide registry of reserved ports (``<directory>/ports.json`` + its lock).

    Every process that uses the same directory (default: the per-user runtime
    directory) sees the same claims. The file lock is held only while claims are read,
    stale ones (dead owners) dropped, ports chosen and the file rewritten: milliseconds,
    never an engine start-up.
    """

    __slots__ = ("_ipv6", "_lock", "_random", "path", "port_range")

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
        lock_timeout_s: float | None = 30.0,
        name: str = "ports",
    ) -> None:
        low, high = port_range
        if not (isinstance(low, int) and isinstance(high, int) and 1024 <= low <= high <= 65535):
            raise InvalidArgumentError(
                f"port_range={port_range!r} must be (low, high) with 1024 <= low <= high <= 65535"
            )
        self._lock = FileLock(name, directory=directory, timeout_s=lock_timeout_s)
        self.path: Path = self._lock.path.with_name(f"{name}.json")
        self.port_range = (low, high)
        self._random = random.Random(os.urandom(16))
        self._ipv6: bool | None = None  # whether the host has IPv6; found at first use

    def reserve(
        self,
        count: int = 1,
        *,
        label: str = "",
        host: str = "127.0.0.1",
        contiguous: bool = False,
    ) -> Reservation:
        """Reserve ``count`` ports nobody on this host uses or has reserved.

        ``host`` is the address the kept sockets are bound to (the address the engine
        will serve on; an IPv6 one such as ``"::1"`` gets IPv6 sockets); the bind tests
        also check the wildcard addresses of both families. ``contiguous``
        asks for ``count`` consecutive ports (for engines that scan upward from a base
        port, e.g. vLLM's ``VLLM_PORT``).
        """
        low, high = self.port_range
        if not isinstance(count, int) or not 1 <= count <= high - low + 1:
            raise InvalidArgumentError(
                f"count={count!r} must be an int between 1 and the size of port_range "
                f"{self.port_range} ({high - low + 1})"
            )
        reservation_id = uuid.uuid4().hex
        with self._lock:
            claims = self._load_live_claims()
            taken = {c.port for c in claims}
            chosen = self._choose(count, taken, host, contiguous)
            me = psutil.Process()
            now = time.time_ns()
            start_time = float(me.create_time())
            claims.extend(
                PortClaim(
                    port=port,
                    pid=me.pid,
                    process_start_time_s=start_time,
                    reservation_id=reservation_id,
                    label=label,
                    reserved_unix_ns=now,
                )
                for port, _ in chosen
            )
            try:
                self._store(claims)
            except BaseException:
                for _, sock in chosen:
                    sock.close()
                raise
        return Reservation(
            self,
            reservation_id=reservation_id,
            label=label,
            host=host,
            ports=tuple(p for p, _ in chosen),
            sockets=[s for _, s in chosen],
        )

    def release(self, reservation_id: str) -> None:
        """Drop every claim of ``reservation_id`` (use :meth:`Reservation.release`)."""
        with self._lock:
            claims = self._load_live_claims()
            kept = [c for c in claims if c.reservation_id != reservation_id]
            if len(kept) != len(claims):
                self._store(kept)

    def claims(self) -> list[PortClaim]:
        """The live claims (stale ones of dead processes are dropped on the way)."""
        with self._lock:
            return self._load_live_claims(store=True)

    def _load_live_claims(self, *, store: bool = False) -> list[PortClaim]:
        everything = self._load()
        alive: dict[tuple[int, float], bool] = {}
        for c in everything:
            key = (c.pid, c.process_start_time_s)
            if key not in alive:
                alive[key] = _process_alive(*key)
        live = [c for c in everything if alive[(c.pid, c.process_start_time_s)]]
        if len(live) != len(everything):
            stale = sorted(
                {(c.pid, c.label) for c in everything} - {(c.pid, c.label) for c in live}
            )
            _log.info("reclaimed stale port claims of dead processes %s in %s", stale, self.path)
            if store:
                self._store(live)
        return live

    def _choose(
        self, count: int, taken: set[int], host: str, contiguous: bool
    ) -> list[tuple[int, socket.socket]]:
        if self._ipv6 is None:
            self._ipv6 = _has_ipv6()
        low, high = self.port_range
        size = high - low + 1
        # A random starting point spreads concurrent reservers over the range.
        offset = self._random.randrange(size)
        order = [low + (offset + k) % size for k in range(size)]
        chosen = (
            self._choose_block(count, taken, host, order)
            if contiguous
            else self._choose_any(count, taken, host, order)
        )
        if chosen is None:
            what = f"{count} consecutive free port(s)" if contiguous else f"{count} free port(s)"
            raise PortReservationError(
                f"no {what} in port_range {self.port_range} ({len(taken)} reserved in "
                f"{str(self.path)!r}, the rest in use or not bindable on {host!r}); "
                "widen port_range or release reservations"
            )
        return chosen

    def _choose_any(
        self, count: int, taken: set[int], host: str, order: list[int]
    ) -> list[tuple[int, socket.socket]] | None:
        chosen: list[tuple[int, socket.socket]] = []
        for port in order:
            sock = None if port in taken else self._try_bind(host, port)
            if sock is not None:
                chosen.append((port, sock))
                if len(chosen) == count:
                    return chosen
        _close_all(s for _, s in chosen)
        return None

    def _choose_block(
        self, count: int, taken: set[int], host: str, order: list[int]
    ) -> list[tuple[int, socket.socket]] | None:
        high = self.port_range[1]
        unusable = set(taken)
        for start in order:
            block = range(start, start + count)
            if block[-1] > high or not unusable.isdisjoint(block):
                continue
            chosen: list[tuple[int, socket.socket]] = []
            for port in block:
                sock = self._try_bind(host, port)
                if sock is None:
                    unusable.add(port)
                    break
                chosen.append((port, sock))
            if len(chosen) == count:
                return chosen
            _close_all(s for _, s in chosen)
        return None

    def _try_bind(self, host: str, port: int) -> socket.socket | None:
        """A socket bound to ``(host, port)`` if no address of either family holds
        ``port``; else None."""
        ipv6_host = ":" in host
        try:
            # Free on the wildcards means no address holds it; then bind the real one.
            # (A family's probe is the real bind itself when host is its wildcard.)
            if host not in (_V4_WILDCARD, ""):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                    probe.bind((_V4_WILDCARD, port))
            if self._ipv6 and host != _V6_WILDCARD:
                with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                    # v6 only: IPv4 has its probe above, and what this one tests must
                    # not depend on the host's default (net.ipv6.bindv6only).
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    probe.bind((_V6_WILDCARD, port))
            sock = socket.socket(socket.AF_INET6 if ipv6_host else socket.AF_INET)
        except OSError:
            return None
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            return None
        return sock

    def _load(self) -> list[PortClaim]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            data: Any = orjson.loads(raw)
            return [PortClaim(**c) for c in data["claims"]]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            # Bind tests still protect ports in use; only not-yet-bound claims are lost.
            _log.warning("port registry %s is unreadable (%s); starting it afresh", self.path, exc)
            return []

    def _store(self, claims: Sequence[PortClaim]) -> None:
        data = {"version": _REGISTRY_VERSION, "claims": [asdict(c) for c in claims]}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            f.write(orjson.dumps(data))
        os.replace(tmp, self.path)  # readers see the old or the new file, never half of one

    def __repr__(self) -> str:
        return f"PortRegistry({str(self.path)!r}, port_range={self.port_range})"


def _has_ipv6() -> bool:
    """Whether this host can bind IPv6 sockets (Python built with it, kernel has it)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((_V6_WILDCARD, 0))
    except OSError as exc:
        if exc.errno in _NO_IPV6:
            _log.info("this host has no IPv6 (%s): ports are probed on IPv4 only", exc)
            return False
        raise
    return True


def _close_all(socks: Iterable[socket.socket]) -> None:
    for s in socks:
        s.close()
