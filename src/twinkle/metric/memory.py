"""Memory figures across workers: binary unit conversion and cross-worker reduction.

Raw readings (integer bytes, :class:`twinkle.perf.stats.MemoryReading`) are reduced per
field over workers — max, min, mean, sum, how many workers contributed and which worker
holds the max — and only then converted to a binary unit (``GiB = 2**30`` bytes).
Host-only workers report ``None`` device fields; they are skipped for those fields and
the count says how many workers did contribute.

:func:`gather_readings` collects one reading per rank over ``torch.distributed`` when it
is initialised; torch is imported only inside it, never when this module is imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from twinkle.checks import plain_number, short_repr
from twinkle.errors import InvalidArgumentError
from twinkle.perf.dist import all_gather_json, initialised_dist
from twinkle.perf.stats import MemoryReading

__all__ = [
    "BINARY_UNITS",
    "MEMORY_FIELDS",
    "MemoryMetrics",
    "Reduction",
    "convert_bytes",
    "gather_readings",
    "memory_metrics",
    "memory_report",
    "reduce_readings",
]

BINARY_UNITS: Final[Mapping[str, int]] = MappingProxyType(
    {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
)
"""Bytes per binary unit (read-only)."""

# How a unit is spelled inside a metric key: ``device_allocated_peak_gib_max``.
_UNIT_KEY: Final[Mapping[str, str]] = MappingProxyType(
    {"B": "bytes", "KiB": "kib", "MiB": "mib", "GiB": "gib", "TiB": "tib"}
)

MEMORY_FIELDS: Final[tuple[str, ...]] = (
    "host_rss_bytes",
    "host_peak_rss_bytes",
    "device_allocated_bytes",
    "device_allocated_peak_bytes",
    "device_reserved_bytes",
    "device_reserved_peak_bytes",
)
"""The byte fields of :class:`~twinkle.perf.stats.MemoryReading` that can be reduced."""


def _check_unit(unit: object, where: str) -> int:
    if not isinstance(unit, str) or unit not in BINARY_UNITS:
        raise InvalidArgumentError(
            f"{where}: unit must be one of {', '.join(BINARY_UNITS)} (binary units, "
            f"GiB = 2**30 bytes), got {unit!r}; pass e.g. unit='GiB'"
        )
    return BINARY_UNITS[unit]


def convert_bytes(value: int, unit: str) -> float:
    """``value`` bytes (an int >= 0) in binary ``unit`` (one of :data:`BINARY_UNITS`),
    correctly rounded."""
    size = _check_unit(unit, "convert_bytes")
    value = plain_number(value)  # type: ignore[assignment]  # numpy or torch: its int
    if type(value) is not int:
        raise InvalidArgumentError(
            f"convert_bytes: value must be an int number of bytes, got {value!r} "
            f"({type(value).__name__}); pass the raw integer byte count"
        )
    if value < 0:
        raise InvalidArgumentError(
            f"convert_bytes: value must be a byte count >= 0, got {value!r}; a negative "
            "size is no reading: pass the raw byte count as the allocator or the OS gave it"
        )
    return value / size


@dataclass(frozen=True, slots=True)
class Reduction:
    """One field reduced over the workers that reported it (raw bytes).

    ``count`` is how many workers contributed (workers whose field is ``None`` are
    skipped). ``argmax_worker`` is the ``worker_id`` of the first contributing reading,
    in the order given, that holds ``max``. With no contributor ``max``, ``min`` and
    ``argmax_worker`` are ``None``, ``sum`` is 0 and ``mean`` is ``nan``.
    """

    max: int | None
    min: int | None
    mean: float
    sum: int
    count: int
    argmax_worker: str | None


def _check_readings(readings: object, where: str) -> Sequence[MemoryReading]:
    if not isinstance(readings, Sequence) or isinstance(readings, str | bytes):
        raise InvalidArgumentError(
            f"{where}: readings must be a sequence of MemoryReading, got "
            f"{short_repr(readings)}; pass e.g. gather_readings(memory_stats())"
        )
    if not readings:
        raise InvalidArgumentError(
            f"{where}: readings must hold at least one MemoryReading, got {readings!r}; "
            f"pass e.g. gather_readings(memory_stats())"
        )
    for i, reading in enumerate(readings):
        if not isinstance(reading, MemoryReading):
            raise InvalidArgumentError(
                f"{where}: readings[{i}] must be a twinkle.perf.stats.MemoryReading, got "
                f"{short_repr(reading)}; build readings with memory_stats()"
            )
    return readings


def _check_fields(fields: object, where: str) -> tuple[str, ...]:
    names: tuple[object, ...] = ()
    if isinstance(fields, Sequence) and not isinstance(fields, str | bytes):
        names = tuple(fields)
    known = [name for name in MEMORY_FIELDS if name in names]
    if not names or len(known) != len(names):  # also catches unknown and repeated names
        raise InvalidArgumentError(
            f"{where}: fields must be a non-empty sequence of distinct names from "
            f"{MEMORY_FIELDS!r}, got {fields!r}; pass e.g. ('device_allocated_peak_bytes',)"
        )
    return tuple(str(name) for name in names)


def reduce_readings(
    readings: Sequence[MemoryReading], *, fields: Sequence[str] = MEMORY_FIELDS
) -> dict[str, Reduction]:
    """Reduce each of ``fields`` over ``readings``: ``{field: Reduction}`` in ``fields`` order.

    All readings and values are validated before anything is computed.
    """
    out: dict[str, Reduction] = {}
    for name, (values, workers) in _columns(readings, fields, "reduce_readings").items():
        if not values:
            out[name] = Reduction(None, None, math.nan, 0, 0, None)
            continue
        top, low, total, argmax = _reduce(values, workers)
        out[name] = Reduction(top, low, total / len(values), total, len(values), argmax)
    return out


def _columns(
    readings: object, fields: object, where: str
) -> dict[str, tuple[list[int], list[str]]]:
    """Per field (validated), the values of the readings that report it and their workers."""
    checked = _check_readings(readings, where)
    names = MEMORY_FIELDS if fields is MEMORY_FIELDS else _check_fields(fields, where)
    columns: dict[str, tuple[list[int], list[str]]] = {name: ([], []) for name in names}
    for i, reading in enumerate(checked):
        worker = reading.worker_id
        for name, (values, workers) in columns.items():
            value = getattr(reading, name)
            if value is None:
                continue
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(
                    f"{where}: readings[{i}].{name} must be an int >= 0 or None, got "
                    f"{value!r}; readings carry raw byte counts from memory_stats()"
                )
            values.append(value)
            workers.append(worker)
    return columns


def _reduce(values: list[int], workers: list[str]) -> tuple[int, int, int, str]:
    """Max, min, sum of a non-empty column, and the worker of its first max."""
    if len(values) == 1:  # one worker: nothing to reduce
        return values[0], values[0], values[0], workers[0]
    top = max(values)
    return top, min(values), sum(values), workers[values.index(top)]


@dataclass(frozen=True, slots=True)
class MemoryMetrics:
    """Flat memory figures for a record: numbers in ``values``, worker names in ``attrs``.

    For each field ``<name>_bytes`` and unit tag ``<u>`` (``gib`` for GiB, ``bytes``
    for B), ``values`` holds ``<name>_<u>_max``, ``_min``, ``_mean``, ``_sum`` (floats;
    ``nan`` when no worker reported the field) and ``<name>_workers`` (int, how many
    workers contributed); ``attrs`` holds ``<name>_argmax_worker`` (the ``worker_id``
    holding the max, ``None`` when no worker contributed).
    """

    values: dict[str, int | float]
    attrs: dict[str, str | None]


#: the largest int a record holds (a JSON reader's unsigned 64 bits)
_RECORD_INT_MAX: Final = 2**64 - 1


def _in_unit(total: int, count: int, size: int) -> int | float:
    """``total / (count * size)``: whole bytes stay integers (a mean rounded half up;
    a sum past what a record's int holds, 2**64 - 1, a float); other units as one
    exact int division, so correctly rounded."""
    if size == 1:
        whole = (2 * total + count) // (2 * count)
        return whole if whole <= _RECORD_INT_MAX else float(whole)
    return total / (count * size)


def _report_keys(tag: str) -> dict[str, tuple[str, str, str, str, str, str]]:
    """Per field: its max, min, mean, sum and workers keys in unit ``tag``, and its
    argmax attribute."""
    keys = {}
    for name in MEMORY_FIELDS:
        base = name.removesuffix("_bytes")
        keys[name] = (
            f"{base}_{tag}_max",
            f"{base}_{tag}_min",
            f"{base}_{tag}_mean",
            f"{base}_{tag}_sum",
            f"{base}_workers",
            f"{base}_argmax_worker",
        )
    return keys


# The key names, spelled once per unit rather than at every report.
_REPORT_KEYS: Final[Mapping[str, dict[str, tuple[str, str, str, str, str, str]]]] = (
    MappingProxyType({unit: _report_keys(tag) for unit, tag in _UNIT_KEY.items()})
)


def memory_report(
    readings: Sequence[MemoryReading],
    *,
    unit: str = "GiB",
    fields: Sequence[str] = MEMORY_FIELDS,
) -> MemoryMetrics:
    """Reduce ``readings`` and convert to ``unit``: see :class:`MemoryMetrics`."""
    size = _check_unit(unit, "memory_metrics")
    keys = _REPORT_KEYS[unit]
    values: dict[str, int | float] = {}
    attrs: dict[str, str | None] = {}
    for name, (column, workers) in _columns(readings, fields, "memory_metrics").items():
        k_max, k_min, k_mean, k_sum, k_workers, k_argmax = keys[name]
        count = len(column)
        if count:
            top, low, total, attrs[k_argmax] = _reduce(column, workers)
            values[k_max] = _in_unit(top, 1, size)
            values[k_min] = _in_unit(low, 1, size)
            values[k_mean] = _in_unit(total, count, size)
            values[k_sum] = _in_unit(total, 1, size)
        else:
            values[k_max] = values[k_min] = values[k_mean] = values[k_sum] = math.nan
            attrs[k_argmax] = None
        values[k_workers] = count
    return MemoryMetrics(values=values, attrs=attrs)


def memory_metrics(
    readings: Sequence[MemoryReading],
    *,
    unit: str = "GiB",
    fields: Sequence[str] = MEMORY_FIELDS,
) -> dict[str, float | int]:
    """Flat numeric memory figures of ``readings`` in ``unit`` (``memory_report(...).values``).

    Keys carry the unit, e.g. ``device_allocated_peak_gib_max``, ``host_peak_rss_gib_max``;
    use :func:`memory_report` to also get which worker holds each max.
    """
    return memory_report(readings, unit=unit, fields=fields).values


def gather_readings(reading: MemoryReading, *, group: Any = None) -> list[MemoryReading]:
    """Every rank's reading, in rank order, when ``torch.distributed`` is initialised.

    A collective: with an initialised process group every rank of ``group`` (default:
    the world) must call it. Without torch, or before ``init_process_group``, it returns
    ``[reading]``. On NCCL (HCCL) the caller must have selected the rank's CUDA (NPU)
    device, as for any collective.

    Readings travel as JSON bytes (``MemoryReading.to_dict``) in uint8 tensors and are
    rebuilt, validated, with ``MemoryReading.from_dict``. Unlike
    ``all_gather_object`` this needs no numpy and unpickles nothing a peer sent.
    """
    if not isinstance(reading, MemoryReading):
        raise InvalidArgumentError(
            f"gather_readings: reading must be a twinkle.perf.stats.MemoryReading, got "
            f"{short_repr(reading)}; pass memory_stats()"
        )
    dist = initialised_dist()
    if dist is None:
        return [reading]
    return [MemoryReading.from_dict(d) for d in all_gather_json(dist, group, reading.to_dict())]
