"""Safety: plugins load only when allowed, names never escape the run directory, files
and directories get sane modes, and importing twinkle creates nothing."""

from __future__ import annotations

import importlib
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import orjson
import pluggy
import pytest

from reliability._scripted import BUILTINS, CONFIG, scripted_run
from twinkle.cli import main
from twinkle.errors import InvalidArgumentError, ReplayError
from twinkle.hookspecs import hookimpl
from twinkle.plugins import DISABLE_AUTOLOAD_ENV, make_plugin_manager
from twinkle.run import RunSession, replay

OUTPUTS = {"events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json"}


# -- plugin autoload ----------------------------------------------------------------------


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution whose observer ``spy`` records that it was imported."""
    marker = tmp_path / "imported"
    pkg = tmp_path / "twinkle_spy_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from twinkle.hookspecs import hookimpl

            Path({str(marker)!r}).write_text("imported")

            class Spy:
                @hookimpl
                def twinkle_event(self, event):
                    pass
            """
        )
    )
    info = tmp_path / "twinkle_spy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: twinkle-spy-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text("[twinkle.observers]\nspy = twinkle_spy_plugin:Spy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    importlib.invalidate_caches()
    yield marker
    sys.modules.pop("twinkle_spy_plugin", None)


def names(pm: pluggy.PluginManager) -> set[str]:
    return {name for name, plugin in pm.list_name_plugin() if plugin is not None}


def test_third_party_plugin_loads_by_default(third_party: Path) -> None:
    assert names(make_plugin_manager()) == BUILTINS | {"spy"}
    assert third_party.exists()


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", " on "])
def test_autoload_disabled_by_environment_never_imports_the_plugin(
    third_party: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)
    assert names(make_plugin_manager()) == BUILTINS
    with RunSession(out_dir=None, run_id="env") as run:
        assert not run.pm.has_plugin("spy")
    assert not third_party.exists(), "a disabled plugin's code must not even be imported"


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_falsy_environment_values_keep_autoload(
    third_party: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)
    assert "spy" in names(make_plugin_manager())


def test_autoload_false_wins_over_the_environment(
    third_party: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "0")
    assert names(make_plugin_manager(autoload=False)) == BUILTINS
    with RunSession(out_dir=None, run_id="arg", autoload=False) as run:
        assert not run.pm.has_plugin("spy")
    assert not third_party.exists()


def test_blocked_plugin_is_never_imported_and_blocks_direct_registration(
    third_party: Path,
) -> None:
    class Direct:
        @hookimpl
        def twinkle_event(self) -> None: ...

    pm = make_plugin_manager(blocked=["spy", "direct"], plugins=[("direct", Direct())])
    assert names(pm) == BUILTINS
    assert not third_party.exists()


def test_blocking_a_builtin_removes_its_output(tmp_path: Path) -> None:
    with RunSession(out_dir=tmp_path, run_id="blocked", autoload=False, blocked=["trace"]):
        pass
    assert {p.name for p in (tmp_path / "blocked").iterdir()} == OUTPUTS - {"trace.json"}


