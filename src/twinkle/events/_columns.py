"""A span batch's form in the event log: its spans as columns.

A ``spans`` line holds its spans as :class:`SpanColumns`, one list per field with one
item per span (in the batch's order), where a repeated value is written once:

* ``names``, ``threads``, ``pids``, ``errors``: each distinct value once, in the order
  the spans first use it; ``name``, ``thread``, ``pid``, ``error``: per span, the index
  of its value in that table. An index column is left out when its table has one entry
  (every span uses it); ``errors`` is left out when no span ended by an exception.
* ``t0``: the batch's earliest start; ``start``: per span, ``start_ns - t0``; ``dur``:
  per span, ``end_ns - start_ns`` (both below 2**64: a span's times are int64s, so
  either can pass 2**63 - 1 when a batch holds negative times).
* ``keys``: each distinct list of attribute names, in the order the span's attrs hold
  them; ``key``: per span, the index of its list (left out when there is one);
  ``values``: per attribute name, the values of the spans that have it, in span order.
  ``keys`` and ``values`` are left out when no span has attributes.

It is plain JSON (integers and strings, names written once), a third of the bytes of a
list of span objects and decoded by a typed decoder. :func:`span_rows` turns either
form back into span objects for a reader of the JSON; the log of an older twinkle (a
``spans`` list of objects) is still read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import add, attrgetter, itemgetter, sub
from typing import Annotated, Any

import msgspec

from twinkle.checks import INT64_MAX, Count, Int64, NonEmpty
from twinkle.errors import RecordError
from twinkle.events._frozen import EMPTY, FrozenDict, freeze
from twinkle.events._types import Event, SpanBatch
from twinkle.perf import ClockAnchor, Span

_SCALARS = frozenset((str, int, float, bool, type(None)))

__all__ = ["SpanBatchLine", "SpanColumns", "batch_line", "line_batch", "span_rows"]

#: a span's start from ``t0``, or its length: the difference of two int64s
Offset = Annotated[int, msgspec.Meta(ge=0)]  # (at most 2**64 - 1: from_columns checks the ends)


class SpanColumns(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """The spans of a batch as columns (the module docstring has the rules)."""

    names: list[NonEmpty]
    name: list[Count] | None = None
    t0: Int64
    start: list[Offset]
    dur: list[Offset]
    threads: list[Count]
    thread: list[Count] | None = None
    pids: list[Count]
    pid: list[Count] | None = None
    keys: list[list[str]] | None = None
    key: list[Count] | None = None
    values: dict[str, list[Any]] | None = None
    errors: list[str | None] | None = None
    error: list[Count] | None = None


def _table(values: list[Any]) -> tuple[list[Any], list[int] | None]:
    """Each distinct value once (first use first) and every value's index in that list;
    no index list when there is one distinct value."""
    seen = dict.fromkeys(values)
    if len(seen) <= 1:
        return list(seen), None
    index = {v: i for i, v in enumerate(seen)}
    return list(seen), list(map(index.__getitem__, values))


_NAME, _START, _END = attrgetter("name"), attrgetter("start_ns"), attrgetter("end_ns")
_THREAD, _PID = attrgetter("thread_id"), attrgetter("pid")
_ATTRS, _ERROR = attrgetter("attrs"), attrgetter("error")


def to_columns(spans: Sequence[Span]) -> SpanColumns:
    """``spans`` as columns (their order kept)."""
    starts = list(map(_START, spans))
    t0 = min(starts, default=0)
    names, name = _table(list(map(_NAME, spans)))
    threads, thread = _table(list(map(_THREAD, spans)))
    pids, pid = _table(list(map(_PID, spans)))
    keys: list[list[str]] | None = None
    key: list[int] | None = None
    values: dict[str, list[Any]] | None = None
    attrs = list(map(_ATTRS, spans))
    if any(attrs):
        shapes, key = _table(list(map(tuple, attrs)))
        keys = [list(shape) for shape in shapes]
        if key is None:  # one list of names: a column per name, in C
            values = {k: list(map(itemgetter(k), attrs)) for k in shapes[0]}
        else:
            values = {}
            for one in attrs:
                for k, v in one.items():
                    values.setdefault(k, []).append(v)
    errors: list[str | None] | None = None
    error: list[int] | None = None
    found = list(map(_ERROR, spans))
    if any(e is not None for e in found):
        errors, error = _table(found)
    return SpanColumns(
        names=names,
        name=name,
        t0=t0,
        start=list(map(sub, starts, repeat(t0))),
        dur=list(map(sub, map(_END, spans), starts)),
        threads=threads,
        thread=thread,
        pids=pids,
        pid=pid,
        keys=keys,
        key=key,
        values=values,
        errors=errors,
        error=error,
    )


def _check_index(table: Sequence[Any], index: list[int] | None, n: int, what: str) -> None:
    """Check a table's index list: one index per span, each within the table; no index
    list: the table has one entry (every span uses it)."""
    if index is None:
        if n and len(table) != 1:
            raise RecordError(
                f"spans.columns.{what}s has {len(table)} entries but no {what!r} index list "
                f"says which one each span uses: a line twinkle did not write"
            )
        return
    if len(index) != n:
        raise RecordError(
            f"spans.columns.{what} has {len(index)} entries for {n} spans: a line twinkle "
            "did not write"
        )
    if index and max(index) >= len(table):
        raise RecordError(
            f"spans.columns.{what} holds index {max(index)}, past the {len(table)} entries "
            f"of spans.columns.{what}s: a line twinkle did not write"
        )


def _column(table: Sequence[Any], index: list[int] | None, n: int, what: str) -> Iterable[Any]:
    """Each span's value of a table column (the index list checked first)."""
    _check_index(table, index, n, what)
    if index is None:
        return repeat(table[0], n) if n else ()
    return [table[i] for i in index]


