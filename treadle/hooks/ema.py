"""Exponential moving average of the model's weights."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, Iterator, Optional, cast

import torch
from torch import nn

from treadle.checkpoint import unwrap_model
from treadle.utils.torch_internals import foreach_lerp_

from .base import HookBase

__all__ = ["EMA"]

logger = logging.getLogger(__name__)


class EMA(HookBase):
    """Keeps ``ema = decay * ema + (1 - decay) * weights`` after every optimizer step.

    The update is one fused ``torch._foreach_lerp_`` over all floating-point
    parameters on their device: no host sync. Buffers (BatchNorm statistics)
    are copied, not averaged. With ``warmup``, the decay ramps up as
    ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates, so early averages
    are not dominated by the random initial weights.

    Evaluation uses the averaged weights when ``eval_with_ema`` (an
    :class:`EvalHook` swaps them in and restores the trained weights
    afterwards); :meth:`averaged_weights` does the same for your own code.
    The averaged weights and the update count are saved in checkpoints.

    Runs after_step; register it before the checkpointer and evaluation
    hooks so they see this iteration's average.

    Args:
        decay: weight of the old average per update.
        model: the model to average; defaults to ``trainer.step.model``.
        warmup: ramp the decay up over the first updates.
        update_every: update every N iterations (the decay is per update).
        eval_with_ema: evaluate with the averaged weights.
    """

    def __init__(
        self,
        decay: float = 0.999,
        *,
        model: Optional[nn.Module] = None,
        warmup: bool = False,
        update_every: int = 1,
        eval_with_ema: bool = True,
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        if update_every < 1:
            raise ValueError(f"EMA update_every must be >= 1, got {update_every}")
        self.decay = decay
        self.warmup = warmup
        self.update_every = update_every
        self.eval_with_ema = eval_with_ema
        self._model = model
        self._averaged: Optional[Dict[str, torch.Tensor]] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        self.num_updates = 0

    # ------------------------------------------------------------------ set-up
    @property
    def model(self) -> nn.Module:
        if self._model is None:
            self._model = cast(Any, self.trainer.step).model  # a step that trains a model has one
        return unwrap_model(self._model)

    def _init_average(self) -> None:
        state = self.model.state_dict()
        self._averaged = {name: t.detach().clone() for name, t in state.items()}

    def before_train(self) -> None:
        if self._pending_state is not None:
            self._apply_state(self._pending_state)
            self._pending_state = None
        self._bind()
        # Every update_every iterations, the run's last one only where it is on
        # that period: the decay is per update, so the updates keep their spacing.
        self.runs_at_last_iteration = self.trainer.max_iter % self.update_every == 0

    # ------------------------------------------------------------------ update
    def _current_decay(self) -> float:
        if self.warmup:
            return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        return self.decay

    def _bind(self) -> None:
        """Pairs each averaged tensor with the live tensor it follows.

        ``state_dict()`` tensors alias the parameters and buffers, so the
        pairs stay current without rebuilding a state dict every step.
        """
        if self._averaged is None:
            self._init_average()
        assert self._averaged is not None
        params = {name for name, _ in self.model.named_parameters()}
        self._lerp_dst, self._lerp_src, self._copy_dst, self._copy_src = [], [], [], []
        for name, value in self.model.state_dict().items():
            if name in params and value.is_floating_point():
                self._lerp_dst.append(self._averaged[name])
                self._lerp_src.append(value)
            else:
                self._copy_dst.append(self._averaged[name])
                self._copy_src.append(value)

    @torch.no_grad()
    def update(self) -> None:
        """Folds the model's current weights into the average."""
        if self._averaged is None or not hasattr(self, "_lerp_dst"):
            self._bind()
        if self._lerp_dst:
            # lerp_(avg, x, w) = avg + w * (x - avg) = decay * avg + (1 - decay) * x
            foreach_lerp_(self._lerp_dst, self._lerp_src, 1.0 - self._current_decay())
        for dst, src in zip(self._copy_dst, self._copy_src):
            dst.copy_(src)
        self.num_updates += 1

    def after_step_period(self) -> Optional[int]:
        """``update_every``: the trainer calls :meth:`after_step` every ``update_every`` iterations."""
        return self.update_every

    def after_step(self) -> None:
        """Folds this iteration's weights into the average (at its period)."""
        self.update()

    # ------------------------------------------------------------------ use
    @contextlib.contextmanager
    def averaged_weights(self) -> Iterator[nn.Module]:
        """Loads the averaged weights into the model for the block, then
        restores the trained ones (also when the block raises).

        The weights are copied into the model's own parameters and buffers,
        so ``model.state_dict()`` read inside the block aliases the live
        tensors: once the block ends they hold the trained weights again.
        To keep the averaged weights past the block, copy them inside it,
        ``{k: v.clone() for k, v in model.state_dict().items()}`` or
        ``copy.deepcopy(model.state_dict())``; :meth:`averaged_state_dict`
        needs no block (it returns the average's own tensors, which later
        updates change in place).
        """
        if self._averaged is None:
            yield self.model
            return
        model = self.model
        trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self._averaged)
        try:
            yield model
        finally:
            model.load_state_dict(trained)

    @torch.no_grad()
    def take_buffers(self) -> None:
        """Copies the model's buffers (BatchNorm statistics) into the average.

        For statistics recomputed while the averaged weights are loaded
        (``PreciseBN``): the average then holds statistics of its own weights.
        """
        if self._averaged is None:
            self._init_average()
        assert self._averaged is not None
        for name, buf in self.model.named_buffers():
            if name in self._averaged:
                self._averaged[name].copy_(buf)

    def averaged_state_dict(self) -> Dict[str, torch.Tensor]:
        """The averaged weights, keyed like ``model.state_dict()``."""
        if self._averaged is None:
            self._init_average()
        assert self._averaged is not None
        return dict(self._averaged)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        if self._averaged is None:
            return self._pending_state or {}
        return {"weights": dict(self._averaged), "num_updates": self.num_updates, "decay": self.decay}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self._model is None and not hasattr(self, "trainer"):
            self._pending_state = dict(state)
            return
        try:
            self.model  # noqa: B018 - reading it tells whether the trainer's model is reachable yet
        except (AttributeError, ReferenceError, RuntimeError):
            self._pending_state = dict(state)
            return
        self._apply_state(state)

    def _apply_state(self, state: Dict[str, Any]) -> None:
        weights = state["weights"]
        own = self.model.state_dict()
        missing = sorted(set(own) - set(weights))
        if missing:
            raise KeyError(f"EMA state has no averaged value for {missing}; it is from another model")
        self._averaged = {k: weights[k].to(device=own[k].device, dtype=own[k].dtype).clone() for k in own}
        self._bind()
        self.num_updates = int(state["num_updates"])
        if float(state.get("decay", self.decay)) != self.decay:
            logger.info("EMA decay changed on resume from %s to %s", state["decay"], self.decay)
