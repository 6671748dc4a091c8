"""Which side of a streaming pipeline each piece of the publish phase ran on: the
engines' (an engine loading the weights) or the trainer's (writing or sending them),
for the critical path (docs/metrics.md, "What limits the run")."""

from __future__ import annotations

from dataclasses import dataclass, field

from twinkle.observers._config import ObserverConfig
from twinkle.observers._measure import PublishPiece

__all__ = ["PublishSides"]


@dataclass(slots=True)
class PublishSides:
    """The publish phase's pieces as the timeline keeps them, and the threads that ran
    the generation and the training phases (any span of them, a late one too).

    A piece's side is the span's own where it says it (True: it names an ``engine``, or
    its source is placed on the engines' side by ``config.placement``; False: placed on
    the trainer's: :attr:`ObserverConfig.worker_sides`), else its thread's, as of
    :meth:`sides`: the engines' when the thread ran generation and never training, else
    the trainer's."""

    #: the streaming run's publish, generation and training phases (None: no publish)
    phase: str | None = None
    generation: str | None = None
    train: str | None = None
    worker_sides: dict[str, bool] = field(default_factory=dict)
    #: (start, end, thread, side or None) of each piece
    pieces: list[tuple[int, int, int, bool | None]] = field(default_factory=list)
    generating: set[int] = field(default_factory=set)
    training: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, config: ObserverConfig) -> PublishSides:
        """For a run of ``config`` (one with no ``streaming.publish`` notes nothing)."""
        generation, training = config.streaming or (None, None)
        return cls(config.publish, generation, training, config.worker_sides)

    def note(
        self, phase: str, thread: int, start: int, end: int, *, source: str, engine: object
    ) -> None:
        """A piece of a span of ``phase`` placed in the timeline, from ``source``
        (``engine``: its attribute)."""
        if phase == self.phase:
            side = True if isinstance(engine, str) and engine else self.worker_sides.get(source)
            self.pieces.append((start, end, thread, side))
        else:
            self.note_thread(phase, thread)

    def note_thread(self, phase: str, thread: int) -> None:
        """``thread`` ran a span of ``phase`` (one wholly late too: it has no piece)."""
        if phase == self.generation:
            self.generating.add(thread)
        elif phase == self.train:
            self.training.add(thread)

    def sides(self) -> list[PublishPiece]:
        """Each piece's (start, end, on the engines' side)."""
        generating, training = self.generating, self.training
        return [
            (s, e, side if side is not None else (t in generating and t not in training))
            for s, e, t, side in self.pieces
        ]

    def keep(self, *, from_start: int | None = None, ending_after: int | None = None) -> None:
        """Keep only the pieces starting at or after ``from_start`` (a resume), or ending
        after ``ending_after`` (a finalised window); neither: none."""
        if from_start is not None:
            self.pieces = [p for p in self.pieces if p[0] >= from_start]
        elif ending_after is not None:
            self.pieces = [p for p in self.pieces if p[1] > ending_after]
        else:
            self.pieces = []
