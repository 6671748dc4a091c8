"""A plugin that keeps its state through ``twinkle_checkpoint_state`` lets a restart
resume from the run's checkpoint: it gets its state back, its backend every record of
the run (the checkpoint's read back from metrics_raw.jsonl, then the tail's), exactly
as a resume feeding the whole log gives them; a plugin changed between the segments,
or one without the hook, makes the resume feed the whole log (docs/metrics.md,
"Resuming from a checkpoint")."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from reliability._scripted import CONFIG, segment
from reliability.test_checkpoint import HOUR, _killed_segment, _outputs
from reliability.test_reliability_resume import assert_replay_identical
from twinkle.errors import PluginError
from twinkle.events import Event
from twinkle.hookspecs import RunContext, hookimpl
from twinkle.reporting import MetricRecord, record_to_dict
from twinkle.run import RunSession
from twinkle.run._checkpoint import CHECKPOINT_FILE


class Collected:
    """A plugin's backend: every record handed to it, as a dict, in order."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, records: Sequence[MetricRecord]) -> None:
        self.records += [record_to_dict(r) for r in records]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Keeper:
    """Counts the events it sees (its state) and gives the run a backend."""

    def __init__(self, *, restore_fails: bool = False) -> None:
        self.seen = 0
        self.backend = Collected()
        self.restored: object = None
        self.restore_fails = restore_fails

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Collected]:
        return [self.backend]

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        self.seen += 1

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return {"seen": self.seen}

    @hookimpl
    def twinkle_restore_state(self, state: Any) -> None:
        if self.restore_fails:
            raise ValueError("this state is not mine")
        self.restored = state
        self.seen = state["seen"]


def _twins(tmp_path: Path) -> tuple[Path, Path]:
    segment(tmp_path / "with", iterations=3, plugins=(("keeper", Keeper()),))
    assert (tmp_path / "with" / "r" / CHECKPOINT_FILE).exists()
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    (tmp_path / "without" / "r" / CHECKPOINT_FILE).unlink()
    return tmp_path / "with", tmp_path / "without"


def _untimed(value: Any) -> Any:
    """``value`` without the plugin backend's slowest call (a wall-clock time)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "slowest_call_seconds"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _backends(run_dir: Path) -> dict[str, Any]:
    return dict(orjson.loads((run_dir / "summary.json").read_bytes())["backends"])


def test_a_plugin_keeping_its_state_resumes_from_the_checkpoint_with_every_record(
    tmp_path: Path,
) -> None:
    with_, without = _twins(tmp_path)
    for k in (1, 2):  # the second restart's checkpoint is the first restart's
        (without / "r" / CHECKPOINT_FILE).unlink(missing_ok=True)
        kept, fed = Keeper(), Keeper()
        a = segment(with_, iterations=2, wall_offset_ns=k * HOUR, plugins=(("keeper", kept),))
        b = segment(without, iterations=2, wall_offset_ns=k * HOUR, plugins=(("keeper", fed),))
        assert a.resumed is not None and b.resumed is not None
        assert a.resumed.restored_events == a.resumed.events > 0
        assert b.resumed.restored_events == 0
        assert kept.restored is not None and fed.restored is None
        assert kept.seen == fed.seen  # its state came back: it saw what the other saw
        # every record of the run, in order, the checkpoint's read back from the file
        raw = [orjson.loads(x) for x in (with_ / "r" / "metrics_raw.jsonl").read_bytes().split()]
        assert kept.backend.records == fed.backend.records == raw
        assert _untimed(_outputs(with_ / "r")) == _untimed(_outputs(without / "r"))
        health = _backends(with_ / "r")["keeper"]
        assert _untimed(health) == _untimed(_backends(without / "r")["keeper"])
        assert health["records"] == health["records_written"] == len(raw)
    assert_replay_identical(with_ / "r", tmp_path)


class Changed(Keeper):
    """The plugin's code as another version of it has it."""


def test_a_plugin_changed_between_the_segments_makes_the_resume_feed_the_whole_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_, _ = _twins(tmp_path)
    changed = Changed()
    with caplog.at_level(logging.WARNING, logger="twinkle.session"):
        a = segment(with_, iterations=1, wall_offset_ns=HOUR, plugins=(("keeper", changed),))
    assert a.resumed is not None and a.resumed.restored_events == 0
    assert "it holds the state of observers" in caplog.text and "Changed" in caplog.text
    assert changed.restored is None and changed.seen > a.resumed.events  # all of it again


