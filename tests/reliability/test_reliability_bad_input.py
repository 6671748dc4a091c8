"""Bad input across the public API: a clear error naming the culprit, or a documented
skip with a count — never a silent wrong figure.

The tables cover events, records, metric arguments, reporters, sessions, the command
line and corrupted ``events.jsonl`` lines; the fuzz tests throw arbitrary bytes at the
JSONL reader and arbitrary corruption at replay.
"""

from __future__ import annotations

import atexit
import functools
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _recompute import span_list
from reliability._cases import Case
from reliability._scripted import scripted_run
from reliability._sizes import DEFAULT, SOAK, soak_enabled
from twinkle.cli import main
from twinkle.errors import (
    ConfigError,
    InvalidArgumentError,
    PluginError,
    RecordError,
    ReplayError,
    ReporterError,
    TwinkleError,
)
from twinkle.events import EventBus, event_from_dict
from twinkle.hookspecs import hookimpl
from twinkle.metric import ThroughputMetric
from twinkle.metric.memory import convert_bytes
from twinkle.perf import Span, TimeRecorder
from twinkle.plugins import make_plugin_manager
from twinkle.reporting import (
    JsonlBackend,
    JsonlWriter,
    MetricsReporter,
    make_record,
    read_jsonl,
    record_from_dict,
)
from twinkle.run import RunSession, replay

FUZZ_EXAMPLES = (SOAK if soak_enabled() else DEFAULT).fuzz_examples


def bus() -> EventBus:
    return EventBus("r", clock=lambda: 5, wall_clock=lambda: 7)


def record(**over: Any) -> Any:
    fields: dict[str, Any] = dict(
        kind="train",
        scope="iteration",
        run_id="r",
        step=0,
        iteration=0,
        wall_ns=0,
        monotonic_ns=0,
        values={"x": 1},
    )
    return make_record(**{**fields, **over})


class Typo:
    @hookimpl
    def twinkle_iteration_begun(self, event: Any) -> None: ...


def a_span(**over: Any) -> dict[str, Any]:
    return {"name": "s", "start_ns": 0, "end_ns": 1, "thread_id": 1, "pid": 1, "attrs": {}} | over


