"""An observer cannot change what the others, the log, the summary or the caller see:
event payloads are read-only, and the summary's own keys are the run's."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest

from _recompute import span_list
from reliability._scripted import CONFIG
from twinkle.events import FrozenDict, FrozenList, RunStarted, ScalarsObserved, SpanBatch, freeze
from twinkle.hookspecs import hookimpl
from twinkle.run import RunSession, replay


class Vandal:
    """Tries to change every payload it is handed; notes what it managed."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def _try(self, what: str, change: Any) -> None:
        try:
            change()
        except TypeError:
            self.refused.append(what)

    @hookimpl(tryfirst=True)
    def twinkle_configure(self, context: Any) -> None:
        self._try("context.config", lambda: context.config.update(total_steps=99))
        self._try("context.config.phases", lambda: context.config["phases"]["rollout"].append("x"))

    @hookimpl(tryfirst=True)
    def twinkle_run_started(self, event: RunStarted) -> None:
        self._try("config", lambda: event.config.__setitem__("total_steps", 99))
        self._try("config.phases", lambda: event.config["phases"]["rollout"].append("x"))
        self._try("config.phases.pop", lambda: event.config["phases"].pop("train"))

    @hookimpl(tryfirst=True)
    def twinkle_spans(self, event: SpanBatch) -> None:
        for span in event.spans:
            self._try("attrs", lambda s=span: s.attrs.__setitem__("iteration", 7))

    @hookimpl(tryfirst=True)
    def twinkle_scalars(self, event: ScalarsObserved) -> None:
        self._try("values", lambda: event.values.__setitem__("loss", 1e9))

    @hookimpl(tryfirst=True)
    def twinkle_summary(self) -> dict[str, Any]:
        return {"status": "ok", "error": None, "run_id": "forged", "mine": 1}


def test_a_mutating_observer_changes_nothing(tmp_path: Path) -> None:
    config = copy.deepcopy(CONFIG)
    vandal = Vandal()
    with (
        pytest.raises(RuntimeError),
        RunSession(
            out_dir=tmp_path,
            run_id="r",
            config=config,
            autoload=False,
            plugins=[("vandal", vandal)],
        ) as run,
    ):
        run.bus.iteration_started(0)
        with run.recorder.span("generate", iteration=0):
            pass
        run.bus.scalars(iteration=0, name="grpo", values={"loss": 0.5})
        raise RuntimeError("the run failed")
    assert config == CONFIG  # the caller's own config
    assert set(vandal.refused) == {
        "context.config",
        "context.config.phases",
        "config",
        "config.phases",
        "config.phases.pop",
        "attrs",
        "values",
    }
    events = [orjson.loads(x) for x in (tmp_path / "r" / "events.jsonl").read_bytes().splitlines()]
    assert events[0]["config"] == CONFIG
    attrs = [s["attrs"] for e in events if e["type"] == "spans" for s in span_list(e)]
    assert {"iteration": 0} in attrs and {"iteration": 7} not in attrs
    assert [e["values"] for e in events if e["type"] == "scalars"] == [{"loss": 0.5}]
    # A plugin cannot turn a failed run into "ok" (nor rename it); its own keys stay.
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert (summary["status"], summary["run_id"]) == ("error", "r")
    assert "the run failed" in summary["error"] and summary["mine"] == 1
    assert summary["observer_failures"]["vandal"] == 1
    again = replay(tmp_path / "r" / "events.jsonl", tmp_path / "re", plugins=[("vandal", Vandal())])
    assert again.summary["status"] == "error"


def test_frozen_values_behave_as_plain_json_values() -> None:
    value = freeze({"a": [1, {"b": 2}], "c": "d"})
    assert isinstance(value, FrozenDict) and isinstance(value["a"], FrozenList)
    assert value == {"a": [1, {"b": 2}], "c": "d"}
    assert orjson.loads(orjson.dumps(value)) == value
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.deepcopy(value) == value
    thawed = dict(value)
    thawed["c"] = "e"  # a copy is the caller's to change
    with pytest.raises(TypeError, match=r"read-only.*copy it first"):
        value["a"].append(3)
    with pytest.raises(TypeError, match="read-only"):
        value |= {"x": 1}
