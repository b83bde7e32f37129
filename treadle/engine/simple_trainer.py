"""detectron2's ``SimpleTrainer`` and ``AMPTrainer``, as thin ``TrainerBase`` subclasses.

A ported detectron2 script builds ``SimpleTrainer(model, data_loader,
optimizer)`` and registers hooks; here that trainer is a ``TrainerBase``
whose step object is an :class:`EagerStep` (no trainer inside a trainer).
The model, data loader and optimizer are the step's, reachable as
``trainer.model``, ``trainer.data_loader`` and ``trainer.optimizer``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

import torch
from torch import nn

from treadle.utils.torch_internals import grad_scaler_scale

from .steps import EagerStep
from .train_loop import TrainerBase

__all__ = ["SimpleTrainer", "AMPTrainer"]

logger = logging.getLogger(__name__)

_PRECISIONS = {torch.float16: "fp16", torch.bfloat16: "bf16"}


class SimpleTrainer(TrainerBase):
    """detectron2's ``SimpleTrainer``: each iteration, a batch from
    ``data_loader``, ``model(batch)`` returning a dict of losses (summed),
    backward and ``optimizer.step()``; losses are published as scalars.

    detectron2's options that treadle makes unnecessary are accepted:

    - ``gather_metric_period``: detectron2 reads the losses on the host (and
      gathers them across processes) every so many iterations; treadle keeps
      them on the device and reads them once per writer flush, reduced
      across processes then.
    - ``zero_grad_before_forward``: treadle always clears gradients at the
      start of the iteration, before the forward; both settings train alike.
    - ``async_write_metrics``: treadle's step writes nothing; writers flush
      periodically (``PeriodicWriter``).

    To change what an iteration does, subclass and override ``run_step``, as
    in detectron2 (``self._data_loader_iter`` gives the batches), or assign
    another step object to ``trainer.step``.
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        async_write_metrics: bool = False,
        *,
        precision: str = "fp32",
        grad_scaler: Optional["torch.amp.GradScaler"] = None,
    ) -> None:
        if not isinstance(gather_metric_period, int) or gather_metric_period < 1:
            raise ValueError(f"gather_metric_period must be an integer >= 1, got {gather_metric_period!r}")
        model.train()
        super().__init__(EagerStep(model, data_loader, optimizer, precision=precision, grad_scaler=grad_scaler))
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward = zero_grad_before_forward
        self.async_write_metrics = async_write_metrics
        self._data_loader_iter_obj: Optional[Iterator[Any]] = None

    @property
    def model(self) -> nn.Module:
        return self.step.model  # type: ignore[attr-defined]

    @model.setter
    def model(self, model: nn.Module) -> None:
        self.step.model = model  # type: ignore[attr-defined]
        self.step.update.model = model  # type: ignore[attr-defined]  # whose gradients accumulation syncs

    @property
    def data_loader(self) -> Iterable[Any]:
        return self.step.data_loader  # type: ignore[attr-defined]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step.optimizer  # type: ignore[attr-defined]

    @property
    def _data_loader_iter(self) -> Iterator[Any]:
        """An iterator over the data loader, made on first use (detectron2's
        name, for a ``run_step`` written for it)."""
        if self._data_loader_iter_obj is None:
            self._data_loader_iter_obj = iter(self.data_loader)
        return self._data_loader_iter_obj

    def state_dict(self) -> Dict[str, Any]:
        """The trainer's state with the optimizer's, as detectron2's
        ``SimpleTrainer`` saves it: a checkpointer given only ``trainer=``
        resumes the optimizer too."""
        state = super().state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])

    def reset_data_loader(self, data_loader_builder: Callable[[], Iterable[Any]]) -> None:
        """Replaces the data loader by ``data_loader_builder()``; the next batch
        comes from the new one (detectron2's method, e.g. for a curriculum)."""
        self.step.data_loader = None  # type: ignore[attr-defined]  # free the old one before building
        self.step.data_loader = data_loader_builder()  # type: ignore[attr-defined]
        self.step.restart_data()  # type: ignore[attr-defined]
        self._data_loader_iter_obj = None


class AMPTrainer(SimpleTrainer):
    """detectron2's ``AMPTrainer``: :class:`SimpleTrainer` with automatic mixed
    precision, ``precision=torch.float16`` (with a ``GradScaler``, CUDA only)
    or ``torch.bfloat16``.

    ``log_grad_scaler``: publish the scaler's scale as ``[metric]grad_scaler``
    every iteration, as detectron2 does (as a device tensor, read at the
    writers' flush: no host sync per step).
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        grad_scaler: Optional["torch.amp.GradScaler"] = None,
        precision: torch.dtype = torch.float16,
        log_grad_scaler: bool = False,
        async_write_metrics: bool = False,
    ) -> None:
        if precision not in _PRECISIONS:
            raise ValueError(f"AMPTrainer precision must be torch.float16 or torch.bfloat16, got {precision}")
        super().__init__(
            model,
            data_loader,
            optimizer,
            gather_metric_period,
            zero_grad_before_forward,
            async_write_metrics,
            precision=_PRECISIONS[precision],
            grad_scaler=grad_scaler,
        )
        self.precision = precision
        self.log_grad_scaler = log_grad_scaler
        self.grad_scaler = self.step.grad_scaler  # type: ignore[attr-defined]

    def after_step(self) -> None:  # type: ignore[override]
        super().after_step()
        if self.log_grad_scaler and self.grad_scaler is not None:
            # The scale tensor itself: get_scale() would read it on the host every step.
            scale = grad_scaler_scale(self.grad_scaler)
            if scale is not None:
                self.storage.put_scalar("[metric]grad_scaler", scale.detach().clone(), smoothing_hint=False)
