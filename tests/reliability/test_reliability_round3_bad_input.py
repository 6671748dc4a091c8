"""The bad input of reliability round 3 (issue 26): input that was taken silently, lost
a record or ended in a traceback, and what it gets now — a clear error at the call that
names the culprit and the fix (or a warning, where the input is legitimate but risky),
with nothing recorded before it lost and every replay still byte-identical.

1. a scalar key that cannot name its figure; 2. a worker taking twinkle's own source
name; 3. one TwinkleCallback given to two trainers; 4. options taken silently; 5. a
report without ``iteration=`` and a span attribute whose ``repr`` raises; 6. the README's
TRL example finishing its run on SIGTERM.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import signal
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from _recompute import span_list
from twinkle.checks import OWN_SOURCE_PREFIX
from twinkle.engines import Engine, EnginePool, StartContext
from twinkle.engines.vllm import VllmConfig
from twinkle.errors import InvalidArgumentError, RecordError, TwinkleError
from twinkle.events import OVERHEAD_SOURCE, ScalarsObserved
from twinkle.perf import Span, TimeRecorder, WorkerRecorder
from twinkle.run import RunSession, SignalInterrupt, finish_on_signals, replay

ROOT = Path(__file__).parents[2]
FILES = ("events.jsonl", "metrics_raw.jsonl", "metrics.jsonl", "summary.json", "trace.json")


def session(tmp: Path, **kw: Any) -> RunSession:
    return RunSession(
        out_dir=tmp, run_id=kw.pop("run_id", "r"), autoload=False, background_writer=False, **kw
    )


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]


def assert_replays_identically(run_dir: Path, out: Path) -> None:
    replay(run_dir, out)
    for name in FILES:
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name


# -- 1. scalar keys -----------------------------------------------------------------------

BAD_KEYS = [
    ("", "is empty: give every figure a name"),
    ("/loss", "has an empty part between '/'s"),
    ("loss/", "has an empty part between '/'s"),
    ("rewards//mean", "has an empty part between '/'s.*drop the extra '/'"),
    ("a\nb", r"holds the control character '\\n'"),
    ("\x1b[31mred", r"holds the control character '\\x1b'"),
    ("\u202eevil", r"holds the control character '\\u202e'"),
    ("\ud800", "is not valid UTF-8 .*lone surrogate"),
]


@pytest.mark.parametrize("key, why", BAD_KEYS, ids=[repr(k) for k, _ in BAD_KEYS])
def test_a_scalar_key_that_cannot_name_its_figure_is_refused_at_the_call(
    tmp_path: Path, key: str, why: str
) -> None:
    named = re.escape(f"scalars 'grpo': values key {key!r}") + " " + why
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        run.bus.scalars(iteration=0, name="grpo", values={"loss": 0.5})
        with pytest.raises(InvalidArgumentError, match=named):
            run.bus.scalars(iteration=0, name="grpo", values={key: 1.5, "ok": 2})
        made = ScalarsObserved(run.run_id, run.bus.now_ns(), 1, 0, "grpo", {key: 1.0})
        with pytest.raises(InvalidArgumentError, match=named):
            run.bus.publish(made)  # the event built by hand: refused the same
        run.bus.scalars(iteration=0, name="grpo", values={"reward": 1.0})
    assert run.failures == {}  # no observer lost a record (it did: the whole record)
    keys = [set(e["values"]) for e in events(tmp_path / "r") if e["type"] == "scalars"]
    assert keys == [{"loss"}, {"reward"}]
    line = orjson.loads((tmp_path / "r" / "metrics.jsonl").read_bytes().splitlines()[0])
    assert line["grpo/loss"] == 0.5 and line["grpo/reward"] == 1.0
    assert_replays_identically(tmp_path / "r", tmp_path / "again")


def test_a_slash_inside_a_scalar_key_groups_its_figure(tmp_path: Path) -> None:
    """The first '/' of a flat name ends the kind (a kind has none), so a '/' inside a
    key is unambiguous: TRL logs its figures so (``rewards/accuracy/mean``)."""
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        run.bus.scalars(iteration=0, name="trl", values={"rewards/accuracy/mean": 0.25})
    line = orjson.loads((tmp_path / "r" / "metrics.jsonl").read_bytes().splitlines()[0])
    assert line["trl/rewards/accuracy/mean"] == 0.25


# -- 2. twinkle's own source name ---------------------------------------------------------


def test_a_worker_cannot_take_twinkles_own_source_name(tmp_path: Path) -> None:
    assert OVERHEAD_SOURCE.startswith(OWN_SOURCE_PREFIX)
    reserved = r"'twinkle\.observers' is reserved: span sources starting 'twinkle\.' .*'engine0'"
    with pytest.raises(InvalidArgumentError, match=rf"worker {reserved}"):
        WorkerRecorder(OVERHEAD_SOURCE)
    worker = WorkerRecorder("w1")
    with worker.span("generate"):
        pass
    report = msgspec.structs.replace(worker.report(memory=True), worker=OVERHEAD_SOURCE)
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        with pytest.raises(InvalidArgumentError, match=rf"report\.worker {reserved}"):
            run.receive(report, iteration=0)
        with pytest.raises(InvalidArgumentError, match=rf"source {reserved}"):
            run.bus.attach(TimeRecorder(), source=OVERHEAD_SOURCE)
        with pytest.raises(InvalidArgumentError, match=r"source 'twinkle\.engine0' is reserved"):
            run.bus.publish_spans("twinkle.engine0", run.bus.anchor, [])
    logged = events(tmp_path / "r")
    assert not [e for e in logged if e["type"] == "memory"]  # nothing of the report
    own = [s["name"] for e in logged if e["type"] == "spans" for s in span_list(e)]
    assert set(own) == {"twinkle.observe"}  # the source holds twinkle's own spans only
    assert run.summary is not None
    assert set(run.summary["spans"]["sources"]) == {OVERHEAD_SOURCE}


# -- 3. one TwinkleCallback, two trainers -------------------------------------------------


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A tokenizer and a tokenised dataset for a tiny transformers Trainer (CPU)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    from twinkle.demo.hf import write_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    texts = ["<s>12<sep>21</s>", "<s>3456<sep>6543</s>", "<s>7<sep>7</s>"] * 6
    return tokenizer, Dataset.from_dict(dict(tokenizer(texts)))


def tiny_trainer(
    tmp: Path,
    hf: tuple[Any, Any],
    callbacks: list[Any],
    *,
    steps: int = 3,
    collator: Callable[[list[Any]], Any] | None = None,
) -> Any:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from twinkle.demo.hf import tiny_llama

    tokenizer, data = hf
    return Trainer(
        model=tiny_llama(seed=1),
        args=TrainingArguments(
            output_dir=str(tmp / "hf"),
            per_device_train_batch_size=3,
            max_steps=steps,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            logging_steps=1,
        ),
        train_dataset=data,
        data_collator=collator or DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=callbacks,
    )


def test_a_callback_given_to_a_second_trainer_is_refused_and_the_first_run_goes_on(
    tmp_path: Path, hf: tuple[Any, Any]
) -> None:
    from transformers import TrainerCallback

    from twinkle.integrations.trl import TwinkleCallback

    refusal = (
        r"already observes another trainer \(Trainer at 0x[0-9a-f]+\), so it cannot observe "
        r"this Trainer too: .*pass each trainer a TwinkleCallback of its own"
    )
    shared = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="a")
    first = tiny_trainer(tmp_path / "a", hf, [shared])
    with pytest.raises(TwinkleError, match=refusal):  # at the second trainer's __init__
        tiny_trainer(tmp_path / "b", hf, [shared])
    second = tiny_trainer(tmp_path / "b", hf, [])
    second.add_callback(shared)  # after __init__: refused at its train()
    refused: list[str] = []

    class TrainTheSecondMidway(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 1:
                try:
                    second.train()
                except TwinkleError as exc:
                    refused.append(str(exc))

    first.add_callback(TrainTheSecondMidway())
    first.train()
    assert len(refused) == 1 and re.search(refusal, refused[0])
    run_dir = tmp_path / "runs" / "a"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["status"] == "ok"
    logged = events(run_dir)
    assert [e["step"] for e in logged if e["type"] == "optimizer_step"] == [1, 2, 3]
    assert [e["type"] for e in logged].count("run_started") == 1
    assert not (tmp_path / "runs" / "b").exists()


# -- 4. options taken silently --------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Path], object]
    match: str  # must name the culprit and the fix


def _pool_start(name: str) -> None:
    def never(ctx: StartContext) -> Engine:
        raise AssertionError(f"engine {ctx.name!r} was started: its name should be refused")

    with EnginePool[Engine](recorder=TimeRecorder()) as pool:
        pool.start({name: never})


OPTIONS = [
    Case("a negative observer budget", lambda t: session(t, slow_call_s=-1),
         r"slow_call_s=-1 must be a finite number of seconds >= 0"),
    Case("background_dispatch as a str", lambda t: session(t, background_dispatch="yes"),
         r"background_dispatch must be True or False, got 'yes'"),
    Case("background_writer as a str",
         lambda t: RunSession(out_dir=t, run_id="r", background_writer="no"),  # type: ignore[arg-type]
         r"background_writer must be True or False, got 'no'"),
    Case("builtins as a str", lambda t: session(t, builtins="no"),
         r"builtins must be True or False, got 'no'"),
    Case("autoload as a str", lambda t: RunSession(out_dir=t, run_id="r", autoload="no"),  # type: ignore[arg-type]
         r"autoload must be True, False or None .*got 'no'"),
    Case("an empty source", lambda t: session(t, source=""),
         r"source must be a non-empty str \(the name of this process's spans\), got ''"),
    Case("a source of twinkle's own", lambda t: session(t, source="twinkle.observers"),
         r"source 'twinkle.observers' is reserved"),
    Case("vLLM args as one str", lambda t: VllmConfig(model="m", args="--dtype bfloat16"),  # type: ignore[arg-type]
         re.escape("args='--dtype bfloat16' is a str; pass a sequence of str, one per "
                   "argument: args=['--dtype', 'bfloat16']")),
    Case("a vLLM argument that is not a str", lambda t: VllmConfig(model="m", args=["--n", 2]),  # type: ignore[arg-type]  # an int among them is the point
         re.escape("args[1] = 2 (int) is not a str: pass every argument as a str (e.g. str(2))")),
    Case("a vLLM host that is not a str", lambda t: VllmConfig(model="m", host=0),  # type: ignore[arg-type]
         r"host=0 must be a str"),
    Case("an engine name that climbs out", lambda t: _pool_start("../e"),
         r"engine name '\.\./e' is not a safe name: .*\(e\.g\. 'vllm-0'\)"),
    Case("an engine name that hides", lambda t: _pool_start(".e"),
         r"engine name '\.e' is not a safe name"),
]  # fmt: skip


@pytest.mark.parametrize("case", OPTIONS, ids=[c.name for c in OPTIONS])
def test_an_option_is_refused_when_it_is_given(case: Case, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=case.match):
        case.call(tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


def test_a_vllm_engine_bound_beyond_loopback_without_a_key_is_warned_about() -> None:
    with pytest.warns(UserWarning, match=r"host='0\.0\.0\.0'.* beyond this machine's loopback"):
        VllmConfig(model="m", host="0.0.0.0")
    with pytest.warns(UserWarning, match=r"--api-key"):
        VllmConfig(model="m", host="10.1.2.3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VllmConfig(model="m")  # 127.0.0.1
        VllmConfig(model="m", host="localhost")
        VllmConfig(model="m", host="::1")
        # (a list is taken, though the field is typed tuple: see the last line)
        VllmConfig(model="m", host="0.0.0.0", args=["--api-key", "secret"])  # type: ignore[arg-type]
    # a list is taken and kept as a tuple (the field is typed tuple: a list is the point)
    as_list = VllmConfig(model="m", args=["--dtype", "bfloat16"])  # type: ignore[arg-type]
    assert as_list.args == ("--dtype", "bfloat16")


# -- 5. a report without iteration=, an attribute whose repr raises ------------------------


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


def test_a_report_received_without_an_iteration_is_taken_as_outside_any(
    tmp_path: Path,
) -> None:
    worker = WorkerRecorder("w1")
    with worker.span("generate"):
        pass
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        run.receive(worker.report(memory=True))
    logged = events(tmp_path / "r")
    assert [e["iteration"] for e in logged if e["type"] == "memory"] == [None]
    assert [s["name"] for e in logged if e["type"] == "spans" and e["source"] == "w1"
            for s in span_list(e)] == ["generate"]  # fmt: skip


def test_a_span_attr_whose_repr_raises_keeps_the_boundary_and_the_span(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        with run.recorder.span("train.step", obj=Unprintable()):
            pass
        odd = Span("generate", 1, 2, 1, 1, {Unprintable(): 1}, None)  # type: ignore[dict-item]
        run.bus.publish_spans("w1", run.bus.anchor, [odd])
        with caplog.at_level(logging.WARNING, logger="twinkle.events"):
            run.bus.iteration_started(1)  # the flush of train.step: the boundary goes out
        run.bus.iteration_started(2)
    logged = events(tmp_path / "r")
    assert [e["iteration"] for e in logged if e["type"] == "iteration_started"] == [0, 1, 2]
    spans = {s["name"]: s for e in logged if e["type"] == "spans" for s in span_list(e)}
    assert spans["train.step"]["attrs"] == {"obj": "<unrepresentable Unprintable>"}
    assert spans["generate"]["attrs"] == {"<unrepresentable Unprintable>": "1"}  # as its repr
    assert "'train.step'" in caplog.text and "['obj']" in caplog.text
    assert run.summary is not None and run.summary["status"] == "ok"
    assert_replays_identically(tmp_path / "r", tmp_path / "again")


def test_a_span_with_text_that_is_not_utf8_is_logged_with_it_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file name from os.fsdecode (lone surrogates) as a span's name, error, attr key
    or value: the log could not write the batch (every span of it missing from the
    log, status ok, a replay differing). The surrogates are escaped (a value is written
    as its repr), the batch is logged and replays; a worker named so is refused."""
    odd = os.fsdecode(b"data/\xff.bin")
    with session(tmp_path) as run:
        run.bus.iteration_started(0)
        with run.recorder.span("ok", path=odd, iteration=0):
            pass
        with run.recorder.span(odd, **{odd: 1}):  # type: ignore[arg-type]
            pass
        spans = [Span("generate", 1, 2, 1, 1, {"iteration": 0}, odd)]
        run.bus.publish_spans("w1", run.bus.anchor, spans)
        with pytest.raises(InvalidArgumentError, match=r"source 'data/\\udcff.bin' is not valid"):
            run.bus.publish_spans(odd, run.bus.anchor, spans)
        hostname = msgspec.structs.replace(run.bus.anchor, hostname=odd)
        with pytest.raises(RecordError, match=r"spans\.anchor\['hostname'\] is not valid UTF-8"):
            run.bus.publish_spans("w2", hostname, spans)
        with caplog.at_level(logging.WARNING, logger="twinkle.events"):
            run.bus.iteration_started(1)
    logged = events(tmp_path / "r")
    shown = "data/\\udcff.bin"
    found = {s["name"]: s for e in logged if e["type"] == "spans" for s in span_list(e)}
    assert found["ok"]["attrs"] == {"path": repr(odd), "iteration": 0}
    assert found[shown]["attrs"] == {shown: 1}
    assert found["generate"]["error"] == shown
    assert "not UTF-8 text" in caplog.text
    assert run.summary is not None and run.summary["status"] == "ok"
    assert run.summary["observer_failures"] == {}
    assert_replays_identically(tmp_path / "r", tmp_path / "again")