def test_a_plugin_whose_state_cannot_be_restored_is_left_out_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    with_, _ = _twins(tmp_path)
    broken = Keeper(restore_fails=True)
    a = segment(with_, iterations=1, wall_offset_ns=HOUR, plugins=(("keeper", broken),))
    assert a.resumed is not None and a.resumed.restored_events == a.resumed.events
    summary = orjson.loads((with_ / "r" / "summary.json").read_bytes())
    assert (
        "twinkle_restore_state raised ValueError: this state is not mine"
        in (summary["plugins_left_out"]["keeper"])
    )
    assert broken.seen == 0 and broken.backend.records == []
    assert summary["status"] == "ok"
    # its state saw no event of that segment: the checkpoint the segment left does not
    # fit a run with it, and the next resume feeds it the whole log
    fine = Keeper()
    b = segment(with_, iterations=1, wall_offset_ns=2 * HOUR, plugins=(("keeper", fine),))
    assert b.resumed is not None and b.resumed.restored_events == 0
    raw = [orjson.loads(x) for x in (with_ / "r" / "metrics_raw.jsonl").read_bytes().split()]
    assert fine.backend.records == raw


def test_a_resumed_segment_killed_after_its_checkpoint_hands_the_plugin_every_record(
    tmp_path: Path,
) -> None:
    """Segments killed outright after their running checkpoints (the second resuming
    from the first's, its record file rebuilt from the checkpoint's head): the restart's
    plugin backend gets every record of the run, as a whole-log resume gives them."""
    segment(tmp_path / "with", iterations=2, plugins=(("keeper", Keeper()),))
    keeper = f"[('keeper', __import__({__name__!r}).Keeper())]"  # (this module's)
    for _ in range(2):  # the second resumes from the first's checkpoint: a rebuild
        _killed_segment(tmp_path / "with", every=20, plugins=keeper)
    marked = orjson.loads((tmp_path / "with" / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    (tmp_path / "without" / "r" / CHECKPOINT_FILE).unlink()
    kept, fed = Keeper(), Keeper()
    a = segment(tmp_path / "with", iterations=2, wall_offset_ns=HOUR, plugins=(("keeper", kept),))
    segment(tmp_path / "without", iterations=2, wall_offset_ns=HOUR, plugins=(("keeper", fed),))
    assert a.resumed is not None and a.resumed.restored_events == marked["events"] > 0
    raw = [
        orjson.loads(x)
        for x in (tmp_path / "with" / "r" / "metrics_raw.jsonl").read_bytes().split()
    ]
    assert kept.backend.records == fed.backend.records == raw
    health = _backends(tmp_path / "with" / "r")["keeper"]
    assert health["records_written"] == len(raw) and health["records_failed"] == 0


class Plain:
    """A plugin without the hook: what it saw cannot be checkpointed."""

    @hookimpl
    def twinkle_event(self, event: Event) -> None:
        pass


def test_a_plugin_without_the_hook_is_named_when_the_whole_log_is_fed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_, _ = _twins(tmp_path)
    with caplog.at_level(logging.WARNING, logger="twinkle.session"):
        a = segment(with_, iterations=1, wall_offset_ns=HOUR, plugins=(("plain", Plain()),))
    assert a.resumed is not None and a.resumed.restored_events == 0
    assert "plugin(s) ['plain'] keep no checkpoint state" in caplog.text


class Mine:
    """A value of the plugin's own class: a checkpoint does not make it (no code runs
    when a checkpoint is read)."""

    def __init__(self, seen: int) -> None:
        self.seen = seen


class OwnClass(Keeper):
    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return Mine(self.seen)


class NoRestore:
    """Keeps a state and has no hook to take it back."""

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return {"seen": 1}


@pytest.mark.parametrize(
    ("plugin", "why"),
    [
        (OwnClass(), "a checkpoint cannot hold it (UnpicklingError: a checkpoint holds only"),
        (NoRestore(), "it implements no twinkle_restore_state to take it back: add one"),
    ],
)
def test_a_plugin_state_no_resume_could_take_back_is_named_when_the_checkpoint_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, plugin: object, why: str
) -> None:
    """Found when the checkpoint is taken, not at the resume: no checkpoint is written
    and the warning names the plugin and the fix; the resume feeds it the whole log."""
    with caplog.at_level(logging.WARNING, logger="twinkle.run"):
        segment(tmp_path, iterations=3, plugins=(("mine", plugin),))
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()
    said = "plugin 'mine' returned a state from twinkle_checkpoint_state, and " + why
    assert said in caplog.text
    again = OwnClass()
    a = segment(tmp_path, iterations=1, wall_offset_ns=HOUR, plugins=(("mine", again),))
    assert a.resumed is not None and a.resumed.restored_events == 0
    assert again.seen > a.resumed.events  # every event again: the log's and the segment's


class NotSetUp(Keeper):
    """Cannot set up (the run leaves it out); its state was never made."""

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        raise PluginError("no server to report to")

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        raise AssertionError("a hook of a plugin the run left out was called")


class Raising(Keeper):
    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        raise KeyError("counts")


def test_a_plugin_left_out_at_its_set_up_keeps_no_checkpoint_from_being_taken(
    tmp_path: Path,
) -> None:
    segment(tmp_path, iterations=3, plugins=(("broken", NotSetUp()),))
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert "no server to report to" in summary["plugins_left_out"]["broken"]
    assert (tmp_path / "r" / CHECKPOINT_FILE).exists()  # (its hook not called)


def test_a_state_hook_that_raises_is_named_and_no_checkpoint_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="twinkle.run"):
        segment(tmp_path, iterations=3, plugins=(("raising", Raising()),))
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()
    assert "plugin 'raising': its twinkle_checkpoint_state raised KeyError: 'counts'" in (
        caplog.text
    )


