"""The seeds' override points on the plain ``Trainer``, called where the seeds call them.

:mod:`treadle.compat.names` lists them; this module calls them:

- :class:`SeedOverrides`, a base of the ``Trainer``: the default of every
  called method (qurious' ``_prepare_batch``, pytorch-accelerated's
  ``calculate_train_batch_loss``, Hezar's ``training_step``...), so that an
  override's ``super()`` call and the helpers the seeds' examples call
  (``self._forward_pass(inputs)``) work as the seed documents them;
  their defaults do their work themselves: the step of a subclass that
  overrides a point of the update (:class:`~treadle.compat.step.TrainerStep`)
  calls them, and they never call back into the step;
- :class:`PreparedBatches` and :class:`StepResultsEvaluator`, the
  evaluation of qurious' ``_prepare_batch`` and ``eval_step`` overrides.

pytorch-accelerated's events are :mod:`treadle.compat.events`'s.
"""

from __future__ import annotations

import collections
import inspect
import traceback
from collections import abc
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, cast

import torch

from treadle.evaluation import DatasetEvaluator
from treadle.evaluation.batch import TARGET_KEY, batch_size, forward_batch, move_to_device
from treadle.evaluation.loss import LOSS_FN, MODEL, as_losses
from treadle.utils import comm

from .events import TRAIN_EPOCH_EVENTS, RunEvents, SeedEventCalls, TrainEvents, is_event_callback  # noqa: F401 - their old place
from .step import TrainerStep, forward_backward  # TrainerStep: importable from its old place too
from treadle.engine.steps import EagerStep

__all__ = ["SeedOverrides", "TrainEvents", "RunEvents", "StepResultsEvaluator", "PreparedBatches",
           "SeedEventCalls", "raised_in",
           "UPDATE_POINTS", "EVAL_POINTS", "TRAIN_EPOCH_EVENTS"]

#: The methods whose override makes the ``Trainer`` train with :class:`~treadle.compat.step.TrainerStep`.
UPDATE_POINTS = ("train_step", "calculate_train_batch_loss", "backward_step", "optimizer_step",
                 "optimizer_zero_grad", "training_step", "optimization_step", "prepare_input_batch",
                 "_prepare_batch", "_forward_pass", "_compute_loss")
#: The methods whose override changes how an evaluation batch is computed.
EVAL_POINTS = ("eval_step", "calculate_eval_batch_loss", "evaluation_step", "prepare_input_batch",
               "_prepare_batch", "_forward_pass", "_compute_loss")