# (each ``type: ignore`` below: the wrong type passed is the point of its case)
API_CASES = [
    # events, through the bus (validated before any observer sees them)
    Case(
        "iteration<0",
        lambda _: bus().iteration_started(-1),
        RecordError,
        r"^iteration_started\.iteration = -1: expected `int` >= 0$",
    ),
    Case(
        "iteration str",
        lambda _: bus().iteration_started("3"),  # type: ignore[arg-type]
        RecordError,
        r"iteration_started\.iteration = '3': expected `int`, got `str`",
    ),
    Case(
        "length<0",
        lambda _: bus().samples(iteration=0, phase="p", lengths=[3, -1]),
        RecordError,
        r"samples\.lengths\[1\] = -1: expected `int` >= 0",
    ),
    Case(
        "length bool",
        lambda _: bus().samples(iteration=0, phase="p", lengths=[True]),
        RecordError,
        r"samples\.lengths\[0\] = True: expected `int`, got `bool`",
    ),
    Case(
        "length huge",
        lambda _: bus().samples(iteration=0, phase="p", lengths=[2**53]),
        RecordError,
        r"samples\.lengths\[0\] = 9007199254740992: expected `int` <= 2\*\*53 - 1",
    ),
    Case(
        "phase empty",
        lambda _: bus().samples(iteration=0, phase="", lengths=[1]),
        RecordError,
        r"samples\.phase = '': expected `str` of length >= 1",
    ),
    Case(
        "step 0",
        lambda _: bus().optimizer_step(iteration=0, step=0),
        RecordError,
        r"optimizer_step\.step = 0: expected `int` >= 1",
    ),
    Case(
        "scalar str",
        lambda _: bus().scalars(iteration=0, name="g", values={"loss": "hi"}),  # type: ignore[dict-item]
        RecordError,
        r"scalars\.values\['loss'\] = 'hi': expected `int \| float \| null`, got `str`",
    ),
    Case(
        "scalar 2**70",
        lambda _: bus().scalars(iteration=0, name="g", values={"n": 2**70}),
        RecordError,
        r"scalars\.values\['n'\] = 1180591620717411303424: expected `int` <= 2\*\*63 - 1",
    ),
    Case(
        "weights backwards",
        lambda _: bus().weights_published(1, start_ns=10, end_ns=5, acks=[("e", 5)]),
        RecordError,
        r"weights_published\.end_ns \(5\) is before start_ns \(10\)",
    ),
    Case(
        "ack engine empty",
        lambda _: bus().weights_published(1, start_ns=1, end_ns=5, acks=[("", 5)]),
        RecordError,
        r"weights_published\.acks\[0\]\.engine",
    ),
    Case(
        "snapshot object",
        lambda _: bus().snapshot({"ok": 1, "obj": object()}),
        RecordError,
        r"snapshot\.state\['obj'\] is not JSON",
    ),
    Case(
        "memory not a reading",
        lambda _: bus().memory([{"rss": 1}], iteration=0),  # type: ignore[list-item]
        RecordError,
        r"memory\.readings\[0\] has unknown field\(s\) \['rss'\]",
    ),
    Case(
        "status",
        lambda _: bus().run_finished(status="meh"),  # type: ignore[arg-type]
        RecordError,
        r"run_finished\.status = 'meh': invalid enum value 'meh'",
    ),
    Case(
        "terminal total str",
        lambda _: bus().run_finished(terminal_totals={"samples": "12"}),  # type: ignore[dict-item]
        RecordError,
        r"run_finished\.terminal_totals\['samples'\]",
    ),
    Case(
        "span dict",
        lambda _: bus().publish_spans("w", TimeRecorder().anchor, [a_span()]),
        RecordError,
        r"spans\.spans\[0\] lacks field\(s\) \['error'\]",
    ),
    Case(
        "span backwards",
        lambda _: bus().publish_spans(
            "w", TimeRecorder().anchor, [Span.from_dict(a_span(start_ns=9, end_ns=1, error=None))]
        ),
        RecordError,
        r"span\(s\) ending before they start were left out: 's' \(source 'w': 9 -> 1\)",
    ),
    Case(
        "source empty",
        lambda _: bus().attach(TimeRecorder(), source=""),
        InvalidArgumentError,
        r"source must be a non-empty string, got ''",
    ),
    Case(
        "bus run_id",
        lambda _: EventBus(""),
        InvalidArgumentError,
        r"run_id '' is not a safe name",
    ),
    # records
    Case("kind empty", lambda _: record(kind=""), RecordError, r"kind must be .*got ''"),
    Case("scope", lambda _: record(scope="epoch"), RecordError, r"scope must be one of .*'epoch'"),
    Case("value str", lambda _: record(values={"a": "x"}), RecordError, r"values\['a'\] = 'x'"),
    Case("value key int", lambda _: record(values={1: 2}), RecordError, r"values key 1"),
    Case("step<0", lambda _: record(step=-1), RecordError, r"step must be an int >= 0, got -1"),
    Case(
        "attrs object",
        lambda _: record(attrs={"o": object()}),
        RecordError,
        r"attrs\['o'\] = .* is not a JSON value",
    ),
    Case(
        "record run_id",
        lambda _: record(run_id="../up"),
        RecordError,
        r"run_id '\.\./up' is not a safe name",
    ),
    Case(
        "record dict",
        lambda _: record_from_dict({"kind": "k"}),
        RecordError,
        r"record dict lacks \['scope'",
    ),
    # metric arguments
    Case(
        "tokens<0",
        lambda _: ThroughputMetric().accumulate(lengths=[-1], seconds=1.0, devices=1),
        InvalidArgumentError,
        r"lengths\[0\] must be a token count",
    ),
    Case(
        "seconds nan",
        lambda _: ThroughputMetric().accumulate(lengths=[1], seconds=float("nan"), devices=1),
        InvalidArgumentError,
        r"seconds must be .*got nan",
    ),
    Case(
        "devices 0",
        lambda _: ThroughputMetric().accumulate(lengths=[1], seconds=1.0, devices=0),
        InvalidArgumentError,
        r"devices must be .*got 0",
    ),
    Case("unit", lambda _: convert_bytes(1, "GB"), InvalidArgumentError, r"unit .*got 'GB'"),
    # reporters and the JSONL writer/reader
    Case(
        "queue_size",
        lambda _: MetricsReporter([], run_id="r", queue_size=0),
        InvalidArgumentError,
        r"queue_size must be an int >= 1 .*got 0",
    ),
    Case(
        "on_full",
        lambda _: MetricsReporter([], run_id="r", on_full="later"),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"on_full must be .*got 'later'",
    ),
    Case(
        "backend",
        lambda _: MetricsReporter([object()], run_id="r"),  # type: ignore[list-item]
        InvalidArgumentError,
        r"backends\[0\] = .* lacks \['write', 'flush', 'close'\]",
    ),
    Case(
        "report not a record",
        lambda _: MetricsReporter([], run_id="r").report("x"),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"report\(\) takes a MetricRecord .*'x'",
    ),
    Case(
        "report other run",
        lambda _: MetricsReporter([], run_id="r").report(record(run_id="q")),
        RecordError,
        r"record of run 'q' reported to the reporter of run 'r'",
    ),
    Case(
        "writer path",
        lambda _: JsonlWriter(123),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"path must be a str or os\.PathLike, got 123",
    ),
    Case("writer dir", JsonlWriter, ReporterError, r"is a directory"),
    Case(
        "backend under a file",
        lambda tmp: JsonlBackend(tmp / "log" / "x.jsonl"),
        ReporterError,
        r"'.*/log'.*(Not a directory|a parent of the path is a file)",
    ),
    Case(
        "on_error",
        lambda tmp: read_jsonl(tmp / "x", on_error="ignore"),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"on_error must be 'raise' or 'skip', got 'ignore'",
    ),
    Case(
        "object not JSON",
        lambda tmp: JsonlWriter(tmp / "o.jsonl").write([{"a": {1, 2}}]),
        RecordError,
        r"object 0 of the batch .* is not strict JSON",
    ),
    # sessions and plugins
    Case(
        "run_id traversal",
        lambda tmp: RunSession(out_dir=tmp, run_id="../escape"),
        InvalidArgumentError,
        r"run_id '\.\./escape' is not a safe name",
    ),
    Case(
        "config phase",
        lambda tmp: RunSession(out_dir=tmp, run_id="c", config={"phases": {"train": "train.*"}}),
        ConfigError,
        r"config\.phases\['train'\]",
    ),
    Case(
        "config key",
        lambda tmp: RunSession(out_dir=tmp, run_id="c", config={"bogus": 1}),
        ConfigError,
        r"unknown observer config key\(s\) \['bogus'\]",
    ),
    Case(
        "config devices",
        lambda tmp: RunSession(
            out_dir=tmp, run_id="c", config={"window": {"samples": "s", "devices": 0}}
        ),
        ConfigError,
        r"config\.window\.devices must be a positive, finite number",
    ),
    Case(
        "config object",
        lambda tmp: RunSession(out_dir=tmp, run_id="c", config={"x_obj": object()}),
        ConfigError,
        r"config must hold only JSON values",
    ),
    Case(
        "config list",
        lambda tmp: RunSession(out_dir=tmp, run_id="c", config=[1]),  # type: ignore[arg-type]
        InvalidArgumentError,
        r"config must be a mapping .*\[1\]",
    ),
    Case(
        "hook typo",
        lambda _: make_plugin_manager(autoload=False, builtins=False, plugins=[("typo", Typo())]),
        PluginError,
        r"twinkle_iteration_begun",
    ),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.name for c in API_CASES])
