"""The plain ``Trainer``'s step when a subclass overrides a point of the seeds' update.

:class:`TrainerStep` writes the seeds' update once, whole, calling the
``Trainer``'s methods of the seeds' names where the seeds call them; the
defaults of those methods (:class:`~treadle.compat.overrides.SeedOverrides`)
do their work themselves and never call back into the step. A ``Trainer``
that overrides none of them trains with :class:`~treadle.engine.EagerStep`,
whose update is one straight sequence without such points.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

import torch

from treadle.engine.steps import EagerStep
from treadle.evaluation.batch import batch_size
from treadle.evaluation.loss import as_losses
from treadle.events import ScalarKind
from treadle.utils.torch_internals import foreach_div_

if TYPE_CHECKING:
    from .events import SeedEventCalls

__all__ = ["TrainerStep", "forward_backward"]



def forward_backward(trainer: Any, step: "TrainerStep", batch: Any) -> Dict[str, torch.Tensor]:
    """One micro-batch of the seeds' update, written once for the step's
    micro-batch without a ``training_step`` override and for the default
    ``training_step`` (Hezar's ``super().training_step(batch)``): its losses
    under the step's precision (pytorch-accelerated's
    ``calculate_train_batch_loss`` where it is overridden or an
    ``on_train_step_end`` needs its output, which is then given to that event;
    else the ``Trainer``'s loss), then ``backward_step`` of their total
    divided by the update's micro-batches (whole inside an overridden
    ``training_step``, whose update's gradients are averaged at its end)."""
    # A Trainer without an update override trains with a plain EagerStep: its
    # training_step (called by hand) is then the loss and its backward alone.
    own = isinstance(step, TrainerStep)
    if own and step.needs_batch_output:
        with step.autocast():
            output = trainer.calculate_train_batch_loss(batch)
            if not isinstance(output, Mapping) or "loss" not in output:
                raise TypeError(f"{trainer.__class__.__name__}.calculate_train_batch_loss must return a dict with a "
                                f"'loss' (pytorch-accelerated's contract), got {type(output).__name__}")
            losses = as_losses(output["loss"], f"{trainer.__class__.__name__}.calculate_train_batch_loss")
        step.events.fire("train_step_end", batch=batch, batch_output=output)
        step.step_end_fired = True
    else:
        with step.autocast():
            losses = as_losses(trainer.batch_loss(batch), step.loss_source)
    count = step.loss_divisor() if own else step.grad_accum_steps
    trainer.backward_step(losses["total_loss"] if count == 1 else losses["total_loss"] / count)
    return losses


class TrainerStep(EagerStep):
    """The plain ``Trainer``'s step when a subclass overrides a point of the
    update: the seeds' update, each point calling the ``Trainer``'s method of
    the seed's name.

    - zeroing: ``optimizer_zero_grad()``;
    - each micro-batch: ``prepare_input_batch(batch)``, then Hezar's
      ``training_step(batch)`` (forward and backward), or
      ``calculate_train_batch_loss(batch)`` and ``backward_step(loss)``
      (:func:`forward_backward`), with pytorch-accelerated's
      ``on_train_step_start``/``on_train_step_end`` around it;
    - the step: ``optimization_step()`` (Hezar's) or ``optimizer_step()``;
    - or the whole update, qurious' ``train_step(batch)``, which returns
      floats, between ``on_train_step_start`` and ``on_train_step_end``.

    Gradient unscaling, ``after_backward`` hooks, clipping, accumulation,
    the data position and the published losses are as
    :class:`~treadle.engine.EagerStep`'s. Under an overridden
    ``training_step`` one rule holds for every backward of a micro-batch,
    treadle's (through ``super()``) and the override's own alike, whatever
    part of the loss each covers: it backpropagates its whole loss, and the
    update's gradients are divided by its micro-batches before hooks,
    clipping and the step, so that they are the micro-batches' mean, as
    Hezar's ``accelerator.backward`` makes them.
    """

    def __init__(self, *args: Any, owner: Any, overridden: FrozenSet[str], events: SeedEventCalls,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner = owner  # a weak proxy to the Trainer
        self.events = events
        names = ("train_step", "training_step", "optimization_step", "calculate_train_batch_loss",
                 "prepare_input_batch")
        self._overrides = {name: name in overridden for name in names}
        # What a batch's loss needs: the batch output when pytorch-accelerated's
        # calculate_train_batch_loss or on_train_step_end is there.
        self.needs_batch_output = self._overrides["calculate_train_batch_loss"] or "train_step_end" in events
        self._fires_step_start = "train_step_start" in events
        self._fires_step_end = "train_step_end" in events
        # Whether on_train_step_end was called in the training_step in progress (by its super()).
        self.step_end_fired = False
        # Whether an update of a training_step override has been seen to have gradients (checked once).
        self._own_backward_checked = False

    def loss_divisor(self) -> int:
        """What :func:`forward_backward` divides a micro-batch's loss by: the
        update's micro-batches, or 1 inside an overridden ``training_step``
        (whose update's gradients are averaged at its end)."""
        return 1 if self._overrides["training_step"] else self.update.micro_batches

    def run_step(self) -> None:
        if not self._overrides["train_step"] or not self.model.training:
            super().run_step()  # the other trainers' update (_update), or the step's message about eval mode
            return
        self._run_train_step()

    def _run_train_step(self) -> None:
        """qurious' ``train_step(batch)``: the whole update, returning floats,
        between pytorch-accelerated's ``on_train_step_start`` and
        ``on_train_step_end`` (whose batch output has the ``loss`` returned,
        as a tensor, and no model outputs)."""
        owner, storage = self._owner, self.storage
        start = time.perf_counter()
        batch = self.next_batch()
        data_time = time.perf_counter() - start
        if self._fires_step_start:
            self.events.fire("train_step_start")
        results = owner.train_step(batch)
        if not isinstance(results, Mapping) or "loss" not in results:
            raise TypeError(f"{owner.__class__.__name__}.train_step must return a dict with a 'loss' (qurious' "
                            f"contract), got {type(results).__name__}")
        if self._fires_step_end:
            self._fire_step_end(batch, torch.as_tensor(results["loss"]))
        for name, value in results.items():
            storage.put_scalar("total_loss" if name == "loss" else name, value, kind=ScalarKind.LOSS)
        storage.put_scalar("data_time", data_time, kind=ScalarKind.TIME)

    def _fire_step_end(self, batch: Any, loss: Any) -> None:
        """``on_train_step_end`` after an override that computed the batch's
        loss itself: its batch output is that loss, without model outputs."""
        self.events.fire("train_step_end", batch=batch,
                         batch_output={"loss": loss, "model_outputs": None, "batch_size": batch_size(batch)})

    def _update(self, next_batch: Callable[[], Any], count: int, *, hooks: bool = True
                ) -> Tuple[Dict[str, torch.Tensor], Optional[torch.Tensor], float]:
        """The other trainers' update, on the step's :class:`~treadle.engine.Update`'s parts:
        ``optimizer_zero_grad()``; :meth:`Update.accumulate
        <treadle.engine.Update.accumulate>` over ``count`` micro-batches, each
        ``prepare_input_batch``, ``on_train_step_start``, then
        ``training_step`` or :func:`forward_backward` (which run their
        backward); then :meth:`Update.step <treadle.engine.Update.step>` with
        ``optimization_step()`` (Hezar's) or ``optimizer_step()`` as its
        optimizer step. Returns the losses averaged over the micro-batches,
        the gradient norm before clipping and the seconds spent waiting for data."""
        owner, update = self._owner, self.update
        owner.optimizer_zero_grad()
        losses, data_time = update.accumulate(next_batch, self._micro_batch, count, self._published, backward=False)
        if self._overrides["training_step"]:
            self._average_training_step_gradients(count)
        optimizer_step = owner.optimization_step if self._overrides["optimization_step"] else owner.optimizer_step
        grad_norm = update.step(self.after_backward if hooks else None, optimizer_step)
        return losses, grad_norm, data_time

    def _micro_batch(self, batch: Any) -> Dict[str, torch.Tensor]:
        """One micro-batch's forward and backward, through the other trainers' points."""
        owner = self._owner
        if self._overrides["prepare_input_batch"]:
            batch = owner.prepare_input_batch(batch)
        if self._fires_step_start:
            self.events.fire("train_step_start")
        return self._training_step(batch) if self._overrides["training_step"] else forward_backward(owner, self, batch)

    def _training_step(self, batch: Any) -> Dict[str, torch.Tensor]:
        """Hezar's ``training_step(batch)``, under the step's precision; then
        ``on_train_step_end``, unless its ``super()`` called it."""
        owner = self._owner
        self.step_end_fired = False
        with self.autocast():
            losses = as_losses(owner.training_step(batch), f"{owner.__class__.__name__}.training_step")
        if self._fires_step_end and not self.step_end_fired:
            self._fire_step_end(batch, losses["total_loss"])
        return losses

    def _average_training_step_gradients(self, count: int) -> None:
        """The sum of the micro-batches' whole-loss gradients of a
        ``training_step`` override (its own backward, treadle's through
        ``super()``, or both), made their mean before hooks, clipping and the
        step see them (Hezar's accumulation); ``count``: the update's micro-batches."""
        parameters = self._parameters()
        if not self._own_backward_checked:
            # Once, at the first update: a training_step returning its loss without
            # its backward would otherwise train nothing, and say nothing.
            if not parameters:
                raise TypeError(f"{self._owner.__class__.__name__}.training_step returned its loss without a "
                                "backward: no parameter has a gradient, so nothing would train; call "
                                "loss.backward() in it (Hezar's accelerator.backward(loss)), or return "
                                "super().training_step(batch)")
            self._own_backward_checked = True
        if count > 1:
            foreach_div_([p.grad for p in parameters], count)

    def compute_loss(self, batch: Any) -> Any:
        return self._owner.batch_loss(batch)
