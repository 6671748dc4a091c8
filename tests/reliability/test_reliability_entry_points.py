"""Entry points of group ``twinkle.observers``: a third-party name that shadows a built-in
(or another distribution's) is an error naming both; a plugin that raises or calls
``sys.exit`` while loading is named by entry point and distribution, and the command
exits non-zero with one line; ``blocked``/``--block`` and ``plugins`` are checked.

Every distribution here is real to ``importlib.metadata``: a ``*.dist-info`` directory
(METADATA, entry_points.txt) beside its module on ``sys.path``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pluggy
import pytest

from reliability._scripted import BUILTINS, scripted_run
from twinkle.cli import main
from twinkle.errors import InvalidArgumentError, PluginError
from twinkle.hookspecs import hookimpl
from twinkle.plugins import DISABLE_AUTOLOAD_ENV, check_blocked, make_plugin_manager
from twinkle.run import RunSession, replay

Install = Callable[..., Path]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(dist, module, source, entry_points)``: a distribution on ``sys.path``
    whose module writes ``<module>.imported`` next to it when imported."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    modules: list[str] = []

    def make(dist: str, module: str, source: str, eps: dict[str, str]) -> Path:
        marker = root / f"{module}.imported"
        (root / f"{module}.py").write_text(
            f"from pathlib import Path\nPath({str(marker)!r}).write_text('yes')\n"
            + textwrap.dedent(source)
        )
        info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in eps.items())
        (info / "entry_points.txt").write_text(f"[twinkle.observers]\n{lines}")
        importlib.invalidate_caches()
        modules.append(module)
        return marker

    yield make
    for module in modules:
        sys.modules.pop(module, None)


OBSERVER = """
from twinkle.hookspecs import hookimpl

class Observer:
    @hookimpl
    def twinkle_event(self, event):
        pass
"""


def names(pm: pluggy.PluginManager) -> set[str]:
    return {name for name, plugin in pm.list_name_plugin() if plugin is not None}


# -- shadowing ------------------------------------------------------------------------------


@pytest.mark.parametrize("builtin", ["events", "timeline"])
def test_third_party_entry_point_shadowing_a_builtin_is_an_error_naming_both(
    install: Install, builtin: str
) -> None:
    marker = install("evil-observers", "evil_mod", OBSERVER, {builtin: "evil_mod:Observer"})
    module = {"events": "sinks:EventLogSink", "timeline": "timeline:TimelineObserver"}[builtin]
    with pytest.raises(PluginError) as info:
        make_plugin_manager()
    message = str(info.value)
    assert (
        f"observer plugin {builtin!r} (distribution 'evil-observers 0.1', evil_mod:Observer) "
        f"has the name of twinkle's built-in observer {builtin!r} (distribution 'twinkle "
    ) in message
    assert f"twinkle.observers.{module})" in message
    assert f"--block {builtin}" in message
    assert not marker.exists(), "neither is imported before the names are checked"


def test_shadowing_is_no_error_without_autoload_or_with_the_name_blocked(
    install: Install,
) -> None:
    marker = install("evil-observers", "evil_mod", OBSERVER, {"trace": "evil_mod:Observer"})
    assert names(make_plugin_manager(autoload=False)) == BUILTINS
    assert names(make_plugin_manager(blocked=["trace"])) == BUILTINS - {"trace"}
    assert not marker.exists()


def test_two_distributions_with_one_entry_point_name_is_an_error_naming_both(
    install: Install,
) -> None:
    install("first-plugin", "first_mod", OBSERVER, {"collector": "first_mod:Observer"})
    install("second-plugin", "second_mod", OBSERVER, {"collector": "second_mod:Observer"})
    with pytest.raises(PluginError, match=r"'collector' \(distribution '(first|second)-plugin"):
        make_plugin_manager()
    with pytest.raises(PluginError) as info:
        make_plugin_manager()
    assert "first-plugin 0.1" in str(info.value) and "second-plugin 0.1" in str(info.value)


def test_cli_reports_shadowing_in_one_line_and_fails(
    install: Install, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scripted_run(tmp_path / "live", run_id="shadow")
    install("evil-observers", "evil_mod", OBSERVER, {"events": "evil_mod:Observer"})
    capsys.readouterr()
    assert main(["replay", str(log), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("twinkle: error: observer plugin 'events'")
    assert "built-in observer 'events'" in err
    assert not (tmp_path / "out").exists()


# -- plugins that fail to load ------------------------------------------------------------


LOAD_FAILURES = [
    (
        "sys.exit at import",
        "import sys\nsys.exit(3)\n",
        r"'quitter' \(distribution 'quitter-plugin 0\.1', quitter_mod:Observer\) called "
        r"sys\.exit\(3\) while being imported",
    ),
    (
        "raise at import",
        "raise RuntimeError('no licence server')\n",
        r"'quitter' \(distribution 'quitter-plugin 0\.1', quitter_mod:Observer\) raised "
        r"RuntimeError: no licence server while being imported",
    ),
    (
        "sys.exit in the constructor",
        "import sys\nclass Observer:\n    def __init__(self):\n        sys.exit('bye')\n",
        r"'quitter' \(distribution 'quitter-plugin 0\.1', quitter_mod:Observer\) called "
        r"sys\.exit\('bye'\) while being constructed",
    ),
    (
        "missing attribute",
        "X = 1\n",
        r"'quitter' \(distribution 'quitter-plugin 0\.1', quitter_mod:Observer\) raised "
        r"AttributeError: .*Observer.* while being imported",
    ),
]


@pytest.mark.parametrize(
    ("source", "match"), [c[1:] for c in LOAD_FAILURES], ids=[c[0] for c in LOAD_FAILURES]
)
def test_plugin_failing_to_load_is_named_by_entry_point_and_distribution(
    install: Install, source: str, match: str
) -> None:
    install("quitter-plugin", "quitter_mod", source, {"quitter": "quitter_mod:Observer"})
    with pytest.raises(PluginError, match=match) as info:
        make_plugin_manager()
    assert "--block quitter" in str(info.value)
    sys.modules.pop("quitter_mod", None)
    assert names(make_plugin_manager(blocked=["quitter"])) == BUILTINS
    with pytest.raises(PluginError, match=match):
        RunSession(out_dir=None, run_id="r")


def test_command_with_a_plugin_calling_sys_exit_exits_non_zero_with_one_line(
    install: Install, tmp_path: Path
) -> None:
    """In a real process: the plugin's sys.exit(0) must not pass for success."""
    log = scripted_run(tmp_path / "live", run_id="quit")
    marker = install(
        "quitter-plugin", "quitter_mod", "import sys\nsys.exit(0)\n", {"q": "quitter_mod:X"}
    )
    site = str(marker.parent)
    environ = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, environ.get("PYTHONPATH")]))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "replay", str(log), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr == (
        "twinkle: error: observer plugin 'q' (distribution 'quitter-plugin 0.1', "
        "quitter_mod:X) called sys.exit(0) while being imported; fix or uninstall it, or "
        f"block it: --block q (blocked=['q']) or {DISABLE_AUTOLOAD_ENV}=1\n"
    )
    assert not out.exists()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "twinkle.cli",
            "replay",
            str(log),
            "--out",
            str(out),
            "--block",
            "q",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


