"""The plugin against real runs, read back with TensorBoard's own reader: the data
provider its scalars dashboard reads through."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from twinkle_tensorboard import DIR, EVENT_FILES, TensorBoardSink

from twinkle.errors import ReporterError
from twinkle.hookspecs import RunContext
from twinkle.plugins import PluginStatus, describe_plugins
from twinkle.reporting import cut_short, flat_key, read_jsonl, record_from_dict
from twinkle.run import replay
from twinkle.testing import CtrlCWhileResuming, crashed_run, scripted_run, shared_writable, umask

Scalars = dict[str, list[tuple[int, float, float]]]


def read_tensorboard(logdir: Path) -> Scalars:
    """Every scalar TensorBoard shows for ``logdir``, per tag: (step, wall time, value)."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={"scalars": 0}  # keep every point (0: no sampling)
    )
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    runs = provider.read_scalars(
        context.RequestContext(),
        experiment_id="",
        plugin_name="scalars",
        downsample=10**9,
        run_tag_filter=None,
    )
    assert list(runs) == ["."], runs.keys()  # one TensorBoard run: the directory
    return {
        name: [(d.step, d.wall_time, d.value) for d in data] for name, data in runs["."].items()
    }


def expected(run_dir: Path) -> Scalars:
    """What the run's records say TensorBoard must show, in record order (but an
    iteration cut short)."""
    scalars: Scalars = {}
    for line in read_jsonl(run_dir / "metrics_raw.jsonl"):
        record = record_from_dict(line)
        if cut_short(record):
            continue
        for key, value in record.values.items():
            if value is not None:
                point = (record.step, record.wall_ns / 1e9, float(value))
                scalars.setdefault(flat_key(record, key), []).append(point)
    return scalars


def tensorboard_only(tmp_path: Path, run_id: str = "r", iterations: int = 4, **kw: object) -> Path:
    log = scripted_run(
        tmp_path,
        run_id,
        iterations,
        autoload=False,
        plugins=[("tensorboard", TensorBoardSink())],
        **kw,
    )
    return log.parent


def test_every_value_of_every_record_reads_back_exactly(tmp_path: Path) -> None:
    run_dir = tensorboard_only(tmp_path)
    shown, want = read_tensorboard(run_dir / DIR), expected(run_dir)
    assert shown == want  # exact floats: values are float64 tensors
    assert len(want) > 50  # throughput, timing, memory, run and window figures
    assert want["grpo/loss"] == [(i + 1, want["grpo/loss"][i][1], 0.5 / (i + 1)) for i in range(4)]
    assert {t.split("/")[0] for t in want} >= {
        "rollout",
        "train",
        "timing",
        "memory",
        "run",
        "window",
    }


def test_global_step_is_the_optimizer_step(tmp_path: Path) -> None:
    shown = read_tensorboard(tensorboard_only(tmp_path) / DIR)
    assert [step for step, _, _ in shown["rollout/tokens_per_s_per_device"]] == [1, 2, 3, 4]
    assert [step for step, _, _ in shown["run/run/tokens_per_s_per_device"]] == [4]


def test_a_figure_with_nothing_to_measure_is_left_out(tmp_path: Path) -> None:
    run_dir = tensorboard_only(tmp_path)
    records = [record_from_dict(r) for r in read_jsonl(run_dir / "metrics_raw.jsonl")]
    missing = {flat_key(r, k) for r in records for k, v in r.values.items() if v is None}
    assert missing  # no device memory in this run
    assert not missing & set(read_tensorboard(run_dir / DIR))


def test_installed_it_loads_through_the_entry_point(tmp_path: Path) -> None:
    info = {p.name: p for p in describe_plugins()}["tensorboard"]
    assert (info.builtin, info.status, info.distribution) == (
        False,
        PluginStatus.LOADS,
        "twinkle-tensorboard 0.1.0",
    )
    others = [p.name for p in describe_plugins() if not p.builtin and p.name != "tensorboard"]
    run_dir = scripted_run(tmp_path, "auto", 2, blocked=others).parent  # autoload on
    assert expected(run_dir) == read_tensorboard(run_dir / DIR)


def test_blocked_it_writes_nothing(tmp_path: Path) -> None:
    others = [p.name for p in describe_plugins() if not p.builtin]
    run_dir = scripted_run(tmp_path, "blocked", 2, blocked=others).parent
    assert not (run_dir / DIR).exists()