def test_bad_api_input_raises_a_clear_error_naming_the_culprit(case: Case, tmp_path: Path) -> None:
    (tmp_path / "log").write_text("a file where a directory is expected\n")
    with pytest.raises(case.error, match=case.match) as info:
        case.call(tmp_path)
    assert isinstance(info.value, TwinkleError)


# -- corrupted event logs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def log_lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    log = scripted_run(tmp_path_factory.mktemp("valid"), run_id="valid")
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def first(lines: list[dict[str, Any]], kind: str) -> int:
    return next(i for i, o in enumerate(lines) if o["type"] == kind)


Edit = Callable[[list[Any]], None]


def set_field(kind: str, key: str, value: Any) -> Edit:
    def edit(lines: list[Any]) -> None:
        lines[first(lines, kind)][key] = value

    return edit


def rename_field(kind: str, key: str, new: str) -> Edit:
    def edit(lines: list[Any]) -> None:
        o = lines[first(lines, kind)]
        o[new] = o.pop(key)

    return edit


def replace_line(kind: str, raw: bytes) -> Edit:
    def edit(lines: list[Any]) -> None:
        lines[first(lines, kind)] = raw

    return edit


def _span_backwards(lines: list[Any]) -> None:
    lines[first(lines, "spans")]["columns"]["dur"][0] = -1


