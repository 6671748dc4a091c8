"""The per-run object: it owns the observers' state, fixes the plugin set while it runs,
checks the events' lifecycle, and lets pluggy's monitoring see every hook call."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pluggy
import pytest

from twinkle.errors import (
    InvalidArgumentError,
    PluginError,
    RecordError,
    ReporterError,
    TwinkleError,
)
from twinkle.events import IterationStarted, RunStarted
from twinkle.hookspecs import hookimpl
from twinkle.observers import TIMELINE, ObserverConfig
from twinkle.perf.stats import MemoryReading
from twinkle.plugins import ObserverManager, make_plugin_manager
from twinkle.reporting import read_jsonl
from twinkle.run import Run, RunSession, RunState
from twinkle.testing import SCRIPTED_CONFIG, scripted_run


class Collector:
    def __init__(self) -> None:
        self.types: list[str] = []
        self.events: list[Any] = []

    @hookimpl
    def twinkle_event(self, event: Any) -> None:
        self.types.append(event.TYPE)
        self.events.append(event)


def _run(**kwargs: Any) -> RunSession:
    return RunSession(out_dir=None, autoload=False, **kwargs)


def test_a_run_keeps_no_state_behind_whatever_is_blocked() -> None:
    refs = []
    for blocked in ([], ["timing"], ["throughput"], ["timing", "throughput"]):
        run = _run(blocked=blocked)
        with run:
            run.bus.iteration_started(0)
            timeline = run.context.stash[TIMELINE]
            refs.append(weakref.ref(timeline))
        del run, timeline
    gc.collect()
    assert [r() for r in refs] == [None] * 4


def test_registering_while_a_run_runs_is_an_error_that_says_so() -> None:
    run = _run()
    with run:
        with pytest.raises(
            PluginError, match=r"cannot register plugin 'late'.*fixed when it starts"
        ):
            run.pm.register(Collector(), name="late")
        with pytest.raises(PluginError, match="cannot unregister"):
            run.pm.unregister(name="timing")
    late = Collector()
    run.pm.register(late, name="late")  # free again once the run is over
    assert run.pm.has_plugin("late")


def test_a_manager_serves_one_run_at_a_time() -> None:
    pm = make_plugin_manager(autoload=False)
    first = RunSession(out_dir=None, run_id="a", plugin_manager=pm)
    second = RunSession(out_dir=None, run_id="b", plugin_manager=pm)
    with first, pytest.raises(PluginError, match="in use by run 'a'"):
        second.start()


def test_a_plain_pluggy_manager_is_refused_with_the_fix() -> None:
    with pytest.raises(PluginError, match=r"must come from twinkle\.plugins\.make_plugin_manager"):
        RunSession(out_dir=None, plugin_manager=pluggy.PluginManager("twinkle"))


def test_pluggy_monitoring_sees_the_dispatchers_calls() -> None:
    pm = make_plugin_manager(autoload=False, plugins=[("collector", Collector())])
    seen: list[tuple[str, list[str]]] = []
    results: list[object] = []

    def before(hook: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        seen.append((hook, [i.plugin_name for i in impls]))

    def after(outcome: pluggy.Result[Any], hook: str, impls: Any, kwargs: Any) -> None:
        results.append(outcome.get_result())

    undo = pm.add_hookcall_monitoring(before, after)
    with RunSession(out_dir=None, plugin_manager=pm) as run:
        run.bus.iteration_started(0)
    hooks = [h for h, _ in seen]
    assert "twinkle_configure" in hooks
    assert "twinkle_iteration_started" in hooks
    assert any(h == "twinkle_event" and "collector" in names for h, names in seen)
    assert len(results) == len(seen)
    undo()
    assert not pm.monitored


def test_timing_without_the_timeline_is_refused_at_start() -> None:
    run = _run(blocked=["timeline"])
    with pytest.raises(PluginError, match="unblock 'timeline'"):
        run.start()
    assert run.state is RunState.FAILED


def test_the_run_refuses_events_that_break_its_lifecycle(tmp_path: Path) -> None:
    with _run(run_id="life") as session:
        run: Run = session.run
        with pytest.raises(RecordError, match="belongs to run 'other', not 'life'"):
            run.submit(IterationStarted("other", 1, 2, 0))
        with pytest.raises(RecordError, match="starts run 'life' a second time"):
            run.submit(RunStarted("life", 1, 2, session.bus.anchor))
    assert session.run.state is RunState.FINISHED
    with pytest.raises(Exception, match="not running"):
        session.run.submit(IterationStarted("life", 1, 2, 0))


def test_states_are_an_enum() -> None:
    run = _run()
    states = [run.state]  # (asserted at the end: mypy keeps an assert's narrowing of run.state)
    with run:
        states.append(run.state)
    states.append(run.state)
    assert states == [RunState.NEW, RunState.RUNNING, RunState.FINISHED]
    assert all(type(state) is RunState for state in states)
    assert isinstance(run.pm, ObserverManager)


def test_a_bus_delivers_to_one_run_and_still_to_its_signals() -> None:
    from twinkle.errors import InvalidArgumentError
    from twinkle.events import iteration_started
    from twinkle.hookspecs import RunContext

    seen: list[int] = []

    def receiver(sender: object, *, event: IterationStarted) -> None:
        seen.append(event.iteration)

    with _run(run_id="one") as session:
        other = Run(make_plugin_manager(autoload=False), RunContext("one", None), background=False)
        other.start()
        with pytest.raises(InvalidArgumentError, match="one run per bus"):
            other.connect(session.bus)
        other.close()
        iteration_started.connect(receiver, sender=session.bus)
        try:
            session.bus.iteration_started(0)
        finally:
            iteration_started.disconnect(receiver)
    assert seen == [0]


class Echo:
    """Publishes from inside a hook (re-entrant) and fails now and then."""

    def __init__(self) -> None:
        self.bus: Any = None

    @hookimpl
    def twinkle_iteration_started(self, event: IterationStarted) -> None:
        if self.bus is not None:
            self.bus.scalars(iteration=event.iteration, name="echo", values={"i": event.iteration})
        if event.iteration == 2:
            raise RuntimeError("echo fails at 2")


READING = MemoryReading("w0", 0, 7, "h", "cpu", 100, 200, None, None, None, None)


def _scripted(tmp: Path, *, background_dispatch: bool, echo: bool = False) -> dict[str, bytes]:
    from twinkle.perf import ManualClock

    clock = ManualClock(1_000)

    def advance(ns: int) -> None:
        """The clock moves only once the dispatch thread dispatched what went before (its
        spans of twinkle's own time take no time, as the publishes' do on this clock)."""
        assert run.dispatcher is not None
        run.dispatcher.flush()
        clock.advance(ns)

    echoes = Echo()
    config = {
        "phases": {"gen": ["generate"], "train": ["train"]},
        "throughput": {"gen": {"samples": "gen", "devices": 2}},
        "window": {"samples": "gen", "devices": 2},
    }
    run = RunSession(
        out_dir=tmp,
        run_id="same",
        config=config,
        clock=clock,
        wall_clock=clock,
        autoload=False,
        plugins=[("echo", echoes)],
        background_dispatch=background_dispatch,
    )
    with run:
        echoes.bus = run.bus if echo else None
        for it in range(6):
            run.bus.iteration_started(it)
            with run.recorder.span("generate", iteration=it):
                advance(700)
            with run.recorder.span("train", iteration=it):
                advance(300)
            run.bus.samples(iteration=it, phase="gen", lengths=[10 + it, 20, 30])
            run.bus.optimizer_step(iteration=it, step=it + 1)
            run.bus.memory([READING], iteration=it)
    names = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json")
    out = {name: (tmp / "same" / name).read_bytes() for name in names}
    assert run.summary is not None and run.summary["observer_failures"] == {"echo": 1}
    return out


def _but_dispatch_spans(log: bytes) -> list[object]:
    """The log's events, less the dispatch thread's spans of twinkle's own time."""
    import msgspec

    from twinkle.events import OVERHEAD_SPAN, SpanBatch, event_from_dict

    events: list[object] = []
    for line in log.splitlines():
        raw = msgspec.json.decode(line)
        raw.pop("seq")
        event = event_from_dict(raw)
        if isinstance(event, SpanBatch):
            kept = [
                s
                for s in event.spans
                if not (s.name == OVERHEAD_SPAN and s.attrs.get("event") == "dispatch")
            ]
            if not kept:
                continue
            event = msgspec.structs.replace(event, spans=tuple(kept))
        events.append(event)
    return events