def test_a_resumed_run_holds_every_record_once_in_one_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tensorboard_only(tmp_path, iterations=2)
    assert (tmp_path / "r" / "checkpoint.bin").exists()
    with caplog.at_level(logging.INFO, logger="twinkle"):
        run_dir = tensorboard_only(tmp_path, iterations=3, first_iteration=2)
    # the plugin keeps its state in the checkpoint: the resume starts from it (its
    # records read back from metrics_raw.jsonl), not from the whole log
    assert "resumes from its whole log" not in caplog.text
    assert len(list((run_dir / DIR).glob(EVENT_FILES))) == 1
    shown, want = read_tensorboard(run_dir / DIR), expected(run_dir)
    assert shown == want
    assert [s for s, _, _ in shown["grpo/loss"]] == [1, 2, 3, 4, 5]  # both segments


def test_a_resume_interrupted_before_its_segment_keeps_the_earlier_file(tmp_path: Path) -> None:
    for first in (0, 2):  # segments 0 and 1: segment 1's run_resumed is fed again next
        run_dir = tensorboard_only(tmp_path, iterations=2, first_iteration=first)
    before = read_tensorboard(run_dir / DIR)
    files = sorted((run_dir / DIR).iterdir())
    plugins = [("tensorboard", TensorBoardSink()), ("ctrl_c", CtrlCWhileResuming())]
    with pytest.raises(KeyboardInterrupt):
        scripted_run(tmp_path, "r", 1, first_iteration=4, autoload=False, plugins=plugins)
    assert sorted((run_dir / DIR).iterdir()) == files
    assert read_tensorboard(run_dir / DIR) == before
    assert [s for s, _, _ in before["grpo/loss"]] == [1, 2, 3, 4]


def test_every_resume_rebuilds_one_file_and_a_killed_ones_leftover_goes(tmp_path: Path) -> None:
    tensorboard_only(tmp_path, iterations=2)
    run_dir = tensorboard_only(tmp_path, iterations=2, first_iteration=2)
    leftover = run_dir / DIR / ".twinkle-rebuild.twinkle.1.deadbeef"  # a killed resume's
    leftover.write_bytes(b"partial")
    tensorboard_only(tmp_path, iterations=2, first_iteration=4)
    assert [p.name for p in (run_dir / DIR).iterdir()] == [
        p.name for p in (run_dir / DIR).glob(EVENT_FILES)
    ]
    assert len(list((run_dir / DIR).iterdir())) == 1
    shown = read_tensorboard(run_dir / DIR)
    assert shown == expected(run_dir)
    assert [s for s, _, _ in shown["grpo/loss"]] == [1, 2, 3, 4, 5, 6]


def test_its_files_are_writable_by_their_owner_alone_whatever_the_umask(
    tmp_path: Path,
) -> None:
    with umask(0):  # (tensorboardX creates its file 0666, mkdir makes 0777)
        tensorboard_only(tmp_path, iterations=2)
        run_dir = tensorboard_only(tmp_path, iterations=1, first_iteration=2)  # resumed
        replay(run_dir, tmp_path / "replayed", autoload=False, plugins=[("tb", TensorBoardSink())])
    assert len(list((run_dir / DIR).glob(EVENT_FILES))) == 1
    assert shared_writable(run_dir) == [] and shared_writable(tmp_path / "replayed") == []


def test_replay_writes_the_same_scalars(tmp_path: Path) -> None:
    run_dir = tensorboard_only(tmp_path / "live")
    out = tmp_path / "replayed"
    replay(run_dir, out, autoload=False, plugins=[("tensorboard", TensorBoardSink())])
    assert read_tensorboard(out / DIR) == read_tensorboard(run_dir / DIR)


