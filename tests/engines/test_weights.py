"""twinkle.engines.weights: atomic versioned safetensors and the publisher (no vLLM)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from twinkle import events as ev  # noqa: E402
from twinkle.driver import StreamingDriver  # noqa: E402
from twinkle.engines import (  # noqa: E402
    VllmClient,
    VllmPublishError,
    VllmWeightPublisher,
    prune_versions,
    publish_safetensors,
    published_versions,
)
from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.events import EventBus  # noqa: E402


def _state() -> dict[str, object]:
    return {"w": torch.arange(6.0).reshape(2, 3).t(), "b": torch.ones(2)}  # w: not contiguous


class FakeClient:
    """Stands in for VllmClient: records calls, can fail or wait on a gate."""

    def __init__(self, name: str, fail: bool = False, gate: threading.Event | None = None):
        self.name = name
        self.fail = fail
        self.gate = gate
        self.calls: list[tuple[str, object]] = []

    def reload_weights(self, path: Path) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append(("reload_weights", path))
        if self.fail:
            raise RuntimeError(f"{self.name} exploded")

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", None))


def _publisher(clients: dict[str, FakeClient], root: Path, **kw: object) -> VllmWeightPublisher:
    return VllmWeightPublisher(clients, root, **kw)  # type: ignore[arg-type]


def test_importing_the_engines_does_not_import_torch_or_safetensors() -> None:
    code = (
        "import sys, twinkle.engines; "
        "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_version_is_written_whole_under_its_own_directory(tmp_path: Path) -> None:
    path = publish_safetensors(_state(), tmp_path, 3)
    assert path == tmp_path / "v3" and sorted(p.name for p in tmp_path.iterdir()) == ["v3"]
    assert [p.name for p in path.iterdir()] == ["model.safetensors"]
    loaded = safetensors_torch.load_file(path / "model.safetensors")
    assert torch.equal(loaded["w"], _state()["w"]) and torch.equal(loaded["b"], torch.ones(2))


def test_a_version_is_published_once(tmp_path: Path) -> None:
    publish_safetensors(_state(), tmp_path, 1)
    with pytest.raises(InvalidArgumentError, match="version 1 is already published"):
        publish_safetensors(_state(), tmp_path, 1)
    with pytest.raises(InvalidArgumentError, match="version=-1"):
        publish_safetensors(_state(), tmp_path, -1)


def test_a_failed_write_leaves_no_directory_behind(tmp_path: Path) -> None:
    bad = {"w": torch.ones(2), "alias": None}
    with pytest.raises(AttributeError):
        publish_safetensors(bad, tmp_path, 1)
    shared = torch.ones(4)
    with pytest.raises(RuntimeError):  # safetensors refuses tensors sharing memory
        publish_safetensors({"a": shared, "b": shared}, tmp_path, 2)
    assert list(tmp_path.iterdir()) == []


def test_pruning_keeps_the_newest_versions_and_ignores_other_entries(tmp_path: Path) -> None:
    for version in (1, 2, 10):
        publish_safetensors(_state(), tmp_path, version)
    (tmp_path / "notes").mkdir()
    assert prune_versions(tmp_path, keep=2) == [1]
    assert published_versions(tmp_path) == [2, 10] and (tmp_path / "notes").is_dir()


def test_the_publisher_writes_once_reloads_every_engine_and_yields_each(tmp_path: Path) -> None:
    clients = {"e0": FakeClient("e0"), "e1": FakeClient("e1")}
    acks = list(_publisher(clients, tmp_path)(1, _state()))
    assert sorted(acks) == ["e0", "e1"]
    for client in clients.values():
        assert client.calls == [("reload_weights", tmp_path / "v1"), ("reset_prefix_cache", None)]


def test_an_engine_confirming_first_is_yielded_first_with_its_clock_time(tmp_path: Path) -> None:
    gate = threading.Event()
    clients = {"slow": FakeClient("slow", gate=gate), "fast": FakeClient("fast")}
    ticks = iter(range(100, 200))
    acks = _publisher(clients, tmp_path, clock=lambda: next(ticks))(1, _state())
    assert next(acks) == ("fast", 100)  # while "slow" still waits
    gate.set()
    assert list(acks) == [("slow", 101)]


def test_old_versions_are_pruned_after_every_engine_confirmed(tmp_path: Path) -> None:
    publisher = _publisher({"e0": FakeClient("e0")}, tmp_path)
    for version in range(4):
        list(publisher(version, _state()))
    assert published_versions(tmp_path) == [2, 3]


def test_a_failing_engine_is_named_and_the_version_kept(tmp_path: Path) -> None:
    clients = {"ok": FakeClient("ok"), "bad": FakeClient("bad", fail=True)}
    with pytest.raises(VllmPublishError, match=r"engine 'bad' did not load weights version 5"):
        list(_publisher(clients, tmp_path)(5, _state()))
    assert published_versions(tmp_path) == [5]


def test_the_driver_fires_weights_published_once_every_engine_reloaded(tmp_path: Path) -> None:
    clients = {"e0": FakeClient("e0"), "e1": FakeClient("e1")}
    bus = EventBus("weights-test")
    published: list[ev.WeightsPublished] = []

    def receive(sender: object, *, event: ev.WeightsPublished) -> None:
        published.append(event)

    ev.weights_published.connect(receive, sender=bus, weak=False)
    try:
        driver = StreamingDriver([lambda v: v], bus=bus, publisher=_publisher(clients, tmp_path))
        with driver:
            driver.publish_weights(_state(), timeout=10)
    finally:
        ev.weights_published.disconnect(receive, sender=bus)
    assert [e.version for e in published] == [1]
    assert sorted(a.engine for a in published[0].acks) == ["e0", "e1"]
    assert all(len(c.calls) == 2 for c in clients.values())


def test_the_publisher_refuses_no_engines(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="clients is empty"):
        VllmWeightPublisher({}, tmp_path)
    with pytest.raises(InvalidArgumentError, match="keep=0"):
        VllmWeightPublisher({"e": VllmClient("http://127.0.0.1:1")}, tmp_path, keep=0)


def test_with_a_recorder_the_write_and_each_engines_reload_are_spans(tmp_path: Path) -> None:
    from twinkle.perf import TimeRecorder

    gate = threading.Event()
    clients = {"a": FakeClient("a"), "b": FakeClient("b", gate=gate)}
    recorder = TimeRecorder()
    acks = _publisher(clients, tmp_path, recorder=recorder)(4, _state())
    assert next(acks) == "a"  # b still waits on its gate
    gate.set()
    assert list(acks) == ["b"]
    spans = {(s.name, s.attrs.get("engine")): s for s in recorder.drain()}
    assert sorted(spans) == [("weights.load", "a"), ("weights.load", "b"), ("weights.write", None)]
    assert all(s.attrs["version"] == 4 and s.error is None for s in spans.values())
    write = spans["weights.write", None]
    for engine in "ab":  # each reload starts once the version is on disk
        assert spans["weights.load", engine].start_ns >= write.end_ns
    assert spans["weights.load", "b"].end_ns > spans["weights.load", "a"].end_ns


def test_a_failed_reload_is_a_span_with_its_error(tmp_path: Path) -> None:
    from twinkle.perf import TimeRecorder

    recorder = TimeRecorder()
    with pytest.raises(VllmPublishError):
        list(
            _publisher({"a": FakeClient("a", fail=True)}, tmp_path, recorder=recorder)(1, _state())
        )
    (load,) = [s for s in recorder.drain() if s.name == "weights.load"]
    assert load.error == "RuntimeError"  # the exception type: the message goes to the caller
