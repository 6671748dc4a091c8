"""Engines that run as a child process group: launch, wait until ready, stop for good.

The child starts a new session, so its whole process tree (e.g. vLLM's workers) is one
process group that :meth:`SubprocessEngine.shutdown` terminates, then kills, so nothing
is left running. Readiness is a caller-supplied check polled while the child lives;
the wait honours the pool's cancellation and start timeout.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final, final

from twinkle.engines.pool import StartContext
from twinkle.engines.ports import Reservation
from twinkle.errors import EngineStartError

__all__ = ["ReadyCheck", "SubprocessEngine", "launch_subprocess", "wait_for_line"]

ReadyCheck = Callable[["SubprocessEngine", float], bool]
"""``check(engine, timeout_s)``: wait up to ``timeout_s`` for readiness; True once ready."""

_POLL_S: Final = 0.05
_KILL_REAP_S: Final = 1.0  # SIGKILL takes effect at once; a child in D state is left
_STDERR_TAIL_BYTES: Final = 4000


@final
class SubprocessEngine:
    """A running child process (group) serving as an engine; satisfies ``Engine``."""

    __slots__ = (
        "_name",
        "_stderr",
        "_stopped",
        "log_path",
        "process",
        "ready_line",
        "reservation",
        "stop_timeout_s",
    )

    def __init__(
        self,
        name: str,
        process: subprocess.Popen[bytes],
        *,
        reservation: Reservation | None = None,
        log_path: Path | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self._name = name
        self.process = process
        self.reservation = reservation
        self.log_path = log_path
        self.stop_timeout_s = stop_timeout_s
        self.ready_line: str | None = None  # set by wait_for_line
        self._stderr = None if process.stderr is None else _TailReader(process.stderr, name)
        self._stopped = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ports(self) -> tuple[int, ...]:
        """The reserved ports of this engine (empty without a reservation)."""
        return () if self.reservation is None else self.reservation.ports

    def shutdown(self) -> None:
        """Stop the process group (stdin EOF, SIGTERM, then SIGKILL) and release the ports.

        Idempotent. Returns once the child is reaped and its group is gone.
        """
        if self._stopped:
            return
        self._stopped = True
        proc = self.process
        try:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            # Sweep what the child left in its group (e.g. workers that ignored SIGTERM).
            _signal_group(proc.pid, signal.SIGKILL)
            if self._stderr is not None:
                self._stderr.join(timeout=1.0)
            if proc.stdout is not None:
                proc.stdout.close()
        finally:
            if self.reservation is not None:
                self.reservation.release()

    def kill(self) -> None:
        """SIGKILL the whole process group now and release the ports.

        For when :meth:`shutdown` hangs (the pool calls it after ``shutdown_timeout_s``);
        safe while :meth:`shutdown` runs on another thread, which then returns promptly.
        Waits up to a second for the child to be reaped.
        """
        _signal_group(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_KILL_REAP_S)
        if self.reservation is not None:
            self.reservation.release()

    def _failure(self, what: str) -> EngineStartError:
        rc = self.process.poll()
        detail = f"exit status {rc}" if rc is not None else "still running"
        tail = ""
        if self._stderr is not None:
            if rc is not None:
                _signal_group(self.pid, signal.SIGKILL)  # nothing else may hold the pipe open
                self._stderr.join(timeout=1.0)
            tail = self._stderr.tail()
        where = f"; its log: {str(self.log_path)!r}" if self.log_path is not None else ""
        said = f"; it said: {tail}" if tail else ""
        return EngineStartError(
            f"engine {self._name!r} (pid {self.pid}) {what} ({detail}){said}{where}"
        )

    def __repr__(self) -> str:
        return f"SubprocessEngine({self._name!r}, pid={self.pid}, ports={self.ports})"


def launch_subprocess(
    ctx: StartContext,
    argv: Sequence[str],
    *,
    ready: ReadyCheck,
    env: Mapping[str, str] | None = None,
    reservation: Reservation | None = None,
    pass_fds: Sequence[int] = (),
    log_path: Path | None = None,
    capture_stdout: bool = False,
    stop_timeout_s: float = 10.0,
) -> SubprocessEngine:
    """Start ``argv`` as engine ``ctx.name`` and return it once ``ready`` says so.

    ``env`` is the child's complete environment (``None``: inherit ours). stdin is a
    pipe whose EOF tells the child its parent is gone. stderr (and stdout unless
    captured) goes to ``log_path`` if given, else stderr is drained by a thread that
    keeps its tail for the error message. The engine owns ``reservation``: the parent's
    copies of its sockets are closed once the child has started (pass the ones the
    child needs in ``pass_fds``), and it is released on shutdown or on any failure.
    """
    log: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
    try:
        process = subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if capture_stdout else log,
            stderr=subprocess.PIPE if log is None else subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )
    except BaseException:
        if reservation is not None:
            reservation.release()
        raise
    finally:
        if log is not None:
            log.close()
    if reservation is not None:
        reservation.close_sockets()  # the child holds the passed ones; the claims stay
    engine = SubprocessEngine(
        ctx.name,
        process,
        reservation=reservation,
        log_path=log_path,
        stop_timeout_s=stop_timeout_s,
    )
    try:
        _wait_ready(engine, ready, ctx)
    except BaseException:
        engine.shutdown()
        raise
    return engine


def _wait_ready(engine: SubprocessEngine, ready: ReadyCheck, ctx: StartContext) -> None:
    while True:
        remaining = ctx.remaining_s()
        if ready(engine, _POLL_S if remaining is None else min(_POLL_S, remaining)):
            return
        if engine.process.poll() is not None:
            raise engine._failure("exited before it was ready")
        ctx.check_cancelled()
        if remaining == 0.0:
            raise TimeoutError(f"engine {ctx.name!r} was not ready before its start deadline")


def wait_for_line(prefix: str) -> ReadyCheck:
    """A readiness check: the child printed a line starting with ``prefix`` on stdout.

    Needs ``capture_stdout=True``; the line is kept in ``engine.ready_line``.
    """
    buffers: dict[int, bytes] = {}

    def check(engine: SubprocessEngine, timeout_s: float) -> bool:
        stdout = engine.process.stdout
        if stdout is None:
            raise EngineStartError(
                f"wait_for_line({prefix!r}) needs the engine's stdout; "
                "launch it with capture_stdout=True"
            )
        fd = stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout_s
            while True:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    return False
                chunk = os.read(fd, 4096)
                if not chunk:  # EOF: the child is going; let the caller report why
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        engine.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                    return False
                buf = buffers.get(fd, b"") + chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if text.startswith(prefix):
                        engine.ready_line = text
                        buffers.pop(fd, None)
                        return True
                buffers[fd] = buf

    return check


class _TailReader:
    """Drains a child's pipe on a daemon thread and keeps its last bytes."""

    __slots__ = ("_buf", "_lock", "_stream", "_thread")

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self._stream = stream
        self._buf = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"twinkle-engine-stderr-{name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        fd = self._stream.fileno()
        try:
            while chunk := os.read(fd, 65536):
                with self._lock:
                    self._buf = (self._buf + chunk)[-_STDERR_TAIL_BYTES:]
        except OSError:
            pass
        finally:
            self._stream.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self) -> str:
        with self._lock:
            return self._buf.decode(errors="replace").strip()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
