"""Read-only JSON containers: what an event's free-form fields hold once it is checked.

An event is a frozen struct, but its dict fields (``config``, ``state``, span ``attrs``,
number maps) are containers an observer could change in place — and every later
observer, the event log written on another thread, the summary and the caller's own
data would then carry the change. :func:`freeze` turns such a value into a
:class:`FrozenDict` / :class:`FrozenList`: subclasses of ``dict`` and ``list`` (so
``isinstance``, equality, JSON encoders and ``copy`` behave as for the plain types)
whose mutating methods raise ``TypeError``. Freezing copies (a C-level dict/list copy
per container); the standard library has no read-only dict that JSON encoders accept
(``types.MappingProxyType`` is refused by orjson and msgspec), hence these two classes.
:class:`FrozenDict` is :class:`twinkle.reporting.FrozenDict` (a metric record's values
and attrs are the same class, defined in that lower layer); it is exported here.
"""

from __future__ import annotations

from typing import Any, NoReturn

from twinkle.reporting import FrozenDict

__all__ = ["EMPTY", "FrozenDict", "FrozenList", "freeze"]


#: the empty read-only dict every empty free-form field shares
EMPTY = FrozenDict()


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"{type(self).__name__} is read-only: an event's values are shared by every "
        "observer and the event log; copy it first (dict(value) / list(value))"
    )


class FrozenList(list[Any]):
    """A ``list`` whose content cannot change (see the module docstring)."""

    __slots__ = ()

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


_SCALARS = (str, int, float, bool, type(None))


def freeze(value: Any) -> Any:
    """``value`` with every dict and list in it read-only (a copy; scalars as they are)."""
    kind = type(value)
    if kind is dict or kind is FrozenDict:
        if not value:
            return EMPTY
        for v in value.values():
            if type(v) not in _SCALARS:
                return FrozenDict({k: freeze(v) for k, v in value.items()})
        return value if kind is FrozenDict else FrozenDict(value)
    if kind is list or kind is FrozenList:
        return FrozenList([freeze(v) for v in value])
    return value