class SetUpOnce(Keeper):
    """Sets up in the first segment, not in the resumed one."""

    def __init__(self, *, fails: bool) -> None:
        super().__init__()
        self.fails = fails
        self.asked = False  # (twinkle_restore_state called)

    @hookimpl
    def twinkle_configure(self, context: RunContext) -> None:
        if self.fails:
            raise PluginError("no server to report to")

    @hookimpl
    def twinkle_restore_state(self, state: Any) -> None:
        self.asked = True
        super().twinkle_restore_state(state)


def test_a_plugin_left_out_at_the_resumes_set_up_is_not_given_its_state(tmp_path: Path) -> None:
    segment(tmp_path, iterations=3, plugins=(("flaky", SetUpOnce(fails=False)),))
    left_out = SetUpOnce(fails=True)
    a = segment(tmp_path, iterations=1, wall_offset_ns=HOUR, plugins=(("flaky", left_out),))
    assert a.resumed is not None and a.resumed.restored_events == a.resumed.events
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert summary["status"] == "ok" and "flaky" in summary["plugins_left_out"]
    assert not left_out.asked and left_out.seen == 0


class OpensOnce:
    """A plugin whose backend opens in the first segment, not in the resumed one."""

    def __init__(self, *, opens: bool) -> None:
        self.opens = opens

    @hookimpl
    def twinkle_make_backends(self, context: RunContext) -> list[Collected]:
        backend = Collected()
        if not self.opens:
            backend.open = self._gone  # type: ignore[attr-defined]
        return [backend]

    @staticmethod
    def _gone() -> None:
        raise ConnectionError("tracking server gone")

    @hookimpl
    def twinkle_checkpoint_state(self) -> object:
        return None


def test_a_resume_whose_start_fails_hands_no_backend_the_history(tmp_path: Path) -> None:
    segment(tmp_path, iterations=3, plugins=(("keeper", Keeper()), ("gone", OpensOnce(opens=True))))
    kept = Keeper()
    session = RunSession(
        out_dir=tmp_path,
        run_id="r",
        config=CONFIG,
        autoload=False,
        plugins=[("keeper", kept), ("gone", OpensOnce(opens=False))],
        required_plugins=["gone"],
        resume=True,
    )
    with pytest.raises(PluginError, match="tracking server gone"):
        session.start()
    assert kept.restored is not None  # (from the checkpoint)
    assert kept.backend.records == []  # (the start failed before the history went out)


def test_a_plugin_left_out_again_is_named_with_the_way_to_start_from_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    segment(tmp_path, iterations=3, plugins=(("broken", NotSetUp()),))
    with caplog.at_level(logging.WARNING, logger="twinkle.session"):
        a = segment(tmp_path, iterations=1, wall_offset_ns=HOUR, plugins=(("broken", NotSetUp()),))
    assert a.resumed is not None and a.resumed.restored_events == 0
    assert "['broken (" in caplog.text  # (as a checkpoint names it: class and code)
    assert "not among them (new to the run, or left out of its segment" in caplog.text
    b = segment(
        tmp_path,
        iterations=1,
        wall_offset_ns=2 * HOUR,
        plugins=(("broken", NotSetUp()),),
        blocked=("broken",),
    )
    assert b.resumed is not None and b.resumed.restored_events == b.resumed.events