class _NoAccelerator:
    """``self.accelerator`` (Hezar's) and ``self._accelerator``
    (pytorch-accelerated's): Hugging Face Accelerate's object, which the
    ``Trainer`` has not. Reading it raises an ``AttributeError`` that says
    what to write instead; a subclass that sets one of its own keeps it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type) -> Any:
        if trainer is None:
            return self
        raise AttributeError(
            f"{type(trainer).__name__}.{self.name}: treadle has no accelerator (Hugging Face Accelerate's, which "
            f"Hezar's and pytorch-accelerated's trainers hold): for self.{self.name}.backward(loss) write "
            "self.backward_step(loss) (super().backward_step(loss) inside backward_step), which scales the loss "
            "under fp16 and averages the gradients under grad_accum_steps; autocast, devices and processes are the "
            "precision=, device= and ddp= settings")


class SeedOverrides:
    """The defaults of the seeds' override points on the plain ``Trainer``
    (the table of :mod:`treadle.compat.names` says when each is called).

    A subclass overrides any of them with the seed's signature; ``super()``
    gives treadle's behaviour, which is the same as without the override:
    a subclass that overrides ``backward_step`` with ``super().backward_step(loss)``
    and nothing else trains to the same weights.
    """

    # Set by the Trainer.
    model: torch.nn.Module
    loss_fn: Optional[Callable[[Any, Any], Any]]
    device: torch.device
    step: Any

    # ------------------------------------------------------------------ qurious
    def _prepare_batch(self, batch: Any) -> Tuple[Any, Any]:
        """qurious': ``batch`` on the device, as ``(inputs, targets)``. With a
        ``loss_fn`` or Hezar's ``compute_loss(logits, labels)`` (a loss of the
        outputs and the targets): the pair's items, or a dict's other keys and
        its ``"labels"``, as Hezar calls the model (``model(**inputs)``);
        without either the model takes the whole batch, and the targets are a
        dict's ``"labels"`` (or None)."""
        batch = move_to_device(batch, self.device)
        separate = self.loss_fn is not None or self._hezar_compute_loss
        if isinstance(batch, abc.Mapping):
            if not separate:
                return batch, batch.get(TARGET_KEY)
            return {k: v for k, v in batch.items() if k != TARGET_KEY}, batch[TARGET_KEY]
        if separate and isinstance(batch, (tuple, list)) and len(batch) == 2:
            return batch[0], batch[1]
        return batch, None

    def _forward_pass(self, inputs: Any) -> Any:
        """qurious': the model's outputs for ``inputs`` (``model(**inputs)`` for a dict)."""
        return forward_batch(self.model, inputs, whole=True)

    def _compute_loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        """qurious': ``loss_fn(outputs, targets)``; without a ``loss_fn``, the outputs' own loss."""
        if self.loss_fn is not None:
            return as_losses(self.loss_fn(outputs, targets), LOSS_FN)["total_loss"]
        return as_losses(outputs, MODEL)["total_loss"]

    #: Hugging Face Accelerate's object as Hezar's and pytorch-accelerated's overrides read it, refused
    #: with what to write instead.
    accelerator = _NoAccelerator()
    _accelerator = _NoAccelerator()

    # ------------------------------------------------------------------ pytorch-accelerated
    @property
    def loss_func(self) -> Optional[Callable[[Any, Any], Any]]:
        """pytorch-accelerated's name of ``loss_fn`` (its overrides' bodies read ``self.loss_func``)."""
        return self.loss_fn

    def print(self, *args: Any, **kwargs: Any) -> None:
        """pytorch-accelerated's ``print``: Python's, in the main process only."""
        if comm.is_main_process():
            print(*args, **kwargs)

    def calculate_train_batch_loss(self, batch: Any) -> Dict[str, Any]:
        """pytorch-accelerated's: ``{"loss", "model_outputs", "batch_size"}`` of a training batch."""
        return self._batch_output(batch)

    def calculate_eval_batch_loss(self, batch: Any) -> Dict[str, Any]:
        """pytorch-accelerated's: ``{"loss", "model_outputs", "batch_size"}`` of an evaluation batch."""
        return self._batch_output(batch)

    def backward_step(self, loss: torch.Tensor) -> None:
        """pytorch-accelerated's: the backward of a batch's loss (divided by
        ``grad_accum_steps``), scaled by the step's grad scaler under fp16."""
        self._own_step().update.backward(loss, micro_batches=1)  # the loss comes divided

    def optimizer_step(self) -> None:
        """pytorch-accelerated's: the optimizer's step, through the step's grad
        scaler under fp16 (which skips a step whose gradients are not finite)."""
        self._own_step().update.optimizer_step()

    def optimizer_zero_grad(self) -> None:
        """pytorch-accelerated's: the gradients set to None."""
        self._own_step().update.zero_grad()

    def scheduler_step(self) -> None:
        """pytorch-accelerated's: the schedule's step (``self.scheduler.step()``)."""
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.step()

    def create_scheduler(self) -> Any:
        """pytorch-accelerated's: the schedule, built once from ``scheduler=`` (None: the optimizer's rate)."""
        return None

    def training_run_start(self) -> None:
        """pytorch-accelerated's: when ``train()`` starts."""

    def train_epoch_start(self) -> None:
        """pytorch-accelerated's: before each epoch's first update."""

    def train_epoch_end(self) -> None:
        """pytorch-accelerated's: after each epoch's last update, before its evaluation."""

    def eval_epoch_start(self) -> None:
        """pytorch-accelerated's: before each evaluation's first batch."""

    def eval_epoch_end(self) -> None:
        """pytorch-accelerated's: after each evaluation's last batch."""

    def training_run_epoch_end(self) -> None:
        """pytorch-accelerated's: at each epoch's end, after its evaluation."""

    def training_run_end(self) -> None:
        """pytorch-accelerated's: when training ends."""

    def evaluation_run_start(self) -> None:
        """pytorch-accelerated's: when ``evaluate()`` is called outside training."""

    def evaluation_run_end(self) -> None:
        """pytorch-accelerated's: when such an ``evaluate()`` ends."""

    # ------------------------------------------------------------------ Hezar
    def prepare_input_batch(self, batch: Any) -> Any:
        """Hezar's: a batch's last change before its loss (the default changes nothing)."""
        return batch

    def training_step(self, batch: Any) -> Any:
        """Hezar's: the forward and backward of one training batch (the
        ``backward_step`` of its loss divided by the update's micro-batches);
        returns its loss. The step's own micro-batch without this override
        (:func:`~treadle.compat.step.forward_backward`)."""
        return forward_backward(self, cast(TrainerStep, self._own_step()), batch)["total_loss"]  # or an EagerStep

    def evaluation_step(self, batch: Any) -> Any:
        """Hezar's: the model's outputs for one evaluation batch."""
        return self._forward_pass(self._prepare_batch(batch)[0])

    def optimization_step(self) -> None:
        """Hezar's: the optimizer's step, then the gradients zeroed."""
        self.optimizer_step()
        self.optimizer_zero_grad()

    # ------------------------------------------------------------------ shared
    #: Whether compute_loss is a subclass's, as Hezar's compute_loss(outputs, labels), as the Hugging Face
    #: Trainer's compute_loss(model, inputs, return_outputs=False) or as treadle's compute_loss(batch) (either of
    #: the last two: _own_compute_loss_override).
    _hezar_compute_loss = False
    _hf_compute_loss = False
    _own_compute_loss_override = False
    #: Whether a subclass overrides one of qurious' parts of the loss (_prepare_batch...).
    _loss_by_parts = False

    def _own_step(self) -> EagerStep:
        raise NotImplementedError

    def batch_loss(self, batch: Any) -> Any:
        """The loss of one training batch as this ``Trainer`` defines it: Hezar's
        ``compute_loss(outputs, labels)`` after qurious' parts, else
        ``compute_loss(batch)`` (which runs the parts where a subclass overrides one)."""
        if self._hezar_compute_loss:
            return self._batch_loss_by_parts(batch)
        if self._hf_compute_loss:
            return cast(Any, self).compute_loss(self.model, _hf_inputs(batch))
        return cast(Any, self).compute_loss(batch)

    def _overrides(self, name: str) -> bool:
        """Whether a subclass overrides ``name`` (the ``Trainer`` says which class is its own)."""
        raise NotImplementedError

    def _loss_of(self, outputs: Any, targets: Any) -> torch.Tensor:
        """The loss of a batch's outputs: ``_compute_loss``, or Hezar's ``compute_loss(outputs, labels)``."""
        if self._hezar_compute_loss:
            return cast(Any, self).compute_loss(outputs, targets)
        return self._compute_loss(outputs, targets)

    def _batch_output(self, batch: Any) -> Dict[str, Any]:
        """pytorch-accelerated's batch output by the qurious parts (or a
        subclass's ``compute_loss(batch)``, whose model outputs are not seen;
        or the Hugging Face Trainer's ``compute_loss``, with ``return_outputs=True``)."""
        if self._hf_compute_loss:
            loss, outputs = cast(Any, self).compute_loss(self.model, _hf_inputs(batch), return_outputs=True)
            return {"loss": loss, "model_outputs": outputs, "batch_size": batch_size(batch)}
        if self._own_compute_loss_override:
            return {"loss": cast(Any, self).compute_loss(batch), "model_outputs": None, "batch_size": batch_size(batch)}
        inputs, targets = self._prepare_batch(batch)
        outputs = self._forward_pass(inputs)
        return {"loss": self._loss_of(outputs, targets), "model_outputs": outputs, "batch_size": batch_size(batch)}

    def _batch_loss_by_parts(self, batch: Any) -> torch.Tensor:
        """``compute_loss``'s default where a qurious part is overridden: the parts, in qurious' order."""
        inputs, targets = self._prepare_batch(batch)
        return self._loss_of(self._forward_pass(inputs), targets)


