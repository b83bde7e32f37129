"""Periods given in iterations or in epochs."""

from __future__ import annotations

from .base import TrainerProtocol

__all__ = ["Period"]

_UNITS = ("iter", "epoch")


class Period:
    """Every ``every`` iterations (``unit="iter"``) or epochs (``unit="epoch"``).

    Epochs become iterations when training starts, from
    ``trainer.epoch_length``; a period in epochs on a trainer that does not
    know its epoch length (an infinite stream, say) is an error. A period
    of 0 never fires.
    """

    def __init__(self, every: int, unit: str = "iter") -> None:
        if unit not in _UNITS:
            raise ValueError(f"A period's unit must be one of {_UNITS}, got {unit!r}")
        if not isinstance(every, int) or every < 0:
            raise ValueError(f"A period must be a non-negative integer, got {every!r}")
        self.every = every
        self.unit = unit
        self.iterations = every if unit == "iter" else 0

    def resolve(self, trainer: TrainerProtocol, owner: str) -> int:
        """Fixes the period in iterations; called in ``before_train``."""
        if self.unit == "epoch" and self.every > 0:
            if not trainer.epoch_length:
                raise ValueError(
                    f"{owner} has a period of {self.every} epoch(s), but the trainer does not know its "
                    "epoch length (the data has no length). Give the period in iterations."
                )
            self.iterations = self.every * trainer.epoch_length
        return self.iterations

    def fires_after(self, iteration: int) -> bool:
        """Whether the period ends with ``iteration`` (0-based)."""
        return self.iterations > 0 and (iteration + 1) % self.iterations == 0

    def __repr__(self) -> str:
        return f"Period({self.every}, {self.unit!r})"