def _attrs(cols: SpanColumns, n: int) -> Iterable[Any]:
    """Each span's attrs (read-only), rebuilt from ``keys``/``key``/``values``."""
    if cols.keys is None:
        if cols.values or cols.key is not None:
            raise RecordError(
                "spans.columns has attribute values or a 'key' list but no 'keys': a line "
                "twinkle did not write"
            )
        return repeat(EMPTY, n)
    shapes = [tuple(shape) for shape in cols.keys]
    for shape in shapes:
        if len(set(shape)) != len(shape):
            raise RecordError(f"spans.columns.keys holds a repeated name in {list(shape)}")
    index = cols.key
    _check_index(shapes, index, n, "key")
    # How many values each name needs: its spans, counted per list of names (in C).
    uses = [n] if index is None else [index.count(j) for j in range(len(shapes))]
    need: dict[str, int] = {}
    for shape, used in zip(shapes, uses, strict=False):
        for k in shape if used else ():
            need[k] = need.get(k, 0) + used
    values = cols.values or {}
    if {k: len(v) for k, v in values.items()} != need:
        raise RecordError(
            f"spans.columns.values holds { ({k: len(v) for k, v in values.items()}) } values "
            f"per name where the spans' keys need {need}: a line twinkle did not write"
        )
    values = {k: _read_only(v) for k, v in values.items()}
    if index is None:  # one list of names: the value columns line up with the spans
        shape = shapes[0] if shapes else ()
        if not shape:
            return repeat(EMPTY, n)
        return [FrozenDict(zip(shape, row)) for row in zip(*map(values.get, shape))]  # noqa: B905
    taken = {k: iter(v) for k, v in values.items()}
    nexts = [[taken[k].__next__ for k in shape] for shape in shapes]
    return [
        FrozenDict((k, f()) for k, f in zip(shapes[j], nexts[j], strict=True))
        if shapes[j]
        else EMPTY
        for j in index
    ]


def _read_only(values: list[Any]) -> list[Any]:
    """``values`` with every list and dict in them read-only."""
    if set(map(type, values)) <= _SCALARS:
        return values
    return [freeze(v) for v in values]


