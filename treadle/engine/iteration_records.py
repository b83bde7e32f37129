"""Values the loop itself records after each step, for hooks that would
otherwise need a call at every iteration (see :meth:`TrainerBase.time_iterations`
and :meth:`TrainerBase.record_every_iteration`)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

__all__ = ["IterationRecords"]


class IterationRecords:
    """The series a training's hooks asked the loop to append to after each step.

    On a fast step a hook's call at every iteration is a measurable part of
    its cost; the loop appends here with the clock reads it makes anyway.
    Reset at the start of each training.
    """

    def __init__(self) -> None:
        self.times: Optional[List[Tuple[float, int]]] = None
        self.times_from = 0
        self.timed_seconds = 0.0
        self.reads: List[Tuple[List[Tuple[Any, int]], Callable[[], Any]]] = []
        # Whether anything is asked for: the loop's one check per iteration.
        self.active = False

    def time_from(self, points: List[Tuple[float, int]], from_iter: int) -> None:
        """Appends ``(seconds, iteration)`` to ``points`` from ``from_iter`` on."""
        self.times, self.times_from, self.active = points, from_iter, True

    def read_every_iteration(self, points: List[Tuple[Any, int]], read: Callable[[], Any]) -> None:
        """Appends ``(read(), iteration)`` to ``points`` at every iteration."""
        self.reads.append((points, read))
        self.active = True

    def add(self, iteration: int, seconds: float) -> None:
        """Records ``iteration``, whose step took ``seconds`` from its start."""
        if self.times is not None and iteration >= self.times_from:
            self.times.append((seconds, iteration))
            self.timed_seconds += seconds
        for points, read in self.reads:
            points.append((read(), iteration))