def _as_rows(line: dict[str, Any]) -> list[dict[str, Any]]:
    """``line``'s spans as the list of objects an older twinkle wrote (now in place)."""
    rows = span_list(line)
    line["spans"] = rows
    del line["columns"]
    return rows


def _old_span_backwards(lines: list[Any]) -> None:
    span = _as_rows(lines[first(lines, "spans")])[0]
    span["end_ns"] = span["start_ns"] - 1


def _columns_and_rows(lines: list[Any]) -> None:
    line = lines[first(lines, "spans")]
    line["spans"] = span_list(line)


def _second_run_started(lines: list[Any]) -> None:
    lines.insert(3, dict(lines[0]))


def _second_run_finished(lines: list[Any]) -> None:
    lines.append(dict(lines[first(lines, "run_finished")]))


def _torn_middle(lines: list[Any]) -> None:
    i = first(lines, "samples")
    lines[i] = orjson.dumps(lines[i])[:30]


def _drop_run_started(lines: list[Any]) -> None:
    del lines[0]


LOG_CASES: list[tuple[str, Edit, str]] = [
    (
        "invalid JSON",
        replace_line("samples", b'{"type": "samples", oops}'),
        r":{line}: invalid JSON",
    ),
    (
        "JSON array",
        replace_line("samples", b"[1, 2]"),
        r":{line}: expected a JSON object, got list",
    ),
    ("torn middle line", _torn_middle, r":{line}: invalid JSON.*never skipped"),
    (
        "unknown type",
        set_field("samples", "type", "samplez"),
        r":{line}: unknown event type 'samplez'",
    ),
    (
        "missing field",
        lambda ls: ls[first(ls, "samples")].pop("lengths"),
        r":{line}: event 'samples' lacks field\(s\) \['lengths'\]",
    ),
    (
        "mistyped key",
        rename_field("samples", "groups", "groupz"),
        r":{line}: event 'samples' has unknown field\(s\) \['groupz'\]",
    ),
    (
        "iteration str",
        set_field("iteration_started", "iteration", "1"),
        r":{line}: iteration_started\.iteration = '1': expected `int`, got `str`",
    ),
    ("negative length", set_field("samples", "lengths", [-4]), r":{line}: samples\.lengths\[0\]"),
    ("float length", set_field("samples", "lengths", [4.5]), r":{line}: samples\.lengths\[0\]"),
    (
        "other run",
        set_field("optimizer_step", "run_id", "other"),
        r":{line}: event 'optimizer_step' belongs to run 'other', not 'valid'",
    ),
    (
        "second run_started",
        _second_run_started,
        r":4: event run_started starts run 'valid' a second time",
    ),
    (
        "second run_finished",
        _second_run_finished,
        r":{line}: event run_finished finishes segment 0 of run 'valid' a second time",
    ),
    ("no run_started", _drop_run_started, r"must start with a run_started event, got 'spans'"),
    (
        "run_id traversal",
        set_field("run_started", "run_id", "../evil"),
        r":1: event 'run_started': run_id '\.\./evil' is not a safe name",
    ),
    (
        "span backwards",
        _span_backwards,
        r":{line}: spans\.columns\.dur\[0\] = -1: expected `int` >= 0",
    ),
    (
        "span pid str",
        lambda ls: ls[first(ls, "spans")]["columns"]["pids"].__setitem__(0, "7"),
        r":{line}: spans\.columns\.pids\[0\] = '7': expected `int`, got `str`",
    ),
    (
        "span name index past its table",
        lambda ls: ls[first(ls, "spans")]["columns"].update(name=[5], names=["a", "b"]),
        r":{line}: spans\.columns\.name holds index 5, past the 2 entries of spans\.columns\.names",
    ),
    (
        "old log: span backwards",
        _old_span_backwards,
        r":{line}: spans\.spans\[0\] .* ends before it starts",
    ),
    (
        "old log: span pid str",
        lambda ls: _as_rows(ls[first(ls, "spans")])[0].update(pid="7"),
        r":{line}: spans\.spans\[0\]\.pid = '7': expected `int`, got `str`",
    ),
    (
        "span columns and rows",
        _columns_and_rows,
        r":{line}: event 'spans' needs its spans as 'columns'",
    ),
    (
        "config unusable",
        lambda ls: ls[0]["config"].update(window={"samples": "x", "devices": -1}),
        r"run_started event: config\.window\.devices must be a positive, finite number",
    ),
    (
        "config not a dict",
        set_field("run_started", "config", 5),
        r":1: run_started\.config = 5: expected `object`, got `int`",
    ),
    (
        "reading rss str",
        lambda ls: ls[first(ls, "memory")]["readings"][0].update(host_rss_bytes="1G"),
        r":{line}: memory\.readings\[0\]\.host_rss_bytes = '1G': expected `int`, got `str`",
    ),
    (
        "ack time str",
        lambda ls: ls[first(ls, "weights_published")]["acks"][0].update(acked_ns="x"),
        r":{line}: weights_published\.acks\[0\]\.acked_ns = 'x': expected `int`, got `str`",
    ),
    (
        "totals not a dict",
        set_field("run_finished", "terminal_totals", 3),
        r":{line}: run_finished\.terminal_totals = 3: expected `object`, got `int`",
    ),
    (
        "wall time str",
        set_field("run_finished", "process_wall_ns", "soon"),
        r":{line}: run_finished\.process_wall_ns = 'soon': expected `int \| null`, got `str`",
    ),
    (
        "error not str",
        set_field("run_finished", "error", 5),
        r":{line}: run_finished\.error = 5: expected `str \| null`, got `int`",
    ),
]


