"""The bad-input table of reliability round 2: for every item of the round, input that
used to be taken silently, lose data or end in a traceback, and the clear error (naming
the culprit and the fix) it gets now. Each item's own tests are in the files named by
its cases; this table holds them side by side, and nothing here may be recorded wrongly:
every case also checks that what was on disk before it is still there."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from reliability._scripted import CONFIG, scripted_run
from twinkle.cli import main
from twinkle.engines import EnginePool
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    RecordError,
    ReplayError,
    ReporterError,
    RunDirInUseError,
    TwinkleError,
    WriteError,
)
from twinkle.events import EventBus, FrozenDict
from twinkle.metric.memory import convert_bytes
from twinkle.plugins import HookCalls, make_plugin_manager
from twinkle.reporting import JsonlWriter, read_jsonl
from twinkle.run import RunSession, finish_on_signals, replay
from twinkle.run._summary import write_summary


@dataclass(frozen=True)
class Case:
    item: int  # the item of the round (issue 14) this input belongs to
    name: str
    call: Callable[[Path], object]
    error: type[Exception]
    match: str  # must name the culprit


def session(tmp: Path, **kw: Any) -> RunSession:
    return RunSession(out_dir=tmp, run_id=kw.pop("run_id", "r"), autoload=False, **kw)


def resume_with_other_config(tmp: Path) -> None:
    scripted_run(tmp, run_id="r", iterations=1)
    session(tmp, config={**CONFIG, "finalise_lag": 2}, resume=True).start()


def second_session(tmp: Path) -> None:
    with session(tmp):
        session(tmp).start()


def torn_middle_line(tmp: Path) -> list[object]:
    path = tmp / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 2}\n')  # not a fragment a writer recorded
    return list(read_jsonl(path))


def planted_link(tmp: Path) -> None:
    (tmp / "r").mkdir()
    (tmp / "outside").write_bytes(b"")
    (tmp / "r" / "events.jsonl").symlink_to(tmp / "outside")
    session(tmp).start()


def off_the_main_thread(tmp: Path) -> None:
    failure: list[BaseException] = []

    def guard() -> None:
        try:
            with finish_on_signals():
                pass
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=guard)
    thread.start()
    thread.join()
    raise failure[0]


def log_is_a_directory(tmp: Path) -> None:
    (tmp / "r" / "events.jsonl").mkdir(parents=True)
    session(tmp).start()


def summary_through_a_link(tmp: Path) -> None:
    (tmp / "elsewhere").write_bytes(b"{}")
    (tmp / "summary.json").symlink_to(tmp / "elsewhere")
    write_summary(tmp / "summary.json", {"status": "ok"})


def mutate_a_payload(tmp: Path) -> None:
    event = EventBus("r").run_started({"phases": {"rollout": ["generate"]}})
    assert isinstance(event.config, FrozenDict)
    event.config["phases"]["rollout"].append("train")


def forked_child_finishes(tmp: Path) -> None:
    """Run ``finish()`` of the parent's session in a forked child; raise what it got."""
    run = session(tmp).start()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            run.finish()
            said = b"finished"
        except TwinkleError as exc:
            said = str(exc).encode()
        os.write(write, said)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        heard = f.read().decode()
    run.finish()
    if heard != "finished":
        raise TwinkleError(heard)


def replay_onto_files(tmp: Path) -> None:
    log = scripted_run(tmp / "live", run_id="r", iterations=1)
    (tmp / "out").mkdir()
    (tmp / "out" / "mine.txt").write_text("keep me\n")
    replay(log, tmp / "out")


def duplicated_line(tmp: Path) -> None:
    log = scripted_run(tmp / "live", run_id="r", iterations=1)
    lines = log.read_bytes().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if b'"type":"samples"' in line)
    (tmp / "dup.jsonl").write_bytes(b"".join([*lines[: i + 1], *lines[i:]]))  # counted twice?
    replay(tmp / "dup.jsonl", tmp / "out")


def iteration_again(tmp: Path) -> None:
    with session(tmp) as run:
        run.bus.iteration_started(2)
        run.bus.iteration_started(2)


def zero_devices(tmp: Path) -> None:
    session(tmp, config={**CONFIG, "window": {"samples": "rollout", "devices": 0}})


class ForgeryRefused(Exception):
    pass


def forged_status(tmp: Path) -> None:
    """A plugin's summary part says "ok" for a failed run: no exception reaches the
    caller (an observer's failure never does); the refusal is counted and logged. This
    raises :class:`ForgeryRefused` when the summary kept the run's own status."""

    class Forger:
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def twinkle_summary(self) -> dict[str, Any]:
            return {"status": "ok", "error": None}

    run = session(tmp, plugins=[("forger", Forger())])
    with pytest.raises(RuntimeError), run:
        raise RuntimeError("failed")
    summary = orjson.loads((tmp / "r" / "summary.json").read_bytes())
    if summary["status"] == "error" and summary["observer_failures"] == {"forger": 1}:
        raise ForgeryRefused("status error kept, the part counted as a 'forger' failure")


