"""Flow: the streaming driver that runs rollout producers ahead of the trainer.

:class:`StreamingDriver` buffers what producers make (bounded, staleness-bounded),
hands the trainer batches of :class:`Item` and publishes weights back to the engines.
It publishes exactly three events: ``iteration_started``, ``weights_published`` and
``snapshot``; it holds no business definitions (tokens, rewards, phases).
:meth:`StreamingDriver.state` is a :class:`DriverState`; each producer's ``state`` is a
:class:`ProducerState`.
"""

from twinkle.driver._driver import CloseReport, StreamingDriver
from twinkle.driver._state import DriverState, ProducerState, ProducerStats
from twinkle.driver._types import (
    Ack,
    DriverTimeoutError,
    Item,
    Producer,
    ProducerLike,
    ProducersExhaustedError,
    Publisher,
    WeightLoader,
)

__all__ = [
    "Ack",
    "CloseReport",
    "DriverState",
    "DriverTimeoutError",
    "Item",
    "Producer",
    "ProducerLike",
    "ProducerState",
    "ProducerStats",
    "ProducersExhaustedError",
    "Publisher",
    "StreamingDriver",
    "WeightLoader",
]