def _hf_inputs(batch: Any) -> Any:
    """The ``inputs`` of the Hugging Face Trainer's ``compute_loss``: a dict
    batch copied (its documented override pops the labels, which the metrics
    still read), any other batch as it is."""
    return dict(batch) if isinstance(batch, abc.Mapping) else batch


def raised_in(error: BaseException, trainer: Any, base: type) -> Optional[str]:
    """``"Cls.method"``: the innermost method of ``trainer``'s own subclass
    (a class below ``base``) that ``error``'s traceback passes through, or
    None. Read once, after training failed: what the one-line report names."""
    own: Dict[Any, str] = {}
    for cls in type(trainer).__mro__:
        if cls is base or not issubclass(cls, base):
            continue
        for name, attr in vars(cls).items():
            try:
                code = getattr(inspect.unwrap(attr), "__code__", None) if callable(attr) else None
            except ValueError:  # a __wrapped__ cycle: no method to name, and the error being reported must not change
                continue
            if code is not None:
                own.setdefault(code, f"{cls.__name__}.{name}")
    found = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        found = own.get(frame.f_code, found)
    return found


class PreparedBatches(DatasetEvaluator):
    """The metrics of a subclass that overrides qurious' ``_prepare_batch``:
    each batch reaches them as the ``(inputs, targets)`` pair that
    ``_prepare_batch`` makes of it, so they find the targets where the
    subclass says they are (at index 1), whatever the batch's own layout."""

    def __init__(self, evaluator: Any, prepare: Callable[[Any], Tuple[Any, Any]]) -> None:
        self.evaluator = evaluator
        self.prepare = prepare

    def __getattr__(self, name: str) -> Any:
        # What the wrapped evaluator tells of itself (result_names, evaluators, higher_is_better).
        if name in ("evaluator", "prepare"):
            raise AttributeError(name)
        return getattr(self.evaluator, name)

    @property
    def result_names(self) -> Any:  # type: ignore[override]  # the wrapped evaluator's
        return getattr(self.evaluator, "result_names", None)

    def reset(self) -> None:
        self.evaluator.reset()

    def process(self, inputs: Any, outputs: Any) -> None:
        self.evaluator.process(tuple(self.prepare(inputs)), outputs)

    def evaluate(self) -> Any:
        return self.evaluator.evaluate()


class StepResultsEvaluator(DatasetEvaluator):
    """The evaluation of a qurious ``eval_step`` override: each value it
    returns, averaged over the batches (over every process's batches),
    as qurious' ``evaluate`` averages them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: Dict[str, float] = collections.defaultdict(float)
        self._batches = 0

    def process(self, inputs: Any, outputs: Any) -> None:
        if not isinstance(outputs, Mapping):
            raise TypeError(f"eval_step must return a dict of floats (qurious' contract), got {type(outputs).__name__}")
        for name, value in outputs.items():
            self._sums[name] += float(value)
        self._batches += 1

    def evaluate(self) -> Dict[str, float]:
        parts = comm.all_gather((dict(self._sums), self._batches)) if comm.get_world_size() > 1 else [
            (self._sums, self._batches)]
        sums: Dict[str, float] = collections.defaultdict(float)
        batches = 0
        for part_sums, part_batches in parts:
            batches += part_batches
            for name, value in part_sums.items():
                sums[name] += value
        if batches == 0:
            raise ValueError("eval_step: the evaluation data has no batches")
        return {name: value / batches for name, value in sums.items()}