CASES = [
    Case(1, "resume with another config", resume_with_other_config, ConfigError,
         r"run 'r' cannot resume with this configuration: .* at \['finalise_lag'\] "
         r"\(finalise_lag: \(not set\) -> 2\)"),
    Case(2, "a second live writer", second_session, RunDirInUseError,
         rf"run directory '.*/r' is in use by pid {os.getpid()} .*choose another run id"),
    Case(3, "a torn middle line no writer recorded", torn_middle_line, RecordError,
         r"a\.jsonl:2: invalid JSON"),
    Case(4, "events.jsonl planted as a symlink", planted_link, ReporterError,
         r"events\.jsonl.*symbolic link"),
    Case(4, "summary.json planted as a symlink", summary_through_a_link, WriteError,
         r"summary\.json"),
    Case(5, "signals guarded off the main thread", off_the_main_thread, TwinkleError,
         r"main thread"),
    Case(6, "the event log cannot open", log_is_a_directory, ReporterError,
         r"events\.jsonl' is not a file"),
    Case(7, "a plugin part that sets the run's status", forged_status, ForgeryRefused,
         r"status error kept, the part counted as a 'forger' failure"),
    Case(8, "an observer changing a payload", mutate_a_payload, TypeError,
         r"FrozenList is read-only.*copy it first"),
    Case(9, "blocked as a str", lambda t: make_plugin_manager(blocked="trace"),
         InvalidArgumentError, r"blocked.*'trace'"),
    Case(9, "a plugin that is not a (name, plugin) pair",
         lambda t: make_plugin_manager(autoload=False, plugins=[object()]),  # type: ignore[list-item]
         InvalidArgumentError, r"plugins\[0\] = <object .* is not a \(name, plugin\) pair"),
    Case(10, "a forked child finishing the parent's run", forked_child_finishes, TwinkleError,
         r"cannot finish run 'r' in process \d+: it belongs to process \d+ \(this is a forked"),
    Case(11, "replay onto a directory with files", replay_onto_files, ReplayError,
         r"not empty.*force"),
    Case(11, "a duplicated log line", duplicated_line, ReplayError,
         r"dup\.jsonl:\d+: .*seq"),
    Case(12, "an iteration started twice", iteration_again, RecordError,
         r"iteration_started 2 repeats iteration 2"),
    Case(12, "zero devices", zero_devices, ConfigError,
         r"config\.window\.devices must be a positive, finite number"),
    Case(13, "a negative observer budget",
         lambda t: HookCalls(make_plugin_manager(autoload=False), slow_call_s=-1.0),
         InvalidArgumentError, r"slow_call_s"),
    Case(14, "out_dir not a path", lambda t: RunSession(out_dir=123), InvalidArgumentError,  # type: ignore[arg-type]
         r"out_dir must be a directory path .*got 123"),
    Case(14, "a bus with a path for a run id", lambda t: EventBus("../x"),
         InvalidArgumentError, r"\.\./x"),
    Case(14, "negative bytes", lambda t: convert_bytes(-1, "MiB"), InvalidArgumentError,
         r"-1"),
    Case(14, "a dict for a batch of records",
         lambda t: JsonlWriter(t / "a.jsonl").write({"a": 1}),
         InvalidArgumentError, r"wrap it in a list"),
    Case(14, "None for token lengths",
         lambda t: EventBus("r").samples(iteration=0, phase="p", lengths=None),  # type: ignore[arg-type]
         InvalidArgumentError, r"samples\.lengths must be an iterable"),
    Case(15, "a shutdown timeout that is a str",
         lambda t: EnginePool(shutdown_timeout_s="5"),  # type: ignore[arg-type]
         InvalidArgumentError, r"shutdown_timeout_s"),
]  # fmt: skip


def test_every_item_of_the_round_has_a_case() -> None:
    assert {case.item for case in CASES} == set(range(1, 16))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.item}: {c.name}" for c in CASES])
def test_bad_input_of_round_2_gets_a_clear_error(case: Case, tmp_path: Path) -> None:
    (tmp_path / "before.txt").write_text("recorded before\n")
    with pytest.raises(case.error, match=case.match):
        case.call(tmp_path)
    assert (tmp_path / "before.txt").read_text() == "recorded before\n"


def test_the_cli_says_the_same_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused replay through the command: one line, exit 2, no traceback."""
    log = scripted_run(tmp_path / "live", run_id="r", iterations=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me\n")
    assert main(["replay", str(log), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "force" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me\n"