def write_log(path: Path, lines: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines)
    )


@pytest.mark.parametrize(("name", "edit", "match"), LOG_CASES, ids=[c[0] for c in LOG_CASES])
def test_corrupted_event_log_line_is_refused_naming_file_and_line(
    tmp_path: Path, log_lines: list[dict[str, Any]], name: str, edit: Edit, match: str
) -> None:
    lines: list[Any] = json.loads(json.dumps(log_lines))
    before = [orjson.dumps(x) for x in lines]
    edit(lines)
    after = [x if isinstance(x, bytes) else orjson.dumps(x) for x in lines]
    changed = next((i + 1 for i, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
    path = tmp_path / "log" / "events.jsonl"
    write_log(path, lines)
    with pytest.raises(ReplayError, match=match.format(line=changed)) as info:
        replay(path, tmp_path / "out", autoload=False)
    if "{line}" in match:
        assert str(path) in str(info.value)
    # Nothing half-done: no output files for a log refused before its first event.
    if name in ("no run_started", "run_id traversal", "config unusable", "config not a dict"):
        assert not (tmp_path / "out").exists()


# -- the command line ---------------------------------------------------------------------


def cli_cases(tmp: Path, log: Path) -> list[tuple[str, list[str], str]]:
    (tmp / "a-file").write_text("x")
    bad = tmp / "bad" / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(b"".join([*lines[:4], b"not json\n", *lines[4:]]))
    return [
        (
            "missing log",
            ["replay", str(tmp / "nope.jsonl"), "--out", str(tmp / "o")],
            r"'.*nope\.jsonl' does not exist or is not a file: give a run's directory",
        ),
        (
            "out is a file",
            ["replay", str(log), "--out", str(tmp / "a-file")],
            r"replay output '.*a-file' exists and is not a directory",
        ),
        (
            "out is the log dir",
            ["replay", str(log), "--out", str(log.parent)],
            r"is the log's own directory",
        ),
        (
            "corrupt log",
            ["replay", str(bad), "--out", str(tmp / "o2")],
            r"bad/events\.jsonl:5: invalid JSON",
        ),
        (
            "demo run-id",
            ["demo", "--run-id", "../../etc"],
            r"--run-id '\.\./\.\./etc' is not a safe name",
        ),
        ("demo run-id slash", ["demo", "--run-id", "a/b"], r"--run-id 'a/b' is not a safe name"),
    ]


ARGPARSE_CASES = [
    ("no command", [], r"required: COMMAND"),
    ("unknown command", ["frobnicate"], r"invalid choice: 'frobnicate'"),
    ("replay without log", ["replay"], r"EVENTS_JSONL"),
    ("replay without out", ["replay", "x.jsonl"], r"--out"),
    ("demo iterations", ["demo", "--iterations", "many"], r"invalid int value: 'many'"),
    ("unknown option", ["replay", "x", "--out", "y", "--fast"], r"unrecognized arguments: --fast"),
]


def test_cli_errors_exit_2_with_a_message_naming_the_culprit(
    tmp_path: Path, log_lines: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run" / "events.jsonl"
    write_log(log, log_lines)
    for name, argv, match in cli_cases(tmp_path, log):
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("twinkle: error: "), name
        assert re.search(match, err), f"{name}: {err!r}"
    for name, argv, match in ARGPARSE_CASES:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, name
        err = capsys.readouterr().err
        assert re.search(match, err), f"{name}: {err!r}"
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2" / "summary.json").exists()


def test_cli_replay_of_a_torn_log_warns_and_counts(
    tmp_path: Path, log_lines: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run" / "events.jsonl"
    finished = first(log_lines, "run_finished")  # killed as it wrote it: no backends_closed
    write_log(log, log_lines[:finished])
    with log.open("ab") as f:
        f.write(orjson.dumps(log_lines[finished])[:40])
    assert main(["replay", str(log), "--out", str(tmp_path / "out"), "--no-autoload"]) == 0
    captured = capsys.readouterr()
    assert f"replayed {finished} events" in captured.out
    assert re.search(rf"passed over the torn last line {finished + 1} .*\(40 byte", captured.err)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "error" and "torn last line" in summary["error"]


# -- fuzzing ------------------------------------------------------------------------------


@functools.cache
def fuzz_dir() -> Path:
    """One scratch directory for every fuzz example (removed at exit)."""
    path = Path(tempfile.mkdtemp(prefix="twinkle-fuzz-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


json_lines = st.lists(
    st.one_of(
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
            lambda d: json.dumps(d).encode()
        ),
        st.sampled_from([b"", b"   ", b"[1]", b'"s"', b"3", b"null", b"{", b'{"a":', b"\xff\xfe"]),
        st.binary(max_size=30).filter(lambda b: b"\n" not in b),
    ),
    max_size=12,
).map(b"\n".join)


def _expected_objects(data: bytes) -> list[tuple[int, Any]]:
    """(line number, parsed value or None for not-JSON) of every non-blank line."""
    out = []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except (ValueError, RecursionError):
            out.append((n, None))
    return out


def read_jsonl_property(data: bytes, torn: bool) -> None:
    """``read_jsonl`` on any bytes yields dicts, or raises a RecordError naming a line that
    is not a JSON object (after yielding every object before it); nothing else."""
    path = fuzz_dir() / "fuzz.jsonl"
    path.write_bytes(data)
    reader = read_jsonl(path, allow_torn_tail=torn)
    got: list[dict[str, Any]] = []
    try:
        got.extend(reader)
    except RecordError as exc:
        m = re.match(rf"{re.escape(str(path))}:(\d+): ", str(exc))
        assert m, str(exc)
        bad = int(m.group(1))
        line = data.split(b"\n")[bad - 1]
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None
        assert not isinstance(value, dict), f"line {bad} is a JSON object yet refused"
        last = data.split(b"\n")[-1]
        assert not (torn and bad == data.count(b"\n") + 1 and last), "torn tail not passed over"
        # everything before the bad line was yielded, in order
        assert len(got) == sum(
            1 for n, v in _expected_objects(data) if n < bad and isinstance(v, dict)
        )
        return
    assert all(type(o) is dict for o in got)
    expected = [v for _, v in _expected_objects(data) if isinstance(v, dict)]
    assert len(got) == len(expected)
    if reader.torn_line is not None:
        assert torn and not data.endswith(b"\n") and reader.torn_line == data.count(b"\n") + 1


# replay fuzzing: arbitrary corruption of a valid log


@dataclass(frozen=True)
class ValidLog:
    lines: list[bytes]
    events: list[Any]
    summary: dict[str, Any]


def _without_seq(line: dict[str, Any]) -> dict[str, Any]:
    line.pop("seq", None)  # the line's place in the log, not a field of the event
    return line


@functools.cache
def valid_log() -> ValidLog:
    """The log the replay fuzz corrupts (recorded once, on first use)."""
    log = scripted_run(Path(tempfile.mkdtemp(dir=fuzz_dir())), run_id="fuzz")
    lines = log.read_bytes().splitlines()
    return ValidLog(
        lines,
        [event_from_dict(_without_seq(orjson.loads(line))) for line in lines],
        json.loads((log.parent / "summary.json").read_text()),
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def corrupted_logs(draw: st.DrawFn) -> bytes:
    valid = valid_log().lines
    raw = b"\n".join(valid) + b"\n"
    kind = draw(st.sampled_from(["value", "delete key", "bytes", "truncate", "swap", "dup"]))
    if kind in ("value", "delete key"):
        lines = [orjson.loads(line) for line in valid]
        i = draw(st.integers(0, len(lines) - 1))
        path = draw(st.sampled_from(_paths(lines[i])))
        parent = lines[i]
        for k in path[:-1]:
            parent = parent[k]
        if kind == "delete key" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
        # the standard library writes any int (orjson stops at 64 bits) and Infinity
        return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)
    if kind == "bytes":
        pos = draw(st.integers(0, len(raw) - 1))
        cut = draw(st.integers(0, 8))
        return raw[:pos] + draw(st.binary(max_size=6)) + raw[pos + cut :]
    if kind == "truncate":
        return raw[: draw(st.integers(0, len(raw)))]
    i = draw(st.integers(1, len(valid) - 2))
    lines = list(valid)
    if kind == "swap":
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    else:
        lines.insert(i, lines[i])
    return b"\n".join(lines) + b"\n"


def replay_property(data: bytes) -> None:
    """Replay of a corrupted log raises ReplayError or uses every line of it."""
    path = fuzz_dir() / "corrupt" / "events.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    try:
        result = replay(path, None, autoload=False)
    except ReplayError as exc:
        assert str(exc)
        return
    # Success: every line became an event (nothing skipped), except a torn last line,
    # which is reported; and a log that decodes to the original events replays to the
    # original summary (no silent wrong figure from a harmless change).
    lines = [line for line in data.split(b"\n") if line.strip()]
    if result.torn_line is not None:
        assert not data.endswith(b"\n")
        lines = lines[:-1]
    assert result.events == len(lines)
    decoded = [event_from_dict(_without_seq(orjson.loads(line))) for line in lines]
    if decoded == valid_log().events:
        drop = ("process_wall_seconds",)
        summary = {k: v for k, v in result.summary.items() if k not in drop}
        assert summary == {k: v for k, v in valid_log().summary.items() if k not in drop}


def _fuzz(examples: int, strategy: Any, prop: Callable[..., None]) -> Any:
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))(
        given(**strategy)(prop)
    )


_READ = {"data": st.one_of(st.binary(max_size=400), json_lines), "torn": st.booleans()}
_REPLAY = {"data": corrupted_logs()}

test_fuzz_read_jsonl_yields_dicts_or_names_the_bad_line = _fuzz(
    FUZZ_EXAMPLES, _READ, read_jsonl_property
)
test_fuzz_replay_of_a_corrupted_log_fails_clearly_or_uses_every_line = _fuzz(
    FUZZ_EXAMPLES, _REPLAY, replay_property
)
test_soak_fuzz_read_jsonl = pytest.mark.soak(_fuzz(SOAK.fuzz_examples, _READ, read_jsonl_property))
test_soak_fuzz_replay = pytest.mark.soak(_fuzz(SOAK.fuzz_examples, _REPLAY, replay_property))