def from_columns(cols: SpanColumns) -> tuple[Span, ...]:
    """The spans ``cols`` holds, every column checked against the others (a
    :class:`RecordError` names what is off); their attrs are read-only."""
    n = len(cols.start)
    if len(cols.dur) != n:
        raise RecordError(
            f"spans.columns.dur has {len(cols.dur)} entries for {n} starts: a line twinkle "
            "did not write"
        )
    # (the bound first, in C: each span's end only when the bound does not settle it)
    if (
        n
        and cols.t0 + max(cols.start) + max(cols.dur) > INT64_MAX
        and cols.t0 + max(map(add, cols.start, cols.dur)) > INT64_MAX
    ):
        raise RecordError("spans.columns: a span ends past 2**63 - 1 ns (t0 + start + dur)")
    names = _column(cols.names, cols.name, n, "name")
    threads = _column(cols.threads, cols.thread, n, "thread")
    pids = _column(cols.pids, cols.pid, n, "pid")
    if not cols.errors and cols.error is not None:
        raise RecordError(
            "spans.columns has an 'error' list but no 'errors': a line twinkle did not write"
        )
    errors = _column(cols.errors, cols.error, n, "error") if cols.errors else repeat(None, n)
    t0 = cols.t0
    return tuple(
        Span(name, t0 + s, t0 + s + d, thread, pid, attrs, error)
        for name, s, d, thread, pid, attrs, error in zip(
            names, cols.start, cols.dur, threads, pids, _attrs(cols, n), errors, strict=False
        )
    )


def span_rows(line: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The spans of a ``spans`` line of ``events.jsonl`` (parsed by any JSON reader), as
    objects: ``name``, ``start_ns``, ``end_ns``, ``thread_id``, ``pid``, ``attrs``,
    ``error``. Reads the columns and the list of objects an older twinkle wrote."""
    if "columns" not in line:
        return [dict(s) for s in line.get("spans", ())]
    try:
        cols = msgspec.convert(line["columns"], SpanColumns)
    except msgspec.ValidationError as exc:
        raise RecordError(f"spans.columns: {exc}") from None
    return [s.to_dict() for s in from_columns(cols)]


class SpanBatchLine(Event, tag="spans", frozen=True, kw_only=True):
    """A ``spans`` line as the log holds it: a :class:`SpanBatch` whose spans are
    ``columns`` (or, in the log of an older twinkle, a ``spans`` list of objects)."""

    source: NonEmpty
    anchor: ClockAnchor
    columns: SpanColumns | None = None
    spans: tuple[Span, ...] | None = None
    dropped: Count = 0
    sent_anchor: ClockAnchor | None = None


class _ColumnsLine(Event, tag="spans", frozen=True, kw_only=True):
    """What the log writes for a span batch: every field, the spans as ``columns``."""

    source: NonEmpty
    anchor: ClockAnchor
    columns: SpanColumns
    dropped: Count
    sent_anchor: ClockAnchor | None


def batch_line(batch: SpanBatch) -> Event:
    """``batch`` as the log writes it."""
    return _ColumnsLine(
        run_id=batch.run_id,
        monotonic_ns=batch.monotonic_ns,
        wall_ns=batch.wall_ns,
        source=batch.source,
        anchor=batch.anchor,
        columns=to_columns(batch.spans),
        dropped=batch.dropped,
        sent_anchor=batch.sent_anchor,
    )


def line_batch(line: SpanBatchLine) -> SpanBatch:
    """The batch a ``spans`` line holds (its attrs not yet read-only when they came as a
    list of objects)."""
    if (line.columns is None) == (line.spans is None):
        raise RecordError(
            "event 'spans' needs its spans as 'columns' (or, from an older twinkle, a "
            f"'spans' list), {'not both' if line.spans is not None else 'and has neither'}"
        )
    spans = from_columns(line.columns) if line.columns is not None else line.spans
    assert spans is not None
    return SpanBatch(
        line.run_id,
        line.monotonic_ns,
        line.wall_ns,
        line.source,
        line.anchor,
        spans,
        line.dropped,
        line.sent_anchor,
    )
