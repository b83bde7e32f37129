"""Iteration timing."""

from __future__ import annotations

import datetime
import logging
import time
from typing import List, Optional, Tuple

from treadle.events import ScalarKind

from .base import HookBase

__all__ = ["IterationTimer"]

logger = logging.getLogger(__name__)


class IterationTimer(HookBase):
    """Publishes ``time``, the seconds of each iteration, and logs the overall
    speed after training.

    ``time`` runs from the start of the iteration, before every
    ``before_step`` hook, to the end of the step, before every ``after_step``
    hook: it covers the step and excludes the hooks' after-step work (a
    checkpoint, an evaluation), wherever this hook is registered. The trainer
    reads those two clocks (:attr:`TrainerBase.iter_start_time` and
    :attr:`~TrainerBase.step_end_time`), so the hook adds no clock read and
    no ``before_step`` call to the iteration.

    On GPU the value is host time: a single iteration can be off while the
    device catches up, but the median that writers show is accurate because
    the host waits for the device at least once per flush.

    The first iterations of a run are slow for reasons that do not last
    (compilation, allocator warm-up, the data loader's first fetch); they are
    neither published nor counted in the speed summary, so that the medians,
    the ETA and ``samples/s`` describe the steady state.

    Args:
        warmup_iter: timing starts at the ``warmup_iter``-th iteration of
            the run, counted from 1 as detectron2 counts: the default 3 leaves
            out the first two (0 or 1 leaves out none).
    """

    def __init__(self, warmup_iter: int = 3) -> None:
        self._warmup_iter = warmup_iter
        self._start_time: float | None = None
        # Seconds inside timed iterations (those after the warm-up).
        self._timed_seconds = 0.0
        self._first_timed_iter = 0
        self._times: Optional[List[Tuple[float, int]]] = None

    def before_train(self) -> None:
        self._start_time = time.perf_counter()
        self._timed_seconds = 0.0
        self._first_timed_iter = self.trainer.start_iter + max(self._warmup_iter - 1, 0)
        storage = getattr(self.trainer, "storage", None)  # None: called outside train()
        self._times = storage.open_series("time", kind=ScalarKind.TIME, tensors=False) if storage is not None else None

    def after_step(self) -> None:
        # The trainer's clock reads, not fvcore's Timer, and a series, not
        # put_scalar: this runs every iteration.
        trainer = self.trainer
        it = trainer.iter
        if it >= self._first_timed_iter:
            seconds = trainer.step_end_time - trainer.iter_start_time
            self._timed_seconds += seconds
            if self._times is not None:
                self._times.append((seconds, it))
            else:
                trainer.storage.put_scalar("time", seconds, kind=ScalarKind.TIME)

    def after_train(self) -> None:
        if self._start_time is None:  # training failed before this hook's before_train
            return
        total = time.perf_counter() - self._start_time
        in_iterations = self._timed_seconds
        outside = total - in_iterations
        timed = self.trainer.iter - self._first_timed_iter
        if timed > 0 and in_iterations > 0:
            logger.info(
                "Overall training speed: %d iterations in %s (%.4f s / it)",
                timed,
                str(datetime.timedelta(seconds=int(in_iterations))),
                in_iterations / timed,
            )
        logger.info(
            "Total training time: %s (%s on hooks outside iterations)",
            str(datetime.timedelta(seconds=int(total))),
            str(datetime.timedelta(seconds=int(max(outside, 0)))),
        )
