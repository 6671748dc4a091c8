"""Bad input at the command line, and in the functions behind it: a clear error naming
the culprit and the fix; at the command line one line on stderr (``twinkle: error:``),
exit status 2 for what the command was given, 1 for a run that failed, never a traceback.

A read-only place for ``--out``: a chmod 0555 directory, or, as root (whom permissions
do not stop), a path under /sys, where nobody may create a directory.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from reliability._cases import Case
from reliability._scripted import scripted_run
from twinkle.cli import main
from twinkle.demo.cli import make_out_dir
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.metric.memory import convert_bytes
from twinkle.plugins import check_blocked
from twinkle.run import RunSession


def read_only(tmp: Path) -> tuple[Path, str]:
    """A directory path nobody may create, and the reason the OS gives."""
    if os.geteuid() == 0:
        return Path("/sys/twinkle-test-out"), "Operation not permitted"
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "runs", "Permission denied"


API_CASES = [
    Case(
        "negative bytes",
        lambda _: convert_bytes(-1, "GiB"),
        InvalidArgumentError,
        r"^convert_bytes: value must be a byte count >= 0, got -1; ",
    ),
    Case(
        "negative bytes in B",
        lambda _: convert_bytes(-(2**40), "B"),
        InvalidArgumentError,
        r"got -1099511627776",
    ),
    Case(
        "out is /dev/null",
        lambda _: make_out_dir("/dev/null"),
        InvalidArgumentError,
        r"^--out '/dev/null' is a character device: give --out a writable directory",
    ),
    Case(
        "out is a file",
        lambda tmp: make_out_dir(tmp / "a-file", "--where"),
        InvalidArgumentError,
        r"^--where '.*a-file' is a file: give --where a writable directory",
    ),
    Case(
        "out under a file",
        lambda tmp: make_out_dir(tmp / "a-file" / "runs"),
        InvalidArgumentError,
        r"'.*a-file/runs' cannot be a directory \(its ancestor '.*a-file' is a file\)",
    ),
    Case(
        "out in /proc",
        lambda _: make_out_dir("/proc/x"),
        InvalidArgumentError,
        r"^--out '/proc/x': cannot create the directory \(No such file or directory\)",
    ),
    Case(
        "out read-only",
        lambda tmp: make_out_dir(read_only(tmp)[0]),
        InvalidArgumentError,
        r"^--out '.*(ro/runs|/sys/twinkle-test-out)': cannot create the directory "
        r"\((Permission denied|Operation not permitted)\): give --out a writable",
    ),
    Case(
        "block a str",
        lambda _: check_blocked("trace"),
        InvalidArgumentError,
        r"blocked must be an iterable of plugin names, got 'trace': pass blocked=\['trace'\]",
    ),
    Case(
        "block a typo",
        lambda _: check_blocked(["metrics-raw"]),
        InvalidArgumentError,
        r"names no plugin: 'metrics-raw'; check the spelling: the known plugins are "
        r"'compare', 'events', 'memory', 'metrics_raw',",
    ),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.name for c in API_CASES])
def test_bad_input_behind_the_command_raises_a_clear_error_naming_the_culprit(
    case: Case, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("a file where a directory is expected\n")
    with pytest.raises(case.error, match=case.match) as info:
        case.call(tmp_path)
    assert isinstance(info.value, TwinkleError)


@dataclass(frozen=True)
class CliCase:
    name: str
    argv: Callable[[Path], list[str]]
    code: int  # 2: the command's input is wrong; 1: the run failed
    match: str  # must name the culprit
    started: bool = False  # found when the run started (its directory exists), not before


DEMO = ["demo", "--iterations", "2", "--prompts", "2", "--completions", "2", "--no-progress"]


def log_of(tmp: Path) -> str:
    return str(scripted_run(tmp / "live", run_id="cli"))


CLI_CASES = [
    CliCase(
        "demo out /dev/null",
        lambda _: [*DEMO, "--out", "/dev/null"],
        2,
        r"--out '/dev/null' is a character device: give --out a writable directory",
    ),
    CliCase(
        "demo out a file",
        lambda tmp: [*DEMO, "--out", str(tmp / "a-file")],
        2,
        r"--out '.*a-file' is a file: give --out a writable directory",
    ),
    CliCase(
        "demo out /proc/x",
        lambda _: [*DEMO, "--out", "/proc/x"],
        2,
        r"--out '/proc/x': cannot create the directory \(No such file or directory\)",
    ),
    CliCase(
        "demo out read-only",
        lambda tmp: [*DEMO, "--out", str(read_only(tmp)[0])],
        2,
        r"cannot create the directory \((Permission denied|Operation not permitted)\)",
    ),
    CliCase(
        "demo run dir a file",
        lambda tmp: [*DEMO, "--out", str(tmp), "--run-id", "a-file"],
        2,
        r"the run directory '.*a-file' \(--out/--run-id\) is a file: choose another --run-id",
    ),
    CliCase(
        "demo block typo",
        lambda tmp: [*DEMO, "--out", str(tmp / "o"), "--block", "trase"],
        2,
        r"blocked \(--block\) names no plugin: 'trase'; check the spelling: .*'trace'",
    ),
    CliCase(
        "demo block timeline",
        lambda tmp: [*DEMO, "--out", str(tmp / "o"), "--block", "timeline", "--no-autoload"],
        2,
        r"observer 'timing' reads the run's timeline, .*unblock 'timeline' or block 'timing'",
        started=True,
    ),
    CliCase(
        "demo iterations 0",
        lambda tmp: ["demo", "--iterations", "0", "--out", str(tmp / "o")],
        2,
        r"iterations must be a positive int, got 0",
    ),
    CliCase(
        "demo engines",
        lambda tmp: [*DEMO, "--prompts", "3", "--engines", "2", "--out", str(tmp / "o")],
        2,
        r"engines",
    ),
    CliCase(
        "demo vllm interpreter missing",
        lambda tmp: [
            *DEMO,
            "--engine",
            "vllm",
            "--vllm-python",
            str(tmp / "no-python"),
            "--out",
            str(tmp / "o"),
        ],
        2,
        r"the vLLM interpreter '.*no-python' does not exist: build it with make vllm-venv, "
        r"or name one with --vllm-python or \$TWINKLE_VLLM_PYTHON",
    ),
    CliCase(
        "demo vllm interpreter without vllm",
        lambda tmp: [
            *DEMO,
            "--engine",
            "vllm",
            "--vllm-python",
            sys.executable,
            "--out",
            str(tmp / "o"),
        ],
        2,
        r"the vLLM interpreter '.*' does not find vLLM: build it with make vllm-venv, or "
        r"name one with --vllm-python",
    ),
    CliCase(
        "replay out /dev/null",
        lambda tmp: ["replay", log_of(tmp), "--out", "/dev/null", "--no-autoload"],
        2,
        r"replay output '/dev/null' exists and is not a directory",
    ),
    CliCase(
        "replay out /proc/x",
        lambda tmp: ["replay", log_of(tmp), "--out", "/proc/x", "--no-autoload"],
        2,
        r"replay output '/proc/x': cannot create '/proc/\.x\.replay-[0-9a-f]+' \(No such file",
    ),
    CliCase(
        "replay out read-only",
        lambda tmp: ["replay", log_of(tmp), "--out", str(read_only(tmp)[0]), "--no-autoload"],
        2,
        r"replay output '.*': cannot create '.*' \((Permission denied|Operation not "
        r"permitted)\): choose a writable --out directory",
    ),
    CliCase(
        "replay out not empty",
        lambda tmp: ["replay", log_of(tmp), "--out", str(tmp), "--no-autoload"],
        2,
        r"replay output '.*' is not empty \(it holds 'a-file', .*pass --force",
    ),
    CliCase(
        "replay dir without log",
        lambda tmp: ["replay", str(tmp), "--out", str(tmp / "o"), "--no-autoload"],
        2,
        r"run directory '.*' holds no events\.jsonl: give a run's directory",
    ),
    CliCase(
        "replay block typo",
        lambda tmp: ["replay", log_of(tmp), "--out", str(tmp / "o"), "--block", "x"],
        2,
        r"names no plugin: 'x'",
    ),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_bad_command_line_is_one_line_naming_the_culprit_with_its_exit_status(
    case: CliCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("a file where a directory is expected\n")
    argv = case.argv(tmp_path)
    capsys.readouterr()
    assert main(argv) == case.code
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("twinkle: error: ") and err.count("\n") == 1, err
    assert re.search(case.match, err), err
    assert "Traceback" not in err
    if not case.started:
        assert not (tmp_path / "o").exists(), "nothing was created for a refused command"
    else:
        assert not list((tmp_path / "o").rglob("summary.json"))


def test_an_unknown_engine_is_a_usage_error_naming_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*DEMO, "--engine", "sglang", "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    assert "argument --engine: invalid choice: 'sglang'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_run_directory_held_by_a_live_run_fails_the_demo_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RunSession(out_dir=tmp_path, run_id="busy", autoload=False):
        rc = main([*DEMO, "--out", str(tmp_path), "--run-id", "busy", "--no-autoload"])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: ") and err.count("\n") == 1, err
    assert "busy" in err and str(os.getpid()) in err, err