# -- blocked and plugins ------------------------------------------------------------------


def test_blocking_an_unknown_name_is_an_error_listing_the_known_names(install: Install) -> None:
    install("spy-plugin", "spy_mod", OBSERVER, {"spy": "spy_mod:Observer"})

    class Mine:
        @hookimpl
        def twinkle_event(self) -> None: ...

    known = "'compare', 'events', 'memory', 'metrics_raw', 'mfu', 'mine', 'scalars', 'spy', "
    known += "'throughput', "
    with pytest.raises(InvalidArgumentError, match=r"names no plugin: 'tarce'") as info:
        make_plugin_manager(blocked=["tarce"], plugins=[("mine", Mine())])
    assert f"the known plugins are {known}'timeline', 'timing', 'trace', 'webui'" in str(info.value)
    # a third-party name is known without autoload; a plugins= name once given
    assert "spy" not in names(make_plugin_manager(autoload=False, blocked=["spy"]))
    assert "mine" not in names(make_plugin_manager(blocked=["mine"], plugins=[("mine", Mine())]))
    with pytest.raises(InvalidArgumentError, match=r"names no plugin: 'mine'"):
        check_blocked(["mine"])


def test_cli_block_of_an_unknown_name_exits_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    assert main(["demo", "--block", "metrics-raw", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: blocked (--block) names no plugin: 'metrics-raw'")
    assert "'metrics_raw'" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"blocked": "trace"},
            r"blocked must be an iterable of plugin names, got 'trace': "
            r"pass blocked=\['trace'\]",
        ),
        ({"blocked": [b"trace"]}, r"blocked must hold plugin names \(str\), got b'trace'"),
        ({"blocked": 3}, r"blocked must be an iterable of plugin names, got 3"),
        (
            {"plugins": [object()]},
            r"plugins\[0\] = <object object at .*> is not a \(name, "
            r"plugin\) pair: pass plugins=\[\('my_observer', MyObserver\(\)\)\]",
        ),
        ({"plugins": [("a", object(), 3)]}, r"plugins\[0\] = \('a', <object"),
        ({"plugins": [(1, object())]}, r"plugins\[0\] = \(1, <object"),
        ({"plugins": {"a": object()}}, r"plugins must be an iterable of \(name, plugin\) pairs"),
        ({"plugins": object()}, r"plugins must be an iterable of \(name, plugin\) pairs"),
    ],
)
def test_blocked_and_plugins_of_the_wrong_shape_are_refused_with_the_fix(
    kwargs: dict[str, object], match: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        make_plugin_manager(autoload=False, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=match):
        RunSession(out_dir=None, run_id="r", autoload=False, **kwargs)  # type: ignore[arg-type]
    log = scripted_run(tmp_path / "live", run_id="shape")
    with pytest.raises(InvalidArgumentError, match=match):
        replay(log, tmp_path / "out", autoload=False, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_plugin_with_an_unknown_hook_in_one_line(
    install: Install, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scripted_run(tmp_path / "live", run_id="typo")
    typo = """
    from twinkle.hookspecs import hookimpl

    class Observer:
        @hookimpl
        def twinkle_iteration_begun(self, event):
            pass
    """
    install("typo-plugin", "typo_mod", typo, {"typo": "typo_mod:Observer"})
    capsys.readouterr()
    assert main(["replay", str(log), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle: error: plugin ") and err.count("\n") == 1, err
    assert "twinkle_iteration_begun" in err and "typo" in err
    assert not (tmp_path / "out").exists()
