"""Values and protocols of the streaming driver: items, producers, weight loaders, errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, runtime_checkable

from twinkle.errors import DriverError, InvalidArgumentError
from twinkle.events import EngineAck

__all__ = [
    "Ack",
    "DriverTimeoutError",
    "Item",
    "Producer",
    "ProducerLike",
    "ProducersExhaustedError",
    "Publisher",
    "WeightLoader",
    "adapt_producers",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Item(Generic[T]):
    """One produced item, as the trainer receives it.

    ``version`` is the weight version the producer was handed when it started producing
    ``payload`` (the driver's current version at that moment); ``produced_ns`` is the bus
    clock reading when the producer returned it.
    """

    payload: T
    version: int
    producer: str
    produced_ns: int


@runtime_checkable
class Producer(Protocol[T_co]):
    """An engine handle that produces one item per call for a given weight version."""

    def produce(self, version: int) -> T_co:
        """Produce one item with weights ``version``; raise ``StopIteration`` when done."""


@runtime_checkable
class WeightLoader(Protocol):
    """An inference engine that can load new weights; returning means *loaded*."""

    def load_weights(self, version: int, weights: Any) -> object:
        """Load ``weights`` as ``version``; return only once the engine serves them."""


#: What a producer may be: ``producer(version) -> item``, an engine handle with
#: ``produce(version)``, or an iterable (one item per ``next``; the driver tags each item
#: with the version current when it asked for it).
ProducerLike: TypeAlias = Callable[[int], T] | Producer[T] | Iterable[T]

#: One acknowledgement from a publisher: an engine name (the driver stamps the bus time
#: when it receives it), or ``(engine, acked_ns)`` / an ``EngineAck`` with a bus-clock time.
Ack: TypeAlias = str | tuple[str, int] | EngineAck

#: ``publisher(version, weights)`` loads ``weights`` on every engine and yields one
#: acknowledgement per engine as each engine confirms it loaded them.
Publisher: TypeAlias = Callable[[int, Any], Iterable[Ack]]


class DriverTimeoutError(DriverError, TimeoutError):
    """A driver call did not complete within its ``timeout``."""


class ProducersExhaustedError(DriverError):
    """Every producer is exhausted and the buffer holds fewer items than were asked for."""


def _name_of(obj: object, index: int, prefix: str) -> str:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) and name else f"{prefix}{index}"


def check_names(names: Iterable[str], what: str) -> list[str]:
    """``names`` as a list; a clear error for an empty or duplicate name."""
    seen: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{what} names must be non-empty strings, got {name!r}")
        if name in seen:
            raise InvalidArgumentError(
                f"two {what}s are named {name!r}; pass a mapping {{name: {what}}} with unique names"
            )
        seen.append(name)
    return seen


def _as_callable(name: str, obj: object) -> Callable[[int], Any]:
    if isinstance(obj, Producer):
        return obj.produce
    if callable(obj):
        return obj
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes):
        iterator: Iterator[Any] = iter(obj)

        def from_iterable(version: int) -> Any:
            return next(iterator)

        return from_iterable
    raise InvalidArgumentError(
        f"producer {name!r} is a {type(obj).__name__}; pass a callable producer(version) -> "
        "item, an object with produce(version), or an iterable of items"
    )


def adapt_producers(
    producers: Mapping[str, ProducerLike[Any]] | Sequence[ProducerLike[Any]],
) -> dict[str, Callable[[int], Any]]:
    """Name every producer and turn it into ``produce(version) -> item``."""
    if isinstance(producers, Mapping):
        pairs = list(producers.items())
    elif isinstance(producers, Sequence) and not isinstance(producers, str | bytes):
        pairs = [(_name_of(p, i, "producer"), p) for i, p in enumerate(producers)]
    else:
        raise InvalidArgumentError(
            f"producers must be a mapping {{name: producer}} or a sequence of producers, got "
            f"{type(producers).__name__}"
        )
    if not pairs:
        raise InvalidArgumentError("producers is empty; give the driver at least one producer")
    names = check_names((n for n, _ in pairs), "producer")
    return {name: _as_callable(name, obj) for name, (_, obj) in zip(names, pairs, strict=True)}
