"""Numbers from numpy and torch are taken wherever twinkle takes a number.

What a TRL or verl user has at hand: numpy scalars (``np.int64(3)``, ``np.float32``), 0-d
arrays, 0-d tensors (``loss.detach()``, ``torch.tensor(7)``), 1-d arrays and tensors of
token lengths, and lists of any of them. Each is checked against the same call made with
plain Python numbers: the result is identical, and the run's files hold plain numbers.
The core never imports numpy or torch for it (checked in a fresh interpreter).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from twinkle.checks import plain_number, plain_numbers  # noqa: E402
from twinkle.driver._state import check_int, check_timeout  # noqa: E402
from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.metric import ThroughputMetric  # noqa: E402
from twinkle.metric.memory import convert_bytes  # noqa: E402
from twinkle.reporting import RunTotals  # noqa: E402
from twinkle.run import RunSession  # noqa: E402

INTS: dict[str, Any] = {
    "np.int64": np.int64,
    "np.int32": np.int32,
    "0-d array": np.array,
    "0-d tensor": torch.tensor,
}
FLOATS: dict[str, Any] = {
    "np.float64": np.float64,
    "np.float32": np.float32,
    "0-d float tensor": lambda v: torch.tensor(v, dtype=torch.float64),
    "tensor requiring grad": lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True),
}
SEQUENCES: dict[str, Any] = {
    "1-d array": np.array,
    "1-d tensor": torch.tensor,
    "list of 0-d tensors": lambda vs: [torch.tensor(v) for v in vs],
    "list of numpy scalars": lambda vs: [np.int64(v) for v in vs],
    "tuple of mixed": lambda vs: tuple(torch.tensor(v) if i % 2 else v for i, v in enumerate(vs)),
}


@pytest.mark.parametrize("kind", [*INTS, *FLOATS])
def test_a_scalar_becomes_the_plain_number_it_holds(kind: str) -> None:
    make = {**INTS, **FLOATS}[kind]
    value = make(3) if kind in INTS else make(0.5)
    plain = plain_number(value)
    assert type(plain) is (int if kind in INTS else float)
    assert plain == (3 if kind in INTS else 0.5)


@pytest.mark.parametrize("value", ["3", None, [1], object(), torch.tensor([1, 2])])
def test_anything_else_comes_back_unchanged_for_the_callers_check(value: Any) -> None:
    assert plain_number(value) is value


def test_a_two_dimensional_array_is_not_a_sequence_of_numbers() -> None:
    grid = np.zeros((2, 2))
    assert plain_numbers(grid) is grid
    metric = ThroughputMetric()
    with pytest.raises(InvalidArgumentError, match=r"lengths must be a sequence of int token"):
        metric.accumulate(lengths=grid, seconds=1.0, devices=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(SEQUENCES))
def test_throughput_takes_lengths_seconds_and_devices_from_numpy_and_torch(kind: str) -> None:
    plain, mine = ThroughputMetric(), ThroughputMetric()
    plain.accumulate(lengths=[128, 512, 7], seconds=2.5, devices=8)
    mine.accumulate(
        lengths=SEQUENCES[kind]([128, 512, 7]),
        seconds=torch.tensor(2.5, dtype=torch.float64),
        devices=np.int64(8),
    )
    assert mine.calculate() == plain.calculate()


@pytest.mark.parametrize("kind", list(FLOATS))
def test_throughput_refuses_what_it_refused_before_whatever_its_type(kind: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"seconds must be a finite number >= 0"):
        ThroughputMetric().accumulate(lengths=[1], seconds=FLOATS[kind](-1.0), devices=1)
    with pytest.raises(InvalidArgumentError, match=r"lengths\[0\] must be a token count"):
        ThroughputMetric().accumulate(lengths=torch.tensor([-1]), seconds=1.0, devices=1)


@pytest.mark.parametrize("kind", list(INTS))
def test_bytes_totals_and_driver_arguments_take_numpy_and_torch_ints(kind: str) -> None:
    make = INTS[kind]
    assert convert_bytes(make(3 * 2**20), "MiB") == 3.0
    totals = RunTotals()
    totals.add("tokens_rollout", make(5))
    totals.add("tokens_rollout", 7)
    (entry,) = totals.calibrate({"tokens_rollout": make(12)}).values()
    assert entry == {"accumulated": 12, "terminal": 12, "final": 12, "discrepancy": 0}
    assert type(entry["final"]) is int
    assert check_int("version", make(4), 0) == 4
    assert check_timeout("timeout_s", make(2)) == 2.0


def test_the_bus_takes_them_and_the_log_holds_plain_numbers(tmp_path: Path) -> None:
    with RunSession(
        out_dir=tmp_path, run_id="np", config={"phases": {"train": ["train.*"]}}, autoload=False
    ) as run:
        run.bus.iteration_started(np.int64(0))
        run.bus.samples(iteration=np.int64(0), phase="train", lengths=torch.tensor([3, 4]))
        run.bus.samples(iteration=0, phase="train", lengths=[np.int32(5), torch.tensor(6)])
        run.bus.optimizer_step(iteration=torch.tensor(0), step=np.int64(1), samples=np.int64(4))
        run.bus.scalars(
            iteration=0,
            name="trl",
            values={"loss": torch.tensor(0.25, requires_grad=True), "reward": np.float32(0.5)},
        )
        run.finish(terminal_totals={"optimizer_updates": np.int64(1)})
    events = [
        json.loads(line) for line in (tmp_path / "np" / "events.jsonl").read_text().splitlines()
    ]
    samples = [e["lengths"] for e in events if e["type"] == "samples"]
    assert samples == [[3, 4], [5, 6]]
    (step,) = [e for e in events if e["type"] == "optimizer_step"]
    assert (step["iteration"], step["step"], step["samples"]) == (0, 1, 4)
    (scalars,) = [e["values"] for e in events if e["type"] == "scalars"]
    assert scalars == {"loss": 0.25, "reward": 0.5}
    summary = json.loads((tmp_path / "np" / "summary.json").read_text())
    assert summary["counts"]["samples_train"]["final"] == 4
    assert summary["counts"]["tokens_train"]["final"] == 18
    assert summary["counts"]["optimizer_updates"]["discrepancy"] == 0


def test_the_core_imports_neither_numpy_nor_torch_for_it() -> None:
    code = (
        "import sys, twinkle.checks, twinkle.metric, twinkle.reporting, twinkle.events, "
        "twinkle.run, twinkle.driver; "
        "from twinkle.checks import plain_number; plain_number(3); "
        "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
