"""Publishing weights: fan a version out to every engine and collect acknowledgements.

A publication runs on its own daemon thread so that the trainer may overlap it with the
next iteration; with a list of engines each ``load_weights`` runs on its own thread too,
so engines load concurrently and one slow engine does not delay another's ack.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twinkle.driver._types import Publisher, WeightLoader, check_names
from twinkle.driver._wait import POLL_S
from twinkle.errors import InvalidArgumentError

__all__ = ["PublishFailure", "PublishTarget", "adapt_publisher"]

Clock = Callable[[], int]


class PublishFailure(Exception):
    """Internal: a publication failed in ``where`` (an engine or the publisher)."""

    def __init__(self, where: str, exc: BaseException) -> None:
        super().__init__(where)
        self.where = where
        self.exc = exc


class PublishTarget:
    """Where weights go: a caller's publisher function or a set of named engines."""

    __slots__ = ("_engines", "_publisher", "threads")

    def __init__(
        self,
        *,
        publisher: Publisher | None = None,
        engines: Mapping[str, WeightLoader] | None = None,
    ) -> None:
        self._publisher = publisher
        self._engines = dict(engines or {})
        #: the engine threads started so far (the driver joins them on close)
        self.threads: list[tuple[str, threading.Thread]] = []

    @property
    def engine_names(self) -> tuple[str, ...] | None:
        """The engines that must acknowledge (``None``: whatever the publisher yields)."""
        return tuple(self._engines) if self._publisher is None else None

    def run(
        self,
        version: int,
        weights: Any,
        clock: Clock,
        cancelled: threading.Event,
        acked: list[str],
    ) -> list[tuple[str, int]]:
        """Publish ``version``; return ``(engine, acked_ns)`` once every engine acked.

        ``acked`` receives each engine name as its acknowledgement arrives. Raises
        :class:`PublishFailure` naming the engine or the publisher that failed.
        """
        if self._publisher is not None:
            return self._run_publisher(self._publisher, version, weights, clock, acked)
        return self._run_engines(version, weights, clock, cancelled, acked)

    @staticmethod
    def _run_publisher(
        publisher: Publisher, version: int, weights: Any, clock: Clock, acked: list[str]
    ) -> list[tuple[str, int]]:
        acks: list[tuple[str, int]] = []
        try:
            for ack in publisher(version, weights):
                acks.append(_ack(ack, clock))
                acked.append(acks[-1][0])
        except PublishFailure:
            raise
        except BaseException as exc:
            raise PublishFailure("the publisher", exc) from exc
        if not acks:
            raise PublishFailure(
                "the publisher",
                InvalidArgumentError(
                    f"the publisher acknowledged no engine for version {version}; it must "
                    "yield one ack (engine name or (engine, acked_ns)) per engine"
                ),
            )
        check = [engine for engine, _ in acks]
        if len(set(check)) != len(check):
            raise PublishFailure(
                "the publisher",
                InvalidArgumentError(
                    f"the publisher acknowledged an engine twice for version {version}: "
                    f"{check!r}; yield one ack per engine"
                ),
            )
        return acks

    def _run_engines(
        self,
        version: int,
        weights: Any,
        clock: Clock,
        cancelled: threading.Event,
        acked_names: list[str],
    ) -> list[tuple[str, int]]:
        results: queue.Queue[tuple[str, int, BaseException | None]] = queue.Queue()

        def load(name: str, engine: WeightLoader) -> None:
            try:
                engine.load_weights(version, weights)
            except BaseException as exc:
                results.put((name, clock(), exc))
            else:
                results.put((name, clock(), None))

        for name, engine in self._engines.items():
            thread = threading.Thread(
                target=load,
                args=(name, engine),
                name=f"twinkle-load-{name}-v{version}",
                daemon=True,
            )
            self.threads.append((name, thread))
            thread.start()
        acked: dict[str, int] = {}
        while len(acked) < len(self._engines):
            try:
                name, acked_ns, exc = results.get(timeout=POLL_S)
            except queue.Empty:
                if cancelled.is_set():
                    raise PublishFailure(
                        "the driver",
                        InvalidArgumentError("closed while engines were loading weights"),
                    ) from None
                continue
            if exc is not None:
                raise PublishFailure(f"engine {name!r}", exc) from exc
            acked[name] = acked_ns
            acked_names.append(name)
        self.threads = [(n, t) for n, t in self.threads if t.is_alive()]
        # Declaration order, not arrival order: the same engines give the same event.
        return [(name, acked[name]) for name in self._engines]

    def pending(self, acked: Sequence[str]) -> list[str] | None:
        """Engines that have not acknowledged yet (``None``: a publisher function's
        engines are not known in advance)."""
        if self._publisher is not None:
            return None
        return [n for n in self._engines if n not in acked]


def _ack(ack: object, clock: Clock) -> tuple[str, int]:
    if isinstance(ack, str) and ack:
        return ack, clock()
    if (
        isinstance(ack, tuple)
        and len(ack) == 2
        and isinstance(ack[0], str)
        and ack[0]
        and isinstance(ack[1], int)
        and not isinstance(ack[1], bool)
    ):
        return ack[0], ack[1]
    engine = getattr(ack, "engine", None)
    acked_ns = getattr(ack, "acked_ns", None)
    if isinstance(engine, str) and engine and isinstance(acked_ns, int):
        return engine, acked_ns
    raise InvalidArgumentError(
        f"the publisher yielded {ack!r}; yield an engine name, (engine, acked_ns) with the "
        "bus clock's ns, or an EngineAck"
    )


def _engine_name(obj: object, index: int) -> str:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) and name else f"engine{index}"


def adapt_publisher(
    publisher: Publisher | WeightLoader | Sequence[WeightLoader] | Mapping[str, WeightLoader],
) -> PublishTarget:
    """Normalise what the caller gave as ``publisher=`` into a :class:`PublishTarget`."""
    engines: dict[str, WeightLoader]
    if isinstance(publisher, Mapping):
        engines = dict(zip(check_names(publisher, "engine"), publisher.values(), strict=True))
    elif isinstance(publisher, WeightLoader):
        engines = {_engine_name(publisher, 0): publisher}
    elif callable(publisher):
        return PublishTarget(publisher=publisher)
    elif isinstance(publisher, Sequence) and not isinstance(publisher, str | bytes):
        names = check_names((_engine_name(e, i) for i, e in enumerate(publisher)), "engine")
        engines = dict(zip(names, publisher, strict=True))
    else:
        raise InvalidArgumentError(
            f"publisher is a {type(publisher).__name__}; pass publisher(version, weights) -> "
            "acks, an engine with load_weights(version, weights), or a list/mapping of them"
        )
    if not engines:
        raise InvalidArgumentError("publisher has no engines; give at least one engine")
    for name, engine in engines.items():
        if not isinstance(engine, WeightLoader):
            raise InvalidArgumentError(
                f"engine {name!r} ({type(engine).__name__}) has no load_weights(version, "
                "weights) method"
            )
    return PublishTarget(engines=engines)
