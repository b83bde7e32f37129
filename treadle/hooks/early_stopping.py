"""Stopping when a metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, List, Optional, Tuple

from treadle.events import ScalarKind
from treadle.evaluation.registry import metric_mode

from .base import HookBase
from .evaluation import EvalHook
from .periods import Period

if TYPE_CHECKING:
    from treadle.events import EventStorage

__all__ = ["EarlyStopping"]

logger = logging.getLogger(__name__)


def is_better(value: float, best: float, mode: str, min_delta: float) -> bool:
    return value > best + min_delta if mode == "max" else value < best - min_delta


def latest_metric(storage: "EventStorage", metric: str, owner: str, *,
                  since: Optional[int] = None) -> Tuple[float, int]:
    """``metric``'s latest value and the iteration it was put at. With
    ``since``, a training scalar's value is the one over the iterations from
    ``since`` to its latest (:meth:`~treadle.events.EventStorage.value_over`,
    NaN where none is a number): an epoch's mean, as the history's row
    holds it, not its last batch's."""
    latest = storage.latest()
    if metric not in latest:
        known = sorted(k for k in latest if storage.kind(k) == "metric")
        raise KeyError(f"{owner}: the evaluation did not produce '{metric}'. Evaluation results: {known}")
    value, iteration = latest[metric]
    if since is not None and storage.kind(metric) != ScalarKind.METRIC:
        over = storage.value_over(metric, since, iteration)
        value = math.nan if over is None else over
    return value, iteration


def period_start(period: Optional[Period], iteration: int) -> Optional[int]:
    """The first iteration of the period ``iteration`` ends (or falls in, at
    the end of training); ``None`` without a period (an evaluation is read as it is)."""
    if period is None or not period.iterations:
        return None
    return iteration - iteration % period.iterations


class EarlyStopping(HookBase):
    """Stops training when ``metric`` has not improved by more than
    ``min_delta`` for ``patience`` evaluations in a row.

    Runs after_step, after the :class:`EvalHook` that produces ``metric``,
    at the iterations it evaluated. It stops through the loop's stop
    request, so ``after_train`` runs as on success: the final checkpoint and
    evaluation still happen. A NaN result counts as no improvement. Its
    counters are kept in the trainer's state and survive a resume.

    ``mode`` None infers the direction from the metric
    (:func:`~treadle.evaluation.metric_mode`), as :class:`BestCheckpointer` does.
    With ``period``, the metric is read every ``period`` iterations instead,
    with no evaluation needed: a training scalar (``total_loss``), read as
    its mean over those iterations (an epoch's: the history's
    ``train_loss``); ``patience`` then counts those readings.
    """

    runs_after = (EvalHook,)
    order_reason = "it reads the evaluation's result of the same iteration"
    state_attributes = ("best_metric", "best_iter", "num_bad_evals")

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: Optional[str] = None, *,
                 period: Optional[int] = None) -> None:
        if mode is None:
            mode = metric_mode(metric)
        elif mode not in ("max", "min"):
            raise ValueError(f"EarlyStopping mode must be 'max', 'min' or None, got {mode!r}")
        if patience < 1:
            raise ValueError(f"EarlyStopping patience must be >= 1, got {patience}")
        if min_delta < 0:
            raise ValueError(f"EarlyStopping min_delta must be >= 0, got {min_delta}")
        self.metric = metric
        self.patience = patience
        self.min_delta = min_delta
        self.mode = mode
        self.best_metric: Optional[float] = None
        self.best_iter: Optional[int] = None
        self.num_bad_evals = 0
        self._period = Period(period) if period is not None else None
        self._eval_hooks: List[EvalHook] = []

    def before_train(self) -> None:
        self._eval_hooks = self.hooks_of(EvalHook)
        if not self._eval_hooks and self._period is None:
            raise ValueError(f"EarlyStopping('{self.metric}') needs an EvalHook registered before it "
                             "(or period=N to watch a training scalar such as 'total_loss' every N iterations).")

    # With a period, none at the last iteration: the run ends there, nothing to stop.
    runs_at_last_iteration = False

    def after_step_period(self) -> Optional[int]:
        # Watching evaluations: every iteration, to see where one ran.
        return None if self._period is None else self._period.iterations

    def after_step(self) -> None:
        if self._period is None:
            if self.trainer.iter + 1 == self.trainer.max_iter:
                return  # the run ends here: its final evaluation has nothing to stop
            if not any(h.last_eval_iter == self.trainer.iter for h in self._eval_hooks):
                return
        value, metric_iter = latest_metric(self.trainer.storage, self.metric, "EarlyStopping",
                                           since=period_start(self._period, self.trainer.iter))
        if not math.isnan(value) and (self.best_metric is None or is_better(value, self.best_metric, self.mode, self.min_delta)):
            self.best_metric, self.best_iter = value, metric_iter
            self.num_bad_evals = 0
            return
        self.num_bad_evals += 1
        if self.num_bad_evals >= self.patience:
            self.trainer.request_stop(
                f"early stopping: {self.metric} has not improved by more than {self.min_delta} for "
                f"{self.patience} {'evaluation(s)' if self._period is None else 'check(s)'}; "
                f"best {self.best_metric} at iteration {self.best_iter}"
            )
