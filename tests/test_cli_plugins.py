"""``twinkle --version``, ``twinkle plugins`` and the replay's warning when the plugin
set differs from the run's."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle.cli import EXIT_USAGE, main
from twinkle.run import RunSession


def test_version_names_twinkle_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("twinkle 0.") and f"Python {platform.python_version()}" in out


def test_python_m_twinkle_is_the_command(tmp_path: Path) -> None:
    # (where the environment's scripts folder is not on PATH)
    done = subprocess.run(
        [sys.executable, "-m", "twinkle", "report", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("twinkle: error: ") and "is not a run directory" in done.stderr


def test_plugins_lists_every_builtin_and_what_a_run_would_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plugins", "--block", "trace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["plugin", "kind", "status", "from"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "built-in" in rows["timeline"] and " loads " in rows["timeline"]
    assert " blocked " in rows["trace"]
    # columns two spaces apart, the widest status too
    start = lines[0].index("from")
    assert all(line[start - 2 : start] == "  " != line[start] for line in lines)
    assert main(["plugins", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in found} >= {"timeline", "events", "trace"}
    assert all(p["builtin"] and p["status"] == "loads" for p in found if p["name"] == "trace")


def test_plugins_with_a_typo_in_block_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--block", "trcae"]) == EXIT_USAGE
    assert "trcae" in capsys.readouterr().err


def test_replay_warns_when_it_loads_other_plugins_than_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RunSession(out_dir=tmp_path, run_id="r", autoload=False):
        pass
    out = tmp_path / "again"
    assert main(["replay", str(tmp_path / "r"), "--out", str(out), "--block", "trace"]) == 0
    err = capsys.readouterr().err
    assert "the run loaded observer plugins ['trace'] that this replay did not" in err
    assert main(["replay", str(tmp_path / "r"), "--out", str(tmp_path / "same")]) == 0
    assert "observer plugins" not in capsys.readouterr().err
