"""Iteration timing."""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, List, Tuple

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
    reads those two clocks (:attr:`~treadle.engine.TrainerBase.iter_start_time` and
    :attr:`~treadle.engine.TrainerBase.step_end_time`); this hook's ``after_step`` appends
    their difference to the storage's ``time`` series. (The loop once
    appended it itself, to save this call: ``benchmarks/peers.py
    --interleaved`` put the saving at 1.4 ± 0.9 µs per iteration, within
    the noise, so the hook is called like any other.)

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
        self._first_timed_iter = 0
        self._times: List[Tuple[Any, int]] = []
        self._timed_seconds = 0.0

    def before_train(self) -> None:
        self._start_time = time.perf_counter()
        trainer = self.trainer
        self._first_timed_iter = trainer.start_iter + max(self._warmup_iter - 1, 0)
        self._times = trainer.storage.open_series("time", kind=ScalarKind.TIME, tensors=False)
        self._timed_seconds = 0.0

    def after_step(self) -> None:
        trainer = self.trainer
        it = trainer.iter
        if it >= self._first_timed_iter:
            seconds = trainer.step_end_time - trainer.iter_start_time
            self._times.append((seconds, it))
            self._timed_seconds += seconds

    def after_train(self) -> None:
        if self._start_time is None:  # training failed before this hook's before_train
            return
        total = time.perf_counter() - self._start_time
        in_iterations = self._timed_seconds
        # Outside the step: every iteration's step counts as the step's, the
        # first ones too (a compilation is the step's time, not the hooks').
        step_seconds = self.trainer.timings().get("step", in_iterations)
        outside = total - step_seconds
        timed = self.trainer.iter - self._first_timed_iter
        if timed > 0 and in_iterations > 0:
            logger.info(
                "Overall training speed: %d iterations in %s (%.4f s / it)",
                timed,
                str(datetime.timedelta(seconds=int(in_iterations))),
                in_iterations / timed,
            )
        logger.info(
            "Total training time: %s (%s on hooks, outside the step)",
            str(datetime.timedelta(seconds=int(total))),
            str(datetime.timedelta(seconds=int(max(outside, 0)))),
        )
