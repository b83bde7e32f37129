"""A research loop as a step object: sharpness-aware minimization (SAM).

SAM (Foret et al., 2021) takes two forward/backward passes per update: one
at the weights ``w`` to find the direction of steepest ascent, one at
``w + rho * g / ||g||``, whose gradient then updates ``w``. It does not fit
the standard step, which is the point of this example: the iteration is
replaced, and hooks, writers, checkpoints and resume keep working.

Used by ``configs/digits_sam.py``::

    train.step = L(SAMStep)(loss_fn=L(torch.nn.CrossEntropyLoss)(), rho=0.05)
"""

from __future__ import annotations

import time
from typing import Any, List

import torch

from treadle.engine import EagerStep
from treadle.events import ScalarKind
from treadle.utils.torch_internals import foreach_add_, foreach_mul, foreach_norm, foreach_sub_

__all__ = ["SAMStep"]


class SAMStep(EagerStep):
    """One SAM update per iteration (no accumulation, fp32 or bf16).

    Publishes ``total_loss`` (at ``w``) and ``loss_perturbed`` (at the
    perturbed weights). Everything else (data position in checkpoints, device
    placement, the loss contract) is :class:`EagerStep`'s.

    Args:
        rho: radius of the perturbation.
        others: as :class:`EagerStep` (``grad_accum_steps`` must be 1).
    """

    def __init__(self, model: torch.nn.Module, data_loader: Any, optimizer: torch.optim.Optimizer, *, rho: float = 0.05, **kwargs: Any) -> None:
        if kwargs.get("grad_accum_steps", 1) != 1 or kwargs.get("precision", "fp32") == "fp16":
            raise ValueError("SAMStep supports neither gradient accumulation nor fp16")
        super().__init__(model, data_loader, optimizer, **kwargs)
        if rho <= 0:
            raise ValueError(f"SAM's rho must be positive, got {rho}")
        self.rho = rho

    def _loss(self, batch: Any) -> torch.Tensor:
        return self._forward(batch)["total_loss"]

    def run_step(self) -> None:
        storage = self.storage
        t0 = time.perf_counter()
        batch = self.next_batch()
        data_time = time.perf_counter() - t0

        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(batch)
        loss.backward()
        # A parameter without a gradient (unused by this loss) is neither perturbed nor stepped.
        params: List[torch.Tensor] = [p for p in self._parameters() if p.grad is not None]
        grads: List[torch.Tensor] = [p.grad for p in params if p.grad is not None]
        # All on the device: the norm and the scale stay tensors (no sync).
        norm = torch.linalg.vector_norm(torch.stack(foreach_norm(grads)))
        scale = self.rho / (norm + 1e-12)
        perturbation = foreach_mul(grads, scale)
        with torch.no_grad():
            foreach_add_(params, perturbation)

        self.optimizer.zero_grad(set_to_none=True)
        perturbed_loss = self._loss(batch)
        perturbed_loss.backward()
        with torch.no_grad():
            foreach_sub_(params, perturbation)

        # The end of the standard update: after_backward, clipping (by norm or value), the step.
        grad_norm = self.step_optimizer()
        if grad_norm is not None:
            storage.put_scalar("grad_norm", grad_norm.detach())

        storage.put_scalar("total_loss", loss.detach(), kind=ScalarKind.LOSS)
        storage.put_scalar("loss_perturbed", perturbed_loss.detach(), kind=ScalarKind.LOSS)
        storage.put_scalar("data_time", data_time, kind=ScalarKind.TIME)