def test_cli_no_autoload_and_block_reach_the_plugin_manager(
    third_party: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scripted_run(tmp_path / "live", run_id="cli")  # (autoload=False)
    assert not third_party.exists()
    out = tmp_path / "out"
    assert main(["replay", str(log), "--out", str(out), "--no-autoload", "--block", "webui"]) == 0
    assert not third_party.exists()
    assert {p.name for p in out.iterdir()} == OUTPUTS - {"metrics.jsonl"}
    assert main(["replay", str(log), "--out", str(tmp_path / "o2"), "--block", "spy"]) == 0
    assert not third_party.exists()
    capsys.readouterr()


# -- names never escape the run directory --------------------------------------------------

BAD_NAMES = [
    "../escape",
    "..",
    ".",
    "a/../../b",
    "a/b",
    "/etc/passwd",
    "a\\b",
    ".hidden",
    "-rf",
    "",
    "x" * 129,
    "a..b",
    "name\x00",
    "tab\tname",
    "new\nline",
    "ümlaut",
]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_run_id_with_path_parts_is_refused_and_nothing_is_written(tmp_path: Path, bad: str) -> None:
    out = tmp_path / "runs" / "inner"
    with pytest.raises(InvalidArgumentError, match=r"run_id .* is not a safe name"):
        RunSession(out_dir=out, run_id=bad)
    assert tree(tmp_path) == set()


@pytest.mark.parametrize("bad", ["../../evil", "..", "/abs", "a/b"])
def test_log_with_an_unsafe_run_id_is_refused_before_writing(tmp_path: Path, bad: str) -> None:
    log = scripted_run(tmp_path / "live", run_id="ok")
    lines = log.read_bytes().splitlines()
    first = orjson.loads(lines[0])
    first["run_id"] = bad
    evil = tmp_path / "evil" / "events.jsonl"
    evil.parent.mkdir()
    evil.write_bytes(b"\n".join([orjson.dumps(first), *lines[1:]]) + b"\n")
    before = tree(tmp_path)
    with pytest.raises(ReplayError, match="not a safe name"):
        replay(evil, tmp_path / "out" / "deep")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("bad", ["../escape", "a/b", "..", ".x"])
def test_cli_run_id_with_path_parts_exits_2_before_running(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--run-id", bad, "--out", str(tmp_path / "runs")]) == 2
    assert "--run-id" in capsys.readouterr().err
    assert tree(tmp_path) == set()


def test_replay_writes_only_its_outputs_inside_the_out_directory(tmp_path: Path) -> None:
    log = scripted_run(tmp_path / "live", run_id="contained")
    before = tree(tmp_path)
    out = tmp_path / "a" / "b" / "out"
    replay(log, out, autoload=False)
    assert tree(tmp_path) - before == {"a", "a/b", "a/b/out"} | {f"a/b/out/{n}" for n in OUTPUTS}


# -- file and directory modes -----------------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_files_are_0644_and_directories_0755(tmp_path: Path, umask_022: None) -> None:
    log = scripted_run(tmp_path / "runs" / "deep", run_id="modes")
    with log.open("ab") as f:
        f.write(b'{"type": "torn')  # a crash: the reopen below moves it to a sidecar
    # A restart resumes the run (same configuration), repairing the torn tail first.
    with RunSession(
        out_dir=tmp_path / "runs" / "deep",
        run_id="modes",
        config=CONFIG,
        autoload=False,
        resume=True,
    ):
        pass
    replay(scripted_run(tmp_path / "src", run_id="again"), tmp_path / "replayed" / "x")
    found = modes(tmp_path)
    assert "runs/deep/modes/events.jsonl.torn" in found
    assert "replayed/x/summary.json" in found
    for name, mode in found.items():
        expected = 0o755 if (tmp_path / name).is_dir() else 0o644
        assert mode == expected, f"{name}: {oct(mode)}"
    assert not [n for n in found if n.endswith(".tmp")]  # no temporary left behind


# -- no side effects at import -------------------------------------------------------------

IMPORT_ALL = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    import twinkle

    names = sorted(m.name for m in pkgutil.walk_packages(twinkle.__path__, "twinkle."))
    for name in names:
        importlib.import_module(name)
    print(len(names))
    """
)


def test_importing_every_twinkle_module_creates_no_file(tmp_path: Path) -> None:
    dirs = {name: tmp_path / name for name in ("cwd", "home", "tmp", "xdg_runtime", "cache")}
    for d in dirs.values():
        d.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TWINKLE_", "XDG_")) and k not in ("TMPDIR", "HOME")
    }
    env.update(
        HOME=str(dirs["home"]),
        TMPDIR=str(dirs["tmp"]),
        XDG_RUNTIME_DIR=str(dirs["xdg_runtime"]),
        XDG_CACHE_HOME=str(dirs["cache"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL],
        cwd=dirs["cwd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 40  # every module was imported
    created = {name: sorted(tree(d)) for name, d in dirs.items() if tree(d)}
    assert created == {}, f"importing twinkle created {created}"


def test_library_modules_read_no_environment_at_import(tmp_path: Path) -> None:
    """The autoload switch is read when a manager is built, not when twinkle is imported."""
    script = textwrap.dedent(
        """
        import os
        from twinkle.plugins import DISABLE_AUTOLOAD_ENV, _manager
        os.environ[DISABLE_AUTOLOAD_ENV] = "1"
        print(_manager._autoload_disabled_by_env())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "True"
