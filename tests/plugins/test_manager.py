"""twinkle.plugins._manager: observers discovered through the entry-point group, blocked
by name, autoload switched off; plugins that cannot load named; what each segment of a
run loaded."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pluggy
import pytest

from twinkle.errors import InvalidArgumentError, PluginError
from twinkle.events import Event
from twinkle.hookspecs import hookimpl
from twinkle.plugins import (
    DISABLE_AUTOLOAD_ENV,
    PluginStatus,
    describe_plugins,
    make_plugin_manager,
)
from twinkle.reporting import read_jsonl
from twinkle.run import RunSession, replay
from twinkle.testing import scripted_run

BUILTINS = {
    "timeline",
    "compare",
    "events",
    "memory",
    "metrics_raw",
    "scalars",
    "throughput",
    "mfu",
    "timing",
    "trace",
    "webui",
}


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed third-party distribution providing observer ``collector``."""
    pkg = tmp_path / "twinkle_fakeplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from twinkle.hookspecs import hookimpl

            class Collector:
                def __init__(self):
                    self.events = []

                @hookimpl
                def twinkle_event(self, event):
                    self.events.append(event.TYPE)
            """
        )
    )
    info = tmp_path / "twinkle_fakeplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: twinkle-fakeplugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[twinkle.observers]\ncollector = twinkle_fakeplugin:Collector\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def _names(pm: pluggy.PluginManager) -> set[str]:
    return {name for name, plugin in pm.list_name_plugin() if plugin is not None}


def test_builtin_observers_come_from_the_entry_point_group() -> None:
    assert _names(make_plugin_manager(autoload=False)) == BUILTINS


def test_third_party_plugin_is_discovered_and_receives_events(fake_dist: Path) -> None:
    with RunSession(out_dir=None, run_id="r1", autoload=True) as run:
        run.bus.iteration_started(0)
        collector = run.pm.get_plugin("collector")
    assert collector is not None
    # the observers' own overhead arrives as span batches too
    assert [e for e in collector.events if e != "spans"] == [
        "run_started",
        "iteration_started",
        "run_finished",
        "backends_closed",  # (what the segment's record backends did: none here)
    ]


def test_plugin_blocked_by_name_is_not_loaded(fake_dist: Path) -> None:
    pm = make_plugin_manager(blocked=["collector", "trace"])
    assert "collector" not in _names(pm)
    assert "trace" not in _names(pm)


def test_autoload_disabled_by_environment_keeps_builtins(
    fake_dist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    assert _names(make_plugin_manager()) == BUILTINS
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "0")
    assert "collector" in _names(make_plugin_manager())


def test_builtins_can_be_switched_off() -> None:
    assert _names(make_plugin_manager(autoload=False, builtins=False)) == set()


def test_the_builtins_are_what_twinkle_s_distribution_registered(fake_dist: Path) -> None:
    from twinkle.observers.timing import TimingObserver

    # a twinkle observer class passed in by name is the caller's plugin, not the run's own
    pm = make_plugin_manager(plugins=[("my_timing", TimingObserver())])
    assert {name for name in _names(pm) if pm.is_builtin(name)} == BUILTINS
    assert not pm.is_builtin("collector") and not pm.is_builtin("my_timing")
    assert not pm.is_builtin("no such plugin")
    pm.unregister(name="timing")
    assert not pm.is_builtin("timing")
    blocked = make_plugin_manager(blocked=["trace"])
    assert not blocked.is_builtin("trace") and blocked.is_builtin("timeline")


def test_a_blocked_builtin_is_not_marked_builtin_for_a_later_plugin_of_that_name() -> None:
    class Plain:
        pass

    pm = make_plugin_manager(autoload=False, builtins=False)
    pm.set_blocked("timing")
    pm.register_builtin(Plain(), "timing")  # blocked: nothing is registered
    pm.unblock("timing")
    pm.register(Plain(), "timing")  # the caller's own, under that name
    assert not pm.is_builtin("timing")


def test_broken_plugin_import_names_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[twinkle.observers]\nbroken = no_such_module:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(PluginError, match=r"'broken'.*blocked"):
        make_plugin_manager()
    assert "broken" not in _names(make_plugin_manager(blocked=["broken"]))


def test_unknown_hook_is_reported_by_check_pending() -> None:
    class Typo:
        @hookimpl
        def twinkle_iteration_begun(self, event: Event) -> None: ...

    with pytest.raises(PluginError, match="unknown hook"):
        make_plugin_manager(builtins=False, autoload=False, plugins=[("typo", Typo())])


def test_wrapper_hooks_are_rejected_with_the_fix() -> None:
    class Wrapper:
        @hookimpl(wrapper=True)
        def twinkle_event(self, event: Event) -> Any:
            return (yield)

    with pytest.raises(PluginError, match="wrapper"):
        make_plugin_manager(builtins=False, autoload=False, plugins=[("w", Wrapper())])


def test_describe_plugins_says_what_a_run_would_do_with_each(
    fake_dist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[twinkle.observers]\nbroken = no_such_module:X\n")
    importlib.invalidate_caches()
    found = {p.name: p for p in describe_plugins(blocked=["trace"])}
    assert set(found) == BUILTINS | {"collector", "broken"}
    assert found["timeline"].builtin and found["timeline"].status is PluginStatus.LOADS
    assert found["trace"].status is PluginStatus.BLOCKED
    assert found["collector"].distribution == "twinkle-fakeplugin 0.1"
    assert not found["collector"].builtin and found["collector"].status is PluginStatus.LOADS
    assert found["broken"].status is PluginStatus.FAILS
    assert "no_such_module" in (found["broken"].error or "")
    off = {p.name: p.status for p in describe_plugins(autoload=False)}
    assert off["collector"] is off["broken"] is PluginStatus.AUTOLOAD_OFF
    assert off["timeline"] is PluginStatus.LOADS
    with pytest.raises(InvalidArgumentError, match="trcae"):
        describe_plugins(blocked=["trcae"])


def test_a_run_records_its_plugins_and_a_replay_with_others_says_so(
    fake_dist: Path, tmp_path: Path
) -> None:
    with RunSession(out_dir=tmp_path, run_id="r", autoload=True):
        pass
    first = orjson.loads((tmp_path / "r" / "events.jsonl").read_bytes().splitlines()[0])
    assert first["plugins"] == sorted(BUILTINS | {"collector"})
    same = replay(tmp_path / "r", tmp_path / "same", autoload=True)
    assert not same.plugins_differ
    other = replay(tmp_path / "r", tmp_path / "other", autoload=True, blocked=["collector"])
    assert other.plugins_differ
    assert set(other.plugins_recorded) - set(other.plugins_now) == {"collector"}


def test_each_segment_records_its_plugins_and_a_replay_says_which_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twinkle.cli import main

    scripted_run(tmp_path, "r", 1, autoload=False, blocked=["trace"])
    log = scripted_run(tmp_path, "r", 1, first_iteration=1, autoload=False)
    resumed = [e for e in read_jsonl(log) if e["type"] == "run_resumed"]
    assert [e["plugins"] for e in resumed] == [sorted(BUILTINS)]
    result = replay(log, tmp_path / "out", autoload=False)
    assert result.plugins_by_segment == (
        tuple(sorted(BUILTINS - {"trace"})),
        tuple(sorted(BUILTINS)),
    )
    assert result.plugins_recorded == tuple(sorted(BUILTINS))
    assert result.plugins_differ  # segment 0 ran without the trace
    assert main(["replay", str(log), "--out", str(tmp_path / "cli"), "--no-autoload"]) == 0
    err = capsys.readouterr().err
    assert "this replay loaded observer plugins ['trace'] that segment 0 of the run did not" in err
    assert "segment 1" not in err
    same = replay(log, tmp_path / "same", autoload=False, blocked=["trace"])
    assert same.plugins_differ  # now segment 1 differs
