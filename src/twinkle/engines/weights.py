"""Publishing trainer weights to vLLM engines: versioned safetensors, reloaded by each.

``publish_safetensors`` writes ``<root>/v<version>/model.safetensors`` atomically: into
a temporary sibling directory, fsynced, then renamed into place, so an engine never sees
half a version. vLLM's ``reload_weights`` reads only the ``*.safetensors`` files of the
directory it is given (no config or tokenizer is needed next to them).

:class:`VllmWeightPublisher` is a ``StreamingDriver(publisher=...)``: it writes a version
once, asks every engine to reload it concurrently, and yields each engine as it confirms,
so the driver's ``weights_published`` fires only once every engine runs that version.

torch and safetensors are imported only when weights are written: the core imports
without them.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final, final

from twinkle.engines.vllm_client import VllmClient
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.perf import TimeRecorder

__all__ = [
    "VllmPublishError",
    "VllmWeightPublisher",
    "prune_versions",
    "publish_safetensors",
    "published_versions",
]

WEIGHTS_FILE: Final = "model.safetensors"
_VERSION_DIR: Final = re.compile(r"^v(\d+)$")


class VllmPublishError(TwinkleError):
    """An engine failed to load a published version (names the engine; cause chained)."""


def publish_safetensors(state_dict: Mapping[str, Any], root: str | Path, version: int) -> Path:
    """Write ``state_dict`` (name -> torch tensor) as ``<root>/v<version>/model.safetensors``.

    Atomic: the file is written and fsynced in a temporary directory beside the
    destination, which is then renamed into place (and ``root`` fsynced), so readers see
    the whole version or none. Tensors are copied to contiguous CPU memory first; tensors
    sharing storage (tied weights) must be given once. A version is written once: an
    existing ``v<version>`` raises :class:`InvalidArgumentError`. Returns the directory.
    """
    from safetensors.torch import save_file

    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidArgumentError(f"version={version!r} must be an int >= 0")
    if not state_dict:
        raise InvalidArgumentError("state_dict is empty; pass the model's named tensors")
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    final_dir = base / f"v{version}"
    if final_dir.exists():
        raise InvalidArgumentError(
            f"weights version {version} is already published at {str(final_dir)!r}; "
            "publish each version once (a new version number per update)"
        )
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", suffix=".tmp", dir=base))
    try:
        path = tmp / WEIGHTS_FILE
        save_file(tensors, str(path), metadata={"format": "pt"})
        _fsync(path)
        _fsync(tmp)
        os.rename(tmp, final_dir)  # fails if another writer got there first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(base)
    return final_dir


def published_versions(root: str | Path) -> list[int]:
    """The versions published under ``root`` (``v<N>`` directories), oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = (_VERSION_DIR.match(p.name) for p in base.iterdir() if p.is_dir())
    return sorted(int(m[1]) for m in found if m)


def prune_versions(root: str | Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` versions under ``root``; returns those deleted."""
    if keep < 1:
        raise InvalidArgumentError(f"keep={keep!r} must be >= 1 (the version engines run)")
    versions = published_versions(root)
    old = versions[:-keep]
    for version in old:
        shutil.rmtree(Path(root) / f"v{version}", ignore_errors=True)
    return old


@final
class VllmWeightPublisher:
    """A ``StreamingDriver`` publisher for vLLM engines reached by :class:`VllmClient`.

    ``publisher(version, weights)`` writes ``weights`` (a state dict) once under
    ``root``, then on one thread per engine reloads it and resets the engine's prefix
    cache, yielding each engine as it confirms: its name (the driver stamps it on receipt)
    or, with ``clock``, ``(name, clock())`` stamped when the engine confirmed. After every
    engine confirmed, versions older than the newest ``keep`` are deleted. The first
    engine failure raises :class:`VllmPublishError` naming it (the driver fails the
    publication); engines still reloading finish on their threads.

    With a ``recorder``, writing a version is a ``weights.write`` span (``version``) and
    each engine's reload and cache reset a ``weights.load`` span (``engine``,
    ``version``), measured on the thread that waits for that engine.
    """

    __slots__ = ("_clients", "_clock", "_recorder", "keep", "root")

    def __init__(
        self,
        clients: Mapping[str, VllmClient],
        root: str | Path,
        *,
        keep: int = 2,
        clock: Callable[[], int] | None = None,
        recorder: TimeRecorder | None = None,
    ) -> None:
        if not clients:
            raise InvalidArgumentError("clients is empty; pass {engine name: VllmClient}")
        if keep < 1:
            raise InvalidArgumentError(f"keep={keep!r} must be >= 1 (the version engines run)")
        self._clients = dict(clients)
        self._clock = clock
        self._recorder = recorder
        self.keep = keep
        self.root = Path(root)

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self._clients)

    def __call__(self, version: int, weights: Mapping[str, Any]) -> Iterator[str | tuple[str, int]]:
        rec = self._recorder
        with nullcontext() if rec is None else rec.span("weights.write", version=version):
            path = publish_safetensors(weights, self.root, version)
        done: queue.Queue[tuple[str, int | None, BaseException | None]] = queue.Queue()

        def reload(name: str, client: VllmClient) -> None:
            span = (
                nullcontext()
                if rec is None
                else rec.span("weights.load", engine=name, version=version)
            )
            try:
                with span:
                    client.reload_weights(path)
                    client.reset_prefix_cache()  # cached prefixes hold the old results
            except BaseException as exc:
                done.put((name, None, exc))
            else:
                done.put((name, None if self._clock is None else self._clock(), None))

        for name, client in self._clients.items():
            threading.Thread(
                target=reload,
                args=(name, client),
                name=f"twinkle-reload-{name}-v{version}",
                daemon=True,
            ).start()
        for _ in self._clients:
            name, acked_ns, exc = done.get()
            if exc is not None:
                raise VllmPublishError(
                    f"engine {name!r} did not load weights version {version} from "
                    f"{str(path)!r}: {exc}"
                ) from exc
            yield name if acked_ns is None else (name, acked_ns)
        prune_versions(self.root, self.keep)

    def __repr__(self) -> str:
        return f"VllmWeightPublisher({list(self._clients)!r}, root={str(self.root)!r})"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