def not_a_directory(tmp_path: Path) -> Path:
    """Run ``r``'s TensorBoard directory made a file."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / DIR).write_text("not a directory")
    return tmp_path / "r" / DIR


def test_a_tensorboard_path_it_cannot_use_leaves_the_plugin_out_of_a_run_that_goes_on(
    tmp_path: Path,
) -> None:
    path = not_a_directory(tmp_path)
    run_dir = tensorboard_only(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert re.search(
        r"cannot write TensorBoard's event file in '.*/r/tensorboard'.*--block tensorboard",
        summary["plugins_left_out"]["tensorboard"],
    )
    assert "tensorboard" not in summary["backends"]  # it gave the run no backend
    want = expected(run_dir)  # the run's own records are all there
    assert [s for s, _, _ in want["grpo/loss"]] == [1, 2, 3, 4]
    assert want["run/run/iterations"] == [(4, want["run/run/iterations"][0][1], 4.0)]
    assert path.read_text() == "not a directory"  # left as it was


def test_a_tensorboard_path_it_cannot_use_fails_the_start_of_a_run_that_requires_it(
    tmp_path: Path,
) -> None:
    path = not_a_directory(tmp_path)
    with pytest.raises(ReporterError, match=r"tensorboard'.*--block tensorboard"):
        tensorboard_only(tmp_path, required_plugins=["tensorboard"])
    assert path.read_text() == "not a directory"  # left as it was


class LookWhileResuming(CtrlCWhileResuming):
    """Lists the event files TensorBoard would read, and reads them, at the moment
    CtrlCWhileResuming would interrupt."""

    def __init__(self, logdir: Path) -> None:
        super().__init__()
        self.logdir = logdir
        self.files: list[Path] = []
        self.seen: Scalars | None = None

    def interrupt(self) -> None:
        self.files = sorted(self.logdir.glob(EVENT_FILES))
        self.seen = read_tensorboard(self.logdir)


def test_tensorboard_reads_no_rebuild_before_it_is_complete(tmp_path: Path) -> None:
    run_dir = tensorboard_only(tmp_path, iterations=2)
    before, files = read_tensorboard(run_dir / DIR), sorted((run_dir / DIR).glob(EVENT_FILES))
    look = LookWhileResuming(run_dir / DIR)
    plugins = [("tensorboard", TensorBoardSink()), ("look", look)]
    options = {"autoload": False, "plugins": plugins, "background_writer": False}
    scripted_run(tmp_path, "r", 1, first_iteration=2, **options)  # (writes inline)
    assert (look.files, look.seen) == (files, before)  # the rebuild, half written, is hidden
    assert [s for s, _, _ in read_tensorboard(run_dir / DIR)["grpo/loss"]] == [1, 2, 3]


def test_the_segment_after_a_crash_rebuilds_every_record_of_the_crashed_one(
    tmp_path: Path,
) -> None:
    crashed_run(tmp_path, "r", 3, plugins={"tensorboard": "twinkle_tensorboard:TensorBoardSink"})
    logged = list(read_jsonl(tmp_path / "r" / "events.jsonl"))
    assert "run_finished" not in {e["type"] for e in logged}  # it crashed
    run_dir = tensorboard_only(tmp_path, iterations=1, first_iteration=3)
    assert len(list((run_dir / DIR).iterdir())) == 1
    shown = read_tensorboard(run_dir / DIR)
    assert shown == expected(run_dir)
    # iteration 2, which the crash cut off, is finished by the resume at the step of
    # iteration 1 (the crash took its optimizer step with it), flagged partial: no
    # second point there
    assert [s for s, _, _ in shown["rollout/tokens"]] == [1, 2, 4]
    raw = [record_from_dict(r) for r in read_jsonl(run_dir / "metrics_raw.jsonl")]
    cut = [(r.iteration, r.step) for r in raw if r.kind == "rollout" and cut_short(r)]
    assert cut == [(2, 2)]


def test_loading_the_plugin_imports_no_tensorboardx() -> None:
    code = (
        "import sys, twinkle_tensorboard; "
        "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('tensorboard')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert loaded.strip() == "[]"


def test_its_backend_creates_the_event_file_when_opened_not_when_made(tmp_path: Path) -> None:
    (backend,) = TensorBoardSink().twinkle_make_backends(RunContext("r", tmp_path)) or []
    assert not backend.opened and list((tmp_path / DIR).iterdir()) == []
    backend.open()  # (in a run: on the backend's own thread, before its first write)
    assert [p.name for p in (tmp_path / DIR).iterdir()] == [backend.event_file.name]
    backend.close()
    assert backend.event_file.stat().st_size > 0  # (its first event: the file's version)


def test_a_write_the_disk_cut_short_leaves_every_later_event_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk lets half of an event's frame in: the file is cut back to the frames
    before it (TensorBoard stops at a frame cut short), so the events after it, once
    the disk has room again, are read; the failed event's tag gets its metadata with
    the next event that has it."""
    import errno
    import os

    from twinkle_tensorboard import _event_file

    events = _event_file.EventFile(tmp_path / "events.out.tfevents.test")
    events.write_scalars(1, 1.0, [("a", 1.0)])
    real = os.write
    full = {"left": 8}  # (bytes the disk takes before it is full: a frame's half)

    def write(fd: int, data: bytes | memoryview) -> int:
        if full["left"] is None:
            return real(fd, data)
        taken = real(fd, bytes(data)[: full["left"]])
        full["left"] = 0
        if not taken:
            raise OSError(errno.ENOSPC, "No space left on device")
        return taken

    monkeypatch.setattr(_event_file.os, "write", write)
    with pytest.raises(OSError, match="No space left"):
        events.write_scalars(2, 2.0, [("a", 2.0), ("b", 2.0)])
    full["left"] = None  # (room again)
    events.write_scalars(3, 3.0, [("a", 3.0), ("b", 3.0)])
    events.close()
    shown = read_tensorboard(tmp_path)
    assert {tag: [(s, v) for s, _, v in points] for tag, points in shown.items()} == {
        "a": [(1, 1.0), (3, 3.0)],
        "b": [(3, 3.0)],
    }
