"""The plugin contract: discovery through entry points, blocking, isolation of failures."""

from __future__ import annotations

import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pluggy
import pytest

from twinkle import hookspecs
from twinkle.errors import InvalidArgumentError, PluginError
from twinkle.events import Event, IterationStarted, RunStarted
from twinkle.hookspecs import hookimpl
from twinkle.perf import ManualClock
from twinkle.plugins import (
    DISABLE_AUTOLOAD_ENV,
    HOOK_FOR_EVENT,
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


class Boom:
    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        raise RuntimeError("observer bug")

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        raise ValueError("another observer bug")


class Good:
    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        if event.TYPE != "spans":
            self.events.append(event.TYPE)


@pytest.mark.parametrize("boom_first", [True, False], ids=["raising-first", "raising-last"])
def test_raising_observer_is_isolated_logged_and_counted(
    boom_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    good = Good()
    pair = [("boom", Boom()), ("good", good)]
    plugins = pair if boom_first else pair[::-1]
    run = RunSession(out_dir=None, run_id="r", autoload=False, plugins=plugins)
    with run:
        for i in range(3):
            run.bus.iteration_started(i)
    assert good.events == [
        "run_started",
        *["iteration_started"] * 3,
        "run_finished",
        "backends_closed",
    ]
    # every event reaches twinkle_event (span batches of overhead included), and the
    # three iteration starts twinkle_iteration_started too
    assert run.dispatcher is not None
    expected = run.dispatcher.events + 3
    assert run.failures == {"boom": expected}
    assert run.summary is not None
    assert run.summary["observer_failures"] == {"boom": expected}
    assert "observer 'boom' failed in twinkle_event" in caplog.text


def test_slow_observer_time_is_deducted_as_overhead_and_others_still_run(tmp_path: Path) -> None:
    clock = ManualClock(0)
    ms = 1_000_000

    class Slow:
        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            clock.advance(30 * ms)  # this observer takes 30 ms of the trainer's time

    good = Good()
    run = RunSession(
        out_dir=tmp_path,
        run_id="slow",
        clock=clock,
        autoload=False,
        plugins=[("slow", Slow()), ("good", good)],
        background_writer=False,
    )
    with run:
        run.bus.iteration_started(0)
        clock.advance(100 * ms)
        run.bus.iteration_started(1)
        clock.advance(100 * ms)
    import orjson

    timing = [
        orjson.loads(line)["values"]
        for line in (tmp_path / "slow" / "metrics_raw.jsonl").read_bytes().splitlines()
        if b'"kind":"timing","scope":"iteration"' in line
    ]
    assert [t["window_wall_seconds"] for t in timing] == [0.13, 0.13]
    assert [t["window_overhead_seconds"] for t in timing] == [0.03, 0.03]
    assert [t["window_logical_seconds"] for t in timing] == [0.1, 0.1]
    assert good.events.count("iteration_started") == 2


def test_observer_publishing_from_inside_a_hook_is_dispatched_after_the_current_event() -> None:
    order: list[str] = []

    class Republisher:
        bus: Any = None

        @hookimpl
        def twinkle_iteration_started(self, event: IterationStarted) -> None:
            order.append(f"start {event.iteration}")
            if event.iteration == 0:
                self.bus.snapshot({"from": "hook"})
                order.append("published")

        @hookimpl
        def twinkle_event(self, event: Event) -> None:
            if event.TYPE != "spans":
                order.append(f"event {event.TYPE}")

    rep = Republisher()
    with RunSession(out_dir=None, run_id="r", autoload=False, plugins=[("rep", rep)]) as run:
        rep.bus = run.bus
        run.bus.iteration_started(0)
    assert order[:5] == [
        "event run_started",
        "start 0",
        "published",
        "event iteration_started",
        "event snapshot",
    ]


def test_every_event_type_has_exactly_one_hook() -> None:
    import typing

    from blinker import NamedSignal

    from twinkle.events import EVENT_TYPES, SIGNALS

    assert set(HOOK_FOR_EVENT) == set(EVENT_TYPES.values())
    assert len(set(HOOK_FOR_EVENT.values())) == len(HOOK_FOR_EVENT)
    for cls, hook in HOOK_FOR_EVENT.items():
        # derived from the type's definition: the contract must spell that hook, for
        # that type, and the signal carries the type's name
        spec = getattr(hookspecs, hook)
        assert typing.get_type_hints(spec)["event"] is cls, hook
        signal = SIGNALS[cls]
        assert isinstance(signal, NamedSignal), hook
        assert signal.name == f"twinkle.{cls.TYPE}"


def test_every_hookspec_documents_when_it_fires_and_each_argument() -> None:
    specs = [getattr(hookspecs, n) for n in dir(hookspecs) if n.startswith("twinkle_")]
    assert len(specs) >= 14
    for fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert doc, f"{fn.__name__} has no docstring"
        for arg in inspect.signature(fn).parameters:
            assert f":param {arg}:" in doc, f"{fn.__name__} does not document {arg!r}"


def test_run_started_reaches_observers_with_the_config() -> None:
    seen: list[dict[str, Any]] = []

    class Cfg:
        @hookimpl
        def twinkle_run_started(self, event: RunStarted) -> None:
            seen.append(event.config)

    with RunSession(
        out_dir=None,
        run_id="r",
        config={"total_steps": 7},
        autoload=False,
        builtins=False,
        plugins=[("cfg", Cfg())],
    ):
        pass
    assert seen == [{"total_steps": 7}]


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
