"""``FrozenDict``: the one read-only ``dict`` of twinkle.

A metric record's ``values`` and ``attrs`` (:class:`~twinkle.reporting.MetricRecord`)
and an event's free-form fields (:func:`twinkle.events.freeze`) are shared by everyone
who holds them: every backend, every observer, the event log written on another
thread. So they are read-only, yet still plain JSON objects to the code that reads and
writes them. :class:`FrozenDict` is a subclass of ``dict`` (so ``isinstance``,
equality, ``repr``, orjson and msgspec treat it as a plain dict, with no ``default=``
callback) whose mutating methods raise ``TypeError``; being immutable it is hashable
(a record can go in a set) and copies are itself. The standard library has no read-only
dict that JSON encoders accept (``types.MappingProxyType`` is refused by orjson and
msgspec), hence this class.

It lives in this layer, the lowest that has a use for it, so that the events layer
above (:mod:`twinkle.events._frozen`) uses the same class.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["EMPTY", "FrozenDict"]


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"{type(self).__name__} is read-only: an event's values are shared by every "
        "observer and the event log, a record's values and attrs by every backend; copy "
        "it first (dict(value)), or build a new record"
    )


class FrozenDict(dict[str, Any]):
    """A ``dict`` whose content cannot change (see the module docstring)."""

    __slots__ = ()

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:  # pickle rebuilds it whole
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        # Immutable, so hashable: records can go in sets and be dict keys. (Hashing
        # raises TypeError when a value is not hashable, as for a tuple holding a list.)
        return hash(frozenset(self.items()))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


EMPTY: FrozenDict = FrozenDict()
"""The one empty frozen dict (most spans and many records carry no attributes)."""
