"""``config.compare``: a framework's own figures to set beside twinkle's (docs/metrics.md,
"A framework's own figures").

Its shape::

    "compare": {
      "scalars": "verl",                  # the scalars event name holding its figures
      "seconds": {                        # span name -> its key for that span's seconds
        "step": "timing_s/step",
        "gen": "timing_s/gen"
      },
      "throughput": {                     # optional: its tokens/s per device
        "key": "perf/throughput",
        "span": "step",                   # over the seconds of these spans
        "samples": "rollout",             # the tokens of these samples
        "devices": 8                      # per this many devices
      }
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twinkle.errors import ConfigError

__all__ = ["CompareConfig", "CompareThroughput"]


@dataclass(frozen=True, slots=True)
class CompareThroughput:
    """The framework's throughput figure ``key``: its tokens (of the ``samples`` tag)
    over the seconds of the spans named ``span``, per ``devices``."""

    key: str
    span: str
    samples: str
    devices: float


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """Parsed ``config.compare``."""

    scalars: str
    seconds: dict[str, str]
    throughput: CompareThroughput | None

    @classmethod
    def parse(cls, raw: object) -> CompareConfig | None:
        """``config.compare`` checked (:class:`ConfigError` names the key); None when
        it is not given."""
        if raw is None:
            return None
        where = "config.compare"
        _keys(where, raw, {"scalars", "seconds", "throughput"})
        assert isinstance(raw, Mapping)
        seconds = raw.get("seconds", {})
        if not isinstance(seconds, Mapping) or not all(
            _text(k) and _text(v) for k, v in seconds.items()
        ):
            raise ConfigError(
                f"{where}.seconds must map span names to the framework's keys (non-empty "
                f"strings), got {seconds!r:.200}"
            )
        tp = raw.get("throughput")
        throughput = None
        if tp is not None:
            _keys(f"{where}.throughput", tp, {"key", "span", "samples", "devices"})
            assert isinstance(tp, Mapping)
            for key in ("key", "span", "samples"):
                if not _text(tp.get(key)):
                    raise ConfigError(
                        f"{where}.throughput.{key} must be a non-empty string, "
                        f"got {tp.get(key)!r:.100}"
                    )
            devices = tp.get("devices")
            if isinstance(devices, bool) or not isinstance(devices, int | float) or devices <= 0:
                raise ConfigError(
                    f"{where}.throughput.devices must be a positive number (the framework's "
                    f"denominator), got {devices!r:.100}"
                )
            throughput = CompareThroughput(tp["key"], tp["span"], tp["samples"], float(devices))
        return cls(_scalars(raw.get("scalars")), dict(seconds), throughput)


def _keys(where: str, raw: object, known: set[str]) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be an object, got {raw!r:.100}")
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")


def _scalars(name: Any) -> str:
    if not _text(name):
        raise ConfigError(
            f"config.compare.scalars must name the scalars holding the framework's figures "
            f"(a non-empty string), got {name!r:.100}"
        )
    return str(name)


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value)
