"""Periodic evaluation."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional

from treadle.evaluation.results import flatten_results
from treadle.events import ScalarKind
from treadle.events.printer import after_iterations
from treadle.utils import comm

from .base import HookBase
from .ema import EMA
from .periods import Period
from .precise_bn import PreciseBN

__all__ = ["EvalHook"]

logger = logging.getLogger(__name__)


class EvalHook(HookBase):
    """Runs ``eval_function`` every ``period`` iterations and after training.

    Results (a possibly nested dict of numbers) are flattened to ``name/key``
    scalars and put into storage without smoothing, at the iteration they
    were computed after, so every evaluation reaches ``metrics.json`` and
    TensorBoard whatever the writer's period.

    The final evaluation runs in the ``after_step`` of the run's last
    iteration, so the hooks after this one see it there, in their
    ``after_step`` and in the last epoch's ``after_epoch``; as detectron2's,
    its results are put at ``max_iter`` (the number of iterations run: a row
    of its own in ``metrics.json``). A run ended by a stop request at an
    iteration it did not evaluate (a stop that is not early stopping's) is
    evaluated in ``after_train``, at ``trainer.iter`` (the number of
    iterations run) too. None is run when training raised or was
    interrupted (a preemption: the resumed run will evaluate). The log
    counts both one way, the iterations run: ``Evaluation after 1200
    iterations`` (row 1199), ``Evaluation after 1500 iterations`` (row 1500).

    Runs on every rank: ``eval_function`` is expected to evaluate its shard
    and reduce (``inference_on_dataset`` does). When an :class:`EMA` hook with
    ``eval_with_ema=True`` is registered, evaluation runs on the averaged
    weights.

    Order: after :class:`EMA` and :class:`PreciseBN` (it evaluates the weights
    and statistics they produce at the same iteration).

    Args:
        period: iterations (or a :class:`Period`) between evaluations; 0
            evaluates only after training.
        eval_function: called with no arguments; returns the results dict.
        eval_after_train: also evaluate once training ends.
    """

    runs_after = (EMA, PreciseBN)
    order_reason = (
        "it evaluates the averaged weights and the BatchNorm statistics those hooks produce at the same "
        "iteration; registered before them, it would evaluate the previous iteration's"
    )

    def __init__(
        self,
        period: int | Period,
        eval_function: Callable[[], Optional[Mapping[str, Any]]],
        eval_after_train: bool = True,
    ) -> None:
        self._period = period if isinstance(period, Period) else Period(period)
        if not callable(eval_function):
            raise TypeError(f"EvalHook needs a callable eval_function, got {type(eval_function).__name__}")
        self._func = eval_function
        self._eval_after_train = eval_after_train
        # The final evaluation is the last iteration's.
        self.runs_at_last_iteration = eval_after_train
        self.last_eval_iter: Optional[int] = None
        self.last_results: Dict[str, float] = {}

    def before_train(self) -> None:
        self._period.resolve(self.trainer, "EvalHook")
        self.last_eval_iter = None

    def after_step_period(self) -> Optional[int]:
        return self._period.iterations

    def after_step(self) -> None:
        iteration = self.trainer.iter
        # The final evaluation is put at the number of iterations run (see the class docstring).
        self._do_eval(iteration + 1 if iteration + 1 == self.trainer.max_iter else iteration, iteration + 1)

    def after_train(self) -> None:
        if not self._eval_after_train or self.trainer.training_error is not None or self.trainer.interrupted:
            return
        # The last iteration run was evaluated (the run's last, or a stop
        # request right after a periodic evaluation): those are the final weights.
        if self.last_eval_iter == self.trainer.iter - 1:
            return
        self._do_eval(self.trainer.iter, self.trainer.iter)

    def _ema_context(self) -> contextlib.AbstractContextManager:
        for h in self.hooks_of(EMA):
            if h.eval_with_ema:
                return h.averaged_weights()
        return contextlib.nullcontext()

    def _do_eval(self, iteration: int, run: int) -> None:
        """Evaluates; the results go to the storage at ``iteration`` (their
        row) and to the log as computed after ``run`` iterations."""
        with self._ema_context():
            results = self._func()
        self.last_eval_iter = self.trainer.iter
        if results:
            if not isinstance(results, Mapping):
                raise TypeError(
                    f"eval_function must return a dict of results, got {type(results).__name__}"
                )
            flat = flatten_results(results)
            for name, value in flat.items():
                if not math.isfinite(value):
                    logger.warning("Evaluation result %s is %s %s", name, value, after_iterations(run))
            self.trainer.storage.put_scalars(
                smoothing_hint=False, cur_iter=iteration, kind=ScalarKind.METRIC, **flat
            )
            self.last_results = flat
            logger.info(
                "Evaluation %s: %s", after_iterations(run), ", ".join(f"{k}={v:.6g}" for k, v in flat.items())
            )
        # Ranks leave together: a fast rank must not start the next step's
        # collectives while another still evaluates.
        comm.synchronize()

