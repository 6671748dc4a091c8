"""twinkle.locks: a narrow file lock with timeouts that name the lock file and its holder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from twinkle.errors import ConfigError, InvalidArgumentError, LockTimeoutError
from twinkle.locks import FileLock, runtime_dir

HOLD_LOCK = textwrap.dedent(
    """
    import sys
    from twinkle.locks import FileLock
    lock = FileLock("held", directory=sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    sys.stdin.read()  # hold until the parent closes stdin
    lock.release()
    """
)


@pytest.fixture
def holder_process(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_lock_file_lives_in_the_chosen_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lock_dir = tmp_path / "locks"
    lock = FileLock("ports", directory=lock_dir)
    assert lock.path == lock_dir / "ports.lock"
    with lock:
        assert lock.is_locked
        assert lock.holder() is not None
    assert not lock.is_locked
    assert lock.holder() is None  # the sidecar goes with the release
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locks"]  # nothing in the cwd


def test_runtime_dir_is_a_private_subdirectory_of_xdg_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TWINKLE_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = runtime_dir()
    assert path == tmp_path / "twinkle"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert FileLock("x").path == path / "x.lock"


def test_runtime_dir_falls_back_to_tmp_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWINKLE_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = runtime_dir()
    assert path == Path("/tmp") / f"twinkle-{os.getuid()}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_runtime_dir_override_and_refusal_of_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_RUNTIME_DIR", str(tmp_path / "rt"))
    assert runtime_dir() == tmp_path / "rt"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("TWINKLE_RUNTIME_DIR", str(tmp_path / "link"))
    with pytest.raises(ConfigError, match="not a directory"):
        runtime_dir()


def test_importing_creates_no_directory(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), TWINKLE_RUNTIME_DIR="")
    subprocess.run(
        [sys.executable, "-c", "import twinkle.locks, twinkle.engines"],
        env=env,
        cwd=tmp_path,
        check=True,
    )
    assert list(tmp_path.iterdir()) == []


def test_timeout_names_the_lock_file_and_the_holder_process(
    tmp_path: Path, holder_process: subprocess.Popen[str]
) -> None:
    lock = FileLock("held", directory=tmp_path, timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(LockTimeoutError) as info:
        lock.acquire()
    assert 0.2 <= time.monotonic() - t0 < 5
    message = str(info.value)
    assert str(tmp_path / "held.lock") in message
    assert f"pid {holder_process.pid}" in message
    assert isinstance(info.value, TimeoutError)
    holder = lock.holder()
    assert holder is not None and holder.pid == holder_process.pid and holder.alive


def test_timeout_between_threads_names_the_holding_thread(tmp_path: Path) -> None:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with FileLock("t", directory=tmp_path):
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold, name="holder-thread")
    thread.start()
    try:
        held.wait(10)
        with pytest.raises(LockTimeoutError, match="holder-thread") as info:
            FileLock("t", directory=tmp_path).acquire(timeout_s=0.05)
        assert f"pid {os.getpid()}" in str(info.value)
    finally:
        done.set()
        thread.join()
    FileLock("t", directory=tmp_path, timeout_s=1).acquire()  # free again


def test_one_lock_object_is_exclusive_between_threads_and_not_reentrant(
    tmp_path: Path,
) -> None:
    lock = FileLock("shared", directory=tmp_path, timeout_s=0.05)
    with lock:
        with pytest.raises(LockTimeoutError):
            lock.acquire()  # same thread: not re-entrant
        errors: list[BaseException] = []

        def other() -> None:
            try:
                lock.acquire()
            except LockTimeoutError as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1
    lock.acquire()
    lock.release()


def test_lock_serialises_read_modify_write_across_processes(tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from twinkle.locks import FileLock
        lock = FileLock("count", directory=sys.argv[1], timeout_s=30)
        path = Path(sys.argv[1]) / "counter"
        for _ in range(50):
            with lock:
                path.write_text(str(int(path.read_text()) + 1))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)]) for _ in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert counter.read_text() == "200"


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="name="):
        FileLock("a/b", directory=tmp_path)
    with pytest.raises(InvalidArgumentError, match="timeout_s="):
        FileLock("a", directory=tmp_path, timeout_s=-1)
    lock = FileLock("a", directory=tmp_path)
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()


@pytest.mark.parametrize("bad", [-1, -0.5, True, float("nan"), float("inf"), "1"])
def test_a_timeout_that_is_no_duration_is_refused_by_name(tmp_path: Path, bad: object) -> None:
    # True (1 s) and inf (an OverflowError in acquire) were taken once; "1" a TypeError
    with pytest.raises(InvalidArgumentError, match=r"timeout_s=.* or None to wait forever"):
        FileLock("a", directory=tmp_path, timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"timeout_s="):
        FileLock("a", directory=tmp_path).acquire(timeout_s=bad)  # type: ignore[arg-type]


def test_a_zero_timeout_tries_once(tmp_path: Path) -> None:
    with FileLock("z", directory=tmp_path, timeout_s=0):
        with pytest.raises(LockTimeoutError):
            FileLock("z", directory=tmp_path).acquire(timeout_s=-0.0)