def test_background_dispatch_writes_what_inline_dispatch_writes(tmp_path: Path) -> None:
    """The same records and events, but for the dispatch thread's spans of twinkle's own
    time (here of no length: the clock moves only while that thread waits)."""
    import orjson

    inline = _scripted(tmp_path / "inline", background_dispatch=False)
    background = _scripted(tmp_path / "background", background_dispatch=True)
    for name in ("metrics_raw.jsonl", "metrics.jsonl"):
        assert background[name] == inline[name], name
    assert b'"dispatch"' not in inline["events.jsonl"]
    assert b'"dispatch"' in background["events.jsonl"]
    assert _but_dispatch_spans(background["events.jsonl"]) == _but_dispatch_spans(
        inline["events.jsonl"]
    )
    # The summary differs only in what the process itself measured, and in the spans
    # of twinkle's own time received.
    a, b = orjson.loads(inline["summary.json"]), orjson.loads(background["summary.json"])
    for summary in (a, b):
        summary.pop("process_wall_seconds")
        summary["spans"]["sources"].pop("twinkle.observers")
    assert a == b


def test_a_hook_publishing_on_the_dispatch_thread_is_queued_behind_its_event(
    tmp_path: Path,
) -> None:
    import orjson

    lines = _scripted(tmp_path, background_dispatch=True, echo=True)["events.jsonl"]
    types = [(e["type"], e.get("iteration")) for e in map(orjson.loads, lines.splitlines())]
    for it in range(6):
        # dispatched (and logged) right after the event whose hook published it
        at = types.index(("iteration_started", it))
        assert types[at + 1] == ("scalars", it)
    assert sum(t == "scalars" for t, _ in types) == 6


