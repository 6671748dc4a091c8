"""Flow: the streaming driver that runs rollout producers ahead of the trainer.

:class:`StreamingDriver` buffers what producers make (bounded, staleness-bounded),
hands the trainer batches of :class:`Item` and publishes weights back to the engines.
It publishes exactly three events: ``iteration_started``, ``weights_published`` and
``snapshot``; it holds no business definitions (tokens, rewards, phases).
"""

from twinkle.driver._driver import CloseReport, StreamingDriver
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
    "DriverTimeoutError",
    "Item",
    "Producer",
    "ProducerLike",
    "ProducersExhaustedError",
    "Publisher",
    "StreamingDriver",
    "WeightLoader",
]
