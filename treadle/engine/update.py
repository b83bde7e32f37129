"""One optimizer's update, written once: what every step object calls.

An :class:`Update` owns everything between a loss and new weights for one
optimizer: backward with the accumulation scale, autocast and the fp16
grad scaler, unscaling, the hooks' ``after_backward``, clipping by norm or
by value, the optimizer step and zeroing the gradients. ``EagerStep`` and
``CompiledStep`` train with one; the plain ``Trainer``'s step for other
trainers' override points calls its parts; a GAN holds two::

    self.update_d = Update(opt_d, clip_grad_norm=1.0)
    self.update_g = Update(opt_g)
    ...
    self.update_d.apply(d_loss, self.after_backward)   # zero_grad, backward, after_backward, clip, step

It is saved in checkpoints with the step that holds it (the grad scaler's
state), as MMEngine's ``OptimWrapper`` is with its runner.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple, cast

import torch
from torch import nn

from treadle.checkpoint.fsdp import is_fsdp_model
from treadle.config.rules import is_number
from treadle.config.train_keys import PRECISIONS

__all__ = ["Update", "check_update_settings"]

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NO_CONTEXT = contextlib.nullcontext()


def check_update_settings(
    grad_accum_steps: int, clip_grad_norm: Optional[float], clip_grad_value: Optional[float], precision: str
) -> None:
    """Refuses update settings that cannot train, when the update (or the
    step holding it) is built: one line naming the argument."""
    if not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be an integer >= 1, got {grad_accum_steps!r}")
    if clip_grad_norm is not None and not (is_number(clip_grad_norm) and clip_grad_norm > 0):
        raise ValueError(f"clip_grad_norm must be positive or None, got {clip_grad_norm!r}")
    if clip_grad_value is not None and not (is_number(clip_grad_value) and clip_grad_value > 0):
        raise ValueError(f"clip_grad_value must be a positive number or None, got {clip_grad_value!r}")
    if clip_grad_norm is not None and clip_grad_value is not None:
        raise ValueError(
            f"Give clip_grad_norm ({clip_grad_norm!r}) or clip_grad_value ({clip_grad_value!r}), not both"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


class Update:
    """The update of one optimizer's parameters, in treadle's one sequence:
    zero the gradients; each micro-batch's loss divided by the micro-batches
    of the update, scaled under fp16, backward (gradients synced across
    ranks on the last one only); unscale (fp16); ``after_backward`` (the
    hooks'); clip; the optimizer step (skipped by the scaler where the
    gradients are not finite); the scaler's update.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        model: the module whose gradients this update steps, where it is
            wrapped for several processes (DDP, FSDP2): accumulation syncs
            its gradients on the last micro-batch only. Not needed otherwise.
        grad_accum_steps: micro-batches per update: :meth:`backward`
            divides each loss by it, so that with mean-reduced losses the
            update equals that of one batch ``grad_accum_steps`` times larger.
        clip_grad_norm: clip the gradients' total norm to this value;
            :meth:`step` returns the norm before clipping.
        clip_grad_value: clamp each gradient element to
            ``[-clip_grad_value, clip_grad_value]``; exclusive with
            ``clip_grad_norm`` (which runs first changes the result).
        precision: ``"fp32"``, ``"bf16"`` (:meth:`autocast`) or ``"fp16"``
            (autocast and a ``GradScaler``; needs CUDA).
        grad_scaler: a ``torch.amp.GradScaler`` for fp16 (one is made if not given).
        device: the device autocast runs on (``"cuda"`` for fp16); by default
            that of the optimizer's first parameter.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        model: Optional[nn.Module] = None,
        grad_accum_steps: int = 1,
        clip_grad_norm: Optional[float] = None,
        clip_grad_value: Optional[float] = None,
        precision: str = "fp32",
        grad_scaler: Optional["torch.amp.GradScaler"] = None,
        device: Optional[torch.device | str] = None,
    ) -> None:
        check_update_settings(grad_accum_steps, clip_grad_norm, clip_grad_value, precision)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"Update takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"Update's model is the module whose gradients it syncs (an nn.Module), "
                            f"got {type(model).__name__}")
        self.optimizer = optimizer
        self.model = model
        self.grad_accum_steps = grad_accum_steps
        self.clip_grad_norm = clip_grad_norm
        self.clip_grad_value = clip_grad_value
        self.precision = precision
        self._device = torch.device(device) if device is not None else None
        if precision == "fp16":
            if self.device.type != "cuda":
                raise ValueError(
                    f"precision='fp16' needs CUDA (it trains with a GradScaler), but the model is on "
                    f"{self.device.type}. Use precision='bf16' on CPU."
                )
            grad_scaler = grad_scaler if grad_scaler is not None else torch.amp.GradScaler("cuda")
        elif grad_scaler is not None:
            raise ValueError(f"grad_scaler is used only with precision='fp16', not {precision!r}")
        # With fp32 and bf16 there is no scaler: the sequence checks for None.
        self.grad_scaler = grad_scaler
        # The micro-batches of the update in progress, which backward divides by.
        self.micro_batches = grad_accum_steps
        # Whether the model is sharded by FSDP2, found at the first accumulated
        # update (fully_shard may be applied after the update is built).
        self._fsdp2: Optional[bool] = None

    @property
    def device(self) -> torch.device:
        """The device autocast runs on, the ``device`` given or else that of the optimizer's first parameter."""
        if self._device is None:
            param = next((p for group in self.optimizer.param_groups for p in group["params"]), None)
            self._device = param.device if param is not None else torch.device("cpu")
        return self._device

    # ------------------------------------------------------------------ the parts
    def autocast(self) -> ContextManager[Any]:
        """The context a forward and its loss run in: autocast to ``precision``
        (nothing with fp32)."""
        if self.precision == "fp32":
            return _NO_CONTEXT
        return torch.autocast(device_type=self.device.type, dtype=_AUTOCAST_DTYPES[self.precision])

    def zero_grad(self) -> None:
        """The optimizer's gradients set to None: the start of an update."""
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, micro_batches: Optional[int] = None) -> None:
        """The backward of one micro-batch's ``loss``, divided by the update's
        micro-batches (``micro_batches``, by default ``grad_accum_steps``;
        ``1`` for a loss already divided), scaled by the grad scaler under fp16."""
        count = self.micro_batches if micro_batches is None else micro_batches
        if count != 1:
            loss = loss / count
        (loss if self.grad_scaler is None else self.grad_scaler.scale(loss)).backward()

    def step(
        self,
        after_backward: Optional[Callable[[], None]] = None,
        optimizer_step: Optional[Callable[[], None]] = None,
    ) -> Optional[torch.Tensor]:
        """The end of every update, once the gradients are computed: unscale
        them (fp16), ``after_backward()`` (the trainer's hooks, where given),
        clip them, the optimizer step (``optimizer_step()`` in its place where
        given: another trainer's override), the scaler's update. Returns the
        gradient norm before clipping (``None`` without ``clip_grad_norm``)."""
        optimizer, scaler = self.optimizer, self.grad_scaler
        if scaler is not None:
            scaler.unscale_(optimizer)  # hooks and clipping see true gradients
        if after_backward is not None:
            after_backward()
        grad_norm = None
        if self.clip_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters(), self.clip_grad_norm)
        elif self.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(self.parameters(), self.clip_grad_value)
        if optimizer_step is not None:
            optimizer_step()
        elif scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        return grad_norm

    def optimizer_step(self) -> None:
        """The optimizer's step alone, through the grad scaler under fp16
        (which skips a step whose gradients are not finite), then its update."""
        if self.grad_scaler is None:
            self.optimizer.step()
        else:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()

    def apply(self, loss: torch.Tensor, after_backward: Optional[Callable[[], None]] = None) -> Optional[torch.Tensor]:
        """A whole update on one ``loss`` (no accumulation): zero the gradients,
        :meth:`backward` (whole: ``micro_batches=1``), :meth:`step`. Returns
        what :meth:`step` returns. A research step's one line per optimizer."""
        self.zero_grad()
        self.backward(loss, micro_batches=1)
        return self.step(after_backward)

    def parameters(self) -> List[torch.Tensor]:
        """The optimizer's parameters that have a gradient now (what clipping sees)."""
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    def gradient_sync(self, sync: bool) -> ContextManager[Any]:
        """A micro-batch's backward, all-reducing ``model``'s gradients across
        ranks only where ``sync``. DDP skips the all-reduce inside
        ``no_sync()``; FSDP2 has no ``no_sync()`` and takes a flag, which the
        last micro-batch sets back to True for whatever runs next."""
        model = self.model
        if model is None:
            return _NO_CONTEXT
        if self._fsdp2 is None:
            self._fsdp2 = is_fsdp_model(model)
        if self._fsdp2:
            cast(Any, model).set_requires_gradient_sync(sync)
            return _NO_CONTEXT
        return cast(Any, model).no_sync() if not sync and hasattr(model, "no_sync") else _NO_CONTEXT

    # ------------------------------------------------------------------ the accumulation loop
    def accumulate(
        self,
        next_batch: Callable[[], Any],
        forward: Callable[[Any], Dict[str, torch.Tensor]],
        count: int,
        keep: Callable[[torch.Tensor], torch.Tensor],
        *,
        backward: bool = True,
    ) -> Tuple[Dict[str, torch.Tensor], float]:
        """The gradients of one update over ``count`` micro-batches
        (``next_batch()``), from zeroed gradients when ``backward``:
        ``forward(batch)`` gives a micro-batch's losses by name (its sum
        ``total_loss`` included), whose :meth:`backward` runs here (when
        ``forward`` runs its own, ``backward=False`` and the caller zeroes).
        The gradients are synced across ranks on the last micro-batch only.

        Returns the losses averaged over the micro-batches (each as
        ``keep(value)`` makes it: detached, or copied) and the seconds spent
        waiting in ``next_batch``. :meth:`step` ends the update.
        """
        if backward:
            self.optimizer.zero_grad(set_to_none=True)
        self.micro_batches = count
        scaler = self.grad_scaler
        totals: Dict[str, torch.Tensor] = {}
        data_time = 0.0
        try:
            for micro in range(count):
                start = time.perf_counter()
                batch = next_batch()
                data_time += time.perf_counter() - start
                with self.gradient_sync(micro == count - 1) if count > 1 else _NO_CONTEXT:
                    losses = forward(batch)
                    if backward:
                        loss = losses["total_loss"] if count == 1 else losses["total_loss"] / count
                        (loss if scaler is None else scaler.scale(loss)).backward()
                for name, value in losses.items():
                    value = keep(value)
                    totals[name] = value if micro == 0 else totals[name] + value
        except BaseException:
            if count > 1 and self._fsdp2:
                # Under FSDP2 an error mid-accumulation must not leave the sync off
                # for whatever backward runs after it, outside this update.
                cast(Any, self.model).set_requires_gradient_sync(True)
            raise
        finally:
            self.micro_batches = self.grad_accum_steps
        if count > 1:
            totals = {name: value / count for name, value in totals.items()}
        return totals, data_time

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """``{"grad_scaler": ...}`` under fp16; else ``{}``."""
        return {"grad_scaler": self.grad_scaler.state_dict()} if self.grad_scaler is not None else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if "grad_scaler" in state and self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