def test_a_start_that_fails_early_frees_the_manager(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    pm = make_plugin_manager(autoload=False)
    run = RunSession(out_dir=tmp_path / "file", run_id="r", plugin_manager=pm)
    with pytest.raises(ReporterError, match=r"cannot create the run directory .*file/r"):
        run.start()  # the run directory cannot be made under a file
    # Nothing was opened: the session can start once the cause is fixed.
    assert run.state is RunState.NEW and pm.in_use_by is None
    with RunSession(out_dir=None, run_id="r2", plugin_manager=pm):
        pass  # the manager serves the next run
    (tmp_path / "file").unlink()
    run.start()
    run.finish()


def test_a_bad_terminal_total_can_be_fixed_and_the_run_finished_after(tmp_path: Path) -> None:
    run = RunSession(out_dir=tmp_path, run_id="tt", autoload=False)
    run.start()
    with pytest.raises(RecordError, match=r"terminal_totals"):
        run.finish(terminal_totals={"samples": "12"})  # type: ignore[dict-item]
    with pytest.raises(RecordError, match=r"terminal_totals\['samples'\] = inf"):
        run.finish(terminal_totals={"samples": float("inf")})
    with pytest.raises(RecordError, match=r"terminal_totals\['samples'\] = -5: .*never fewer"):
        run.finish(terminal_totals={"samples": -5})
    assert run.state is RunState.RUNNING
    summary = run.finish(terminal_totals={"samples": 12})
    assert summary["status"] == "ok" and (tmp_path / "tt" / "summary.json").is_file()


def test_a_sink_failing_to_close_is_in_the_summary(tmp_path: Path) -> None:
    import orjson

    class Leaky:
        @hookimpl
        def twinkle_unconfigure(self) -> None:
            raise OSError("cannot close my file")

    with RunSession(out_dir=tmp_path, run_id="leak", autoload=False, plugins=[("leaky", Leaky())]):
        pass
    summary = orjson.loads((tmp_path / "leak" / "summary.json").read_bytes())
    assert summary["observer_failures"] == {"leaky": 1}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({1: 2}, "str keys"),
        # (named as given: the log would hold null, which its check would name)
        ({"window": {"samples": "s", "devices": float("inf")}}, r"config.window.devices is inf:"),
        ({"window": {"samples": "s", "devices": float("nan")}}, r"config.window.devices is nan:"),
        ({"x_lr": float("nan")}, r"config.x_lr is nan: .* has no NaN or infinity"),
        ({"x_sizes": [1.0, {"a": float("-inf")}]}, r"config.x_sizes\[1\].a is -inf"),
    ],
)
def test_a_config_the_log_cannot_carry_as_it_is_is_refused_up_front(
    config: dict[Any, Any], match: str
) -> None:
    from twinkle.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        RunSession(out_dir=None, config=config)


def test_an_event_published_after_the_run_is_an_error() -> None:
    with _run(run_id="late") as session:
        pass
    for iteration in (9, 10):  # every time, not once
        with pytest.raises(TwinkleError, match=r"run 'late' is over \(finished\)"):
            session.bus.iteration_started(iteration)


def test_a_finished_run_is_not_entered_again() -> None:
    with _run(run_id="once") as session:
        pass
    with pytest.raises(TwinkleError, match=r"run 'once' is over \(finished\): a RunSession "):
        session.__enter__()


def test_spans_closed_after_the_finish_are_named_at_the_exit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its bus refuses them: in no run. Nothing on a span's path looks; the exit (its
    atexit handler, called here) says how many each finished run's recorder holds."""
    from twinkle.run._after_finish import say_after_finish

    with _run(run_id="quiet") as quiet:
        pass
    with _run(run_id="late-spans") as session:
        with session.recorder.span("generate", iteration=0):
            pass  # in the run
    for name in ("train.step", "train.step"):  # (a worker thread still timing its work)
        with session.recorder.span(name, iteration=1):
            pass
    # a boundary after the finish is refused as itself, the spans left for the exit
    with pytest.raises(TwinkleError, match=r"cannot publish iteration_started: run 'late-spa"):
        session.bus.iteration_started(1)
    say_after_finish()
    said = [r.getMessage() for r in caplog.records if "run 'late-spans'" in r.getMessage()]
    assert said == [
        "twinkle: 2 span(s) closed on the recorder of run 'late-spans' after it finished "
        "(the first: 'train.step') and are in no run: finish the run after the spans close "
        "(stop the threads that time work first)"
    ]
    assert quiet.recorder.pending() == 0


