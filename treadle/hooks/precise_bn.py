"""Precise BatchNorm statistics before evaluation."""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import nn

from treadle.utils.device import to_device
from treadle.utils.env import import_fvcore_nn

from .base import HookBase
from .ema import EMA
from .periods import Period

__all__ = ["PreciseBN"]

logger = logging.getLogger(__name__)


def _default_inputs(batch: Any) -> Any:
    """The model input of a batch: the first element of an (inputs, targets) pair."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0]
    return batch


def _forever(loader: Iterable[Any]) -> Iterator[Any]:
    # Not itertools.cycle: it would keep every batch of the first pass in memory.
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("PreciseBN's data loader yields no batches")


class PreciseBN(HookBase):
    """Recomputes BatchNorm running statistics as true averages over
    ``num_iter`` batches (fvcore's precise BN), before evaluation.

    Running averages with momentum lag behind the weights; evaluating with
    them understates a model's accuracy. This hook runs every ``period``
    iterations and at the run's last iteration, in train mode and without
    gradients; after training too when a stop request ended the run at an
    iteration it did not run at (the :class:`EvalHook` then evaluates there).
    The iteration of its last run (``last_update_iter``) is kept in
    checkpoints, so a run preempted after its last iteration resumes with
    the final statistics, not a second pass over other batches.

    Register it before :class:`EvalHook` (which declares so) with the same
    period, so each evaluation sees fresh statistics, and after :class:`EMA`:
    when evaluation runs on the EMA average, the statistics are recomputed
    for the averaged weights, which must be this iteration's. It iterates its own
    ``data_loader`` (not the training loader, whose position is part of the
    resumable state).

    Args:
        period: iterations (or a :class:`Period`) between recomputations.
        model: the model; its BatchNorm layers are updated in place.
        data_loader: an iterable of training-like batches.
        num_iter: batches to average over.
        input_fn: maps a batch to the model's input (default: ``batch[0]``
            of an ``(inputs, targets)`` pair, else the batch).
    """

    runs_after = (EMA,)
    state_attributes = ("last_update_iter",)
    order_reason = "under EMA evaluation it recomputes the statistics of this iteration's averaged weights"

    def __init__(
        self,
        period: int | Period,
        model: nn.Module,
        data_loader: Iterable[Any],
        num_iter: int = 200,
        *,
        input_fn: Callable[[Any], Any] = _default_inputs,
    ) -> None:
        self._period = period if isinstance(period, Period) else Period(period)
        self._model = model
        self._data_loader = data_loader
        self._num_iter = num_iter
        self._input_fn = input_fn
        # The iteration of the last recomputation, kept in checkpoints: a run preempted
        # after its last iteration finishes on resume without recomputing its final statistics.
        self.last_update_iter: Optional[int] = None
        # fvcore.nn is imported when a PreciseBN is made: importing it takes
        # ~5 MB and 60 modules that a run without PreciseBN never uses.
        self._disabled = len(import_fvcore_nn("fvcore.nn.precise_bn").get_bn_modules(model)) == 0
        if self._disabled:
            logger.info("PreciseBN is disabled: the model has no BatchNorm layer in training mode.")

    def before_train(self) -> None:
        self._period.resolve(self.trainer, "PreciseBN")
        if self.last_update_iter is not None and self.last_update_iter >= self.trainer.start_iter:
            self.last_update_iter = None  # of another run: this one starts before it

    def after_step_period(self) -> Optional[int]:
        return self._period.iterations

    def after_step(self) -> None:
        self.update_stats()
        self.last_update_iter = self.trainer.iter

    def after_train(self) -> None:
        trainer = self.trainer
        if trainer.training_error is None and not trainer.interrupted and self.last_update_iter != trainer.iter - 1:
            self.update_stats()

    def _inputs(self) -> Iterator[Any]:
        device = next(iter(self._model.parameters())).device
        for batch in itertools.islice(_forever(self._data_loader), self._num_iter):
            yield to_device(self._input_fn(batch), device)

    @torch.no_grad()
    def update_stats(self) -> None:
        """Recomputes the statistics now: of the weights that are evaluated.

        With an :class:`EMA` hook that evaluates the average, the statistics
        are recomputed with the averaged weights loaded and stored in the
        average (the trained weights and their statistics are left as they
        were); otherwise with the trained weights, in place.
        """
        if self._disabled:
            return
        ema = self._evaluated_ema()
        if ema is None:
            self._recompute()
            return
        with ema.averaged_weights():
            self._recompute()
            ema.take_buffers()

    def _evaluated_ema(self) -> Optional[EMA]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return None
        return next((h for h in self.hooks_of(EMA) if h.eval_with_ema), None)

    def _recompute(self) -> None:
        # fvcore assigns new tensors to running_mean/var; anything holding the
        # buffers (EMA's pairs, an optimizer, DDP's buffer broadcast) would keep
        # the stale ones. The results are copied into the buffers themselves.
        precise_bn = import_fvcore_nn("fvcore.nn.precise_bn")
        get_bn_modules, update_bn_stats = precise_bn.get_bn_modules, precise_bn.update_bn_stats

        modules = get_bn_modules(self._model)
        buffers = [{name: buf for name, buf in bn.named_buffers(recurse=False)} for bn in modules]
        was_training = self._model.training
        self._model.train()
        try:
            logger.info("Recomputing BatchNorm statistics over %d batches", self._num_iter)
            update_bn_stats(self._model, self._inputs(), self._num_iter)
        finally:
            self._model.train(was_training)
            for bn, original in zip(modules, buffers):
                for name, tensor in original.items():
                    current = getattr(bn, name)
                    if current is not tensor:
                        tensor.copy_(current)
                        setattr(bn, name, tensor)
