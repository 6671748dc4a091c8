"""The run learns what its observers refuse through their hooks, not by knowing them:
``twinkle_check_config`` refuses a configuration before anything starts, and
``twinkle_reserved_scalar_names`` keeps the caller's scalars off the kinds of the
run's other records."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from twinkle.errors import ConfigError, InvalidArgumentError
from twinkle.hookspecs import hookimpl
from twinkle.run import RunSession


class Strict:
    @hookimpl
    def twinkle_check_config(self, config: Mapping[str, Any]) -> None:
        if "x_strict" in config and not isinstance(config["x_strict"], int):
            raise ConfigError(f"config.x_strict must be an int, got {config['x_strict']!r}")


class Kinds:
    @hookimpl
    def twinkle_reserved_scalar_names(self, config: Mapping[str, Any]) -> list[str]:
        return ["strict"]


def test_a_plugin_refusing_the_configuration_refuses_the_session_before_any_file(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"config\.x_strict must be an int, got 'no'"):
        RunSession(
            out_dir=tmp_path, run_id="r", config={"x_strict": "no"}, plugins=[("strict", Strict())]
        )
    assert not (tmp_path / "r").exists()
    with RunSession(out_dir=None, config={"x_strict": 3}, plugins=[("strict", Strict())]):
        pass


def test_the_built_in_observers_refuse_a_configuration_they_cannot_parse() -> None:
    with pytest.raises(ConfigError, match="phases"):
        RunSession(out_dir=None, config={"phases": "generate"}, autoload=False)
    # with every built-in blocked, nothing reads config.phases: the run starts
    RunSession(
        out_dir=None, config={"phases": "generate"}, autoload=False, builtins=False
    ).start().finish()


def test_scalars_may_not_take_a_name_an_observer_reserves() -> None:
    with RunSession(out_dir=None, autoload=False, plugins=[("kinds", Kinds())]) as run:
        with pytest.raises(InvalidArgumentError, match="'strict'"):
            run.bus.scalars(iteration=0, name="strict", values={"a": 1.0})
        with pytest.raises(InvalidArgumentError, match="'timing'"):
            run.bus.scalars(iteration=0, name="timing", values={"a": 1.0})
        run.bus.scalars(iteration=0, name="grpo", values={"a": 1.0})


def test_without_the_scalars_observer_the_built_ins_reserve_no_name() -> None:
    with RunSession(out_dir=None, autoload=False, blocked=["scalars"]) as run:
        run.bus.scalars(iteration=0, name="timing", values={"a": 1.0})