@pytest.mark.parametrize("name", ["timing", "memory", "iteration", "run", "rollout", "train"])
def test_a_scalar_named_like_the_observers_records_is_refused_naming_it(
    tmp_path: Path, name: str
) -> None:
    config = {
        "phases": {"rollout": ["generate"], "train": ["train.*"]},
        "throughput": {
            "rollout": {"samples": "rollout", "devices": 1},
            "train": {"samples": "train", "devices": 1},
        },
    }
    with RunSession(out_dir=tmp_path, run_id="named", config=config, autoload=False) as run:
        run.bus.iteration_started(0)
        with pytest.raises(InvalidArgumentError, match=rf"scalars name {name!r} is the kind"):
            run.bus.scalars(iteration=0, name=name, values={"x": 1.0})
        run.bus.scalars(iteration=0, name="grpo", values={"x": 1.0})  # the run goes on
    records = list(read_jsonl(tmp_path / "named" / "metrics_raw.jsonl"))
    assert [r["values"] for r in records if r["kind"] == "grpo"] == [{"x": 1.0}]
    assert all("x" not in r["values"] for r in records if r["kind"] == name)


def test_the_reserved_kinds_are_every_kind_the_built_in_observers_make(tmp_path: Path) -> None:
    log = scripted_run(tmp_path, autoload=False)
    made = {r["kind"] for r in read_jsonl(log.parent / "metrics_raw.jsonl")} - {"grpo"}
    # (``driver`` records come of the StreamingDriver's snapshots, which this run has
    # not: tests/observers/test_driver_health.py makes them)
    assert made | {"driver"} == ObserverConfig.parse(SCRIPTED_CONFIG).record_kinds()


def test_without_the_built_in_observers_every_scalar_name_is_free(tmp_path: Path) -> None:
    with RunSession(out_dir=None, autoload=False, builtins=False) as run:
        run.bus.scalars(iteration=0, name="timing", values={"x": 1.0})


@pytest.mark.parametrize("name", ["reward (v2)", "a/b", "ünï", ""])
def test_a_scalar_name_that_cannot_be_a_record_kind_is_refused_naming_it(name: str) -> None:
    with RunSession(out_dir=None, autoload=False) as run:
        with pytest.raises(InvalidArgumentError, match="cannot be its records' kind"):
            run.bus.scalars(iteration=0, name=name, values={"x": 1.0})
        run.bus.scalars(iteration=0, name="reward.v2", values={"x": 1.0})  # goes on


@pytest.mark.parametrize(("options", "name"), [({}, "main"), ({"source": "trainer"}, "trainer")])
def test_the_processs_memory_is_named_as_its_spans_are(options: dict[str, Any], name: str) -> None:
    collector = Collector()
    events = collector.events
    with _run(builtins=False, plugins=[("collector", collector)], **options) as run:
        run.bus.iteration_started(0)
        with run.recorder.span("train.step"):
            pass
        run.read_memory(iteration=0)
        run.read_memory(iteration=0, worker_id="w7")
    spans = {e.source for e in events if e.TYPE == "spans"} - {"twinkle.observers"}
    readings = [r.worker_id for e in events if e.TYPE == "memory" for r in e.readings]
    assert spans == {name} and readings == [name, "w7"]


@pytest.mark.parametrize(("log", "said"), [(None, "was deleted"), (b"", "is empty")])
def test_records_without_their_log_refuse_a_new_run_saying_what_became_of_the_log(
    tmp_path: Path, log: bytes | None, said: str
) -> None:
    """An earlier run's records beside no event log, or an emptied one: a new run there
    would add its iterations to them. Refused, saying which the log is; nothing changed."""
    run = scripted_run(tmp_path, "earlier", iterations=2).parent
    records = (run / "metrics_raw.jsonl").read_bytes()
    (run / "events.jsonl").unlink()
    if log is not None:
        (run / "events.jsonl").write_bytes(log)
    with pytest.raises(
        ReporterError, match=rf"but no event log \(events\.jsonl {said}\): a new run there"
    ):
        with RunSession(out_dir=tmp_path, run_id="earlier", autoload=False):
            pass
    assert (run / "metrics_raw.jsonl").read_bytes() == records