# -- 6. the README's TRL example and SIGTERM ------------------------------------------------


def trl_section_code() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using twinkle with TRL", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_trl_example_trains_inside_finish_on_signals() -> None:
    code = trl_section_code()
    assert "from twinkle.run import finish_on_signals" in code
    guarded = [
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.With)
        and any(ast.unparse(item.context_expr) == "finish_on_signals()" for item in node.items)
    ]
    inside = {ast.unparse(n) for w in guarded for n in ast.walk(w) if isinstance(n, ast.Call)}
    assert "trainer.train()" in inside


@pytest.fixture
def default_sigterm() -> Iterator[None]:
    """SIGTERM at its default handler (finish_on_signals takes over only that one)."""
    saved = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, saved)


@pytest.mark.usefixtures("default_sigterm")
def test_sigterm_while_a_trainer_trains_as_the_readme_shows_finishes_its_run(
    tmp_path: Path, hf: tuple[Any, Any]
) -> None:
    from transformers import DataCollatorForLanguageModeling

    from twinkle.integrations.trl import TwinkleCallback

    collate = DataCollatorForLanguageModeling(hf[0], mlm=False)
    batches: list[int] = []

    def collator(features: list[Any]) -> Any:
        batches.append(len(features))
        if len(batches) == 3:  # the scheduler's time limit, while loading a batch
            signal.raise_signal(signal.SIGTERM)
        return collate(features)

    callback = TwinkleCallback(out_dir=str(tmp_path / "runs"), run_id="t")
    trainer = tiny_trainer(tmp_path, hf, [callback], steps=6, collator=collator)
    with pytest.raises(SignalInterrupt), finish_on_signals():
        trainer.train()
    run_dir = tmp_path / "runs" / "t"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["status"] == "error"
    assert summary["error"] == "SignalInterrupt: SIGTERM (signal 15): the process was asked to stop"
    logged = events(run_dir)
    assert [e["type"] for e in logged[-2:]] == ["run_finished", "backends_closed"]
    assert [e["type"] for e in logged].count("run_finished") == 1
    assert [e["step"] for e in logged if e["type"] == "optimizer_step"][:1] == [1]
    assert_replays_identically(run_dir, tmp_path / "again")
