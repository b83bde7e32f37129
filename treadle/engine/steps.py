"""Step objects: what one training iteration does.

The trainer calls ``step.run_step()`` once per iteration and knows nothing
else of it. Assigning ``trainer.step = MyStep(...)`` replaces the iteration
(a GAN with two optimizers, custom accumulation, ...) while every hook,
writer and checkpoint keeps working.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch import nn

from treadle.checkpoint.fsdp import is_fsdp_model
from treadle.evaluation.batch import call_model
from treadle.events import ScalarKind, get_event_storage
from treadle.events.storage import _CURRENT_STORAGE_STACK, EventStorage
from treadle.utils.device import to_device

if TYPE_CHECKING:
    from .train_loop import TrainerBase

__all__ = ["StepBase", "EagerStep", "CompiledStep", "PRECISIONS"]

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_clock = time.perf_counter
_Tensor = torch.Tensor
# nullcontext is reentrant and stateless: one instance serves every step.
_NO_CONTEXT = contextlib.nullcontext()


def _forward_losses(model: nn.Module, loss_fn: Optional[Callable], batch: Any) -> Dict[str, torch.Tensor]:
    """Runs the model on a batch and returns its losses by name, their sum
    ``total_loss`` included (see EagerStep)."""
    if loss_fn is not None:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(
                "With loss_fn, each batch must be an (inputs, targets) pair; got "
                f"{type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
            )
        inputs, targets = batch
        out, source = loss_fn(model(inputs), targets), "loss_fn"
    else:
        # A mapping (a Hugging Face batch) is spread into keywords, as in evaluation.
        try:
            out = call_model(model, batch) if isinstance(batch, Mapping) else model(batch)
        except (TypeError, AttributeError) as e:
            if isinstance(batch, (tuple, list)) and len(batch) == 2:
                # The usual cause: a model that returns predictions, trained without a loss function.
                raise (TypeError if isinstance(e, TypeError) else AttributeError)(
                    f"the model was given the whole (inputs, targets) batch, as there is no loss_fn, and raised: "
                    f"{e}. A model that returns predictions needs a loss_fn (train.step.loss_fn in a config)"
                ) from e
            raise
        source = "the model"
    if isinstance(out, torch.Tensor) and out.numel() == 1:  # the common case, checked first
        return {"total_loss": out}
    return _as_losses(out, source)


def _as_losses(out: Any, source: str) -> Dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        if out.numel() != 1:
            _raise_not_scalar(out, source, "total_loss")
        return {"total_loss": out}
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            _raise_not_scalar(loss, source, "loss")
        return {"total_loss": loss}
    if isinstance(out, Mapping) and out:
        if "loss" in out and any(isinstance(v, torch.Tensor) and v.numel() != 1 for v in out.values()):
            # A model output that holds more than losses ({"loss": ..., "logits": ...}),
            # read as evaluation reads it (LossEvaluator).
            loss = out["loss"]
            if not isinstance(loss, torch.Tensor):
                raise TypeError(f"{source} returned a dict whose 'loss' is a {type(loss).__name__}, not a loss tensor")
            if loss.numel() != 1:
                _raise_not_scalar(loss, source, "loss")
            return {"total_loss": loss}
        for name, value in out.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{source} returned a dict whose entry '{name}' is a {type(value).__name__}, not a loss tensor")
            if value.numel() != 1:
                _raise_not_scalar(value, source, name)
        if "total_loss" in out:
            raise ValueError(f"{source} returned a loss named 'total_loss'; that name is kept for the sum of the losses")
        losses = dict(out)
        losses["total_loss"] = sum(out.values())
        return losses
    raise TypeError(
        f"{source} returned {type(out).__name__}; expected a scalar loss tensor, a dict of scalar "
        "losses, or an object with a .loss attribute (or pass loss_fn to compute the loss)"
    )


def _raise_not_scalar(value: torch.Tensor, source: str, name: str) -> None:
    hint = " or, for a model that returns predictions, give a loss_fn" if source == "the model" else ""
    raise ValueError(
        f"{source} returned loss '{name}' of shape {tuple(value.shape)}; a loss must be a scalar "
        f"(reduce it, e.g. with .mean(){hint})"
    )


class StepBase:
    """One training iteration.

    ``run_step`` fetches data, computes losses, updates the parameters and
    publishes what it measured to the event storage (tensors, never read on
    the host). Between backward and the optimizer step it calls
    ``self.trainer.after_backward()`` so that hooks can inspect gradients.

    ``state_dict`` returns what a resume needs (data position, grad scaler),
    as plain data; it is saved with the trainer's state.

    ``self.trainer`` is set (as a weak proxy) when the step is assigned to
    ``trainer.step``; it is ``None`` for a step run on its own.
    """

    trainer: Optional["TrainerBase"] = None
    # Whether the trainer has anything to run in after_backward (a hook has
    # one, or its class overrides it): set by the trainer when the step is
    # assigned and when hooks are registered, so that a step can skip the call.
    calls_after_backward: bool = False

    def run_step(self) -> None:
        raise NotImplementedError

    @property
    def storage(self) -> EventStorage:
        return get_event_storage()

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state:
            raise KeyError(f"{type(self).__name__} keeps no state but got keys {sorted(state)}")

    def _after_backward(self) -> None:
        if self.calls_after_backward:
            self.trainer.after_backward()  # type: ignore[union-attr]


class EagerStep(StepBase):
    """The standard iteration, run eagerly.

    Loss contract, checked in this order:

    1. with ``loss_fn``, the batch is ``(inputs, targets)`` and
       ``loss = loss_fn(model(inputs), targets)``;
    2. without it, ``out = model(batch)`` (``model(**batch)`` for a mapping,
       as Hugging Face models take it; see :mod:`treadle.evaluation.batch`)
       and ``out`` is a scalar tensor, an object with a ``.loss`` attribute
       (Hugging Face model outputs, which are also dicts, so this comes
       first), a dict with a ``"loss"`` next to other outputs (logits), or
       a dict of scalar losses, which are summed and each published under
       its own name.

    The sum is published as ``total_loss``. One iteration is one optimizer
    update, fed by ``grad_accum_steps`` micro-batches; each micro-batch loss
    is divided by ``grad_accum_steps``, so with mean-reduced losses the update
    equals that of one batch ``grad_accum_steps`` times larger.

    Args:
        model: the module to train; its mode must be ``train``.
        data_loader: any iterable of batches; iterated forever (re-iterated
            when exhausted). A loader with ``state_dict``/``load_state_dict``
            (``treadle.data.build_train_loader``) makes resume exact.
        optimizer: any ``torch.optim.Optimizer``.
        loss_fn: see the loss contract.
        grad_accum_steps: micro-batches per optimizer update.
        clip_grad_norm: clip the total gradient norm to this value; the norm
            before clipping is published as ``grad_norm``.
        precision: ``"fp32"``, ``"bf16"`` (autocast, CPU or GPU) or ``"fp16"``
            (autocast and a ``GradScaler``; needs CUDA).
        grad_scaler: a ``torch.amp.GradScaler`` for fp16 (one is made if not given).
        device: where batches are moved; by default the device of the model's
            parameters.
        compute_loss: ``compute_loss(batch) -> loss``, replacing the loss
            contract (the same as overriding :meth:`compute_loss`).
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        *,
        loss_fn: Optional[Callable[[Any, Any], Any]] = None,
        grad_accum_steps: int = 1,
        clip_grad_norm: Optional[float] = None,
        precision: str = "fp32",
        grad_scaler: Optional["torch.amp.GradScaler"] = None,
        device: Optional[torch.device | str] = None,
        compute_loss: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        if not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be an integer >= 1, got {grad_accum_steps!r}")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be positive or None, got {clip_grad_norm!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.grad_accum_steps = grad_accum_steps
        self.clip_grad_norm = clip_grad_norm
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
        self.grad_scaler = grad_scaler
        if compute_loss is not None:
            if not callable(compute_loss):
                raise TypeError(f"compute_loss must be callable, got {type(compute_loss).__name__}")
            self.compute_loss = compute_loss  # type: ignore[method-assign]
        # Whether the loss comes from a compute_loss of the user's (given, or a
        # subclass's): the common case then keeps its direct call.
        self._custom_loss = compute_loss is not None or type(self).compute_loss is not EagerStep.compute_loss
        self.loss_fn = loss_fn
        # The series run_step appends to, opened in each train()'s storage.
        self._series_storage: Optional[EventStorage] = None
        self._autocast: Optional[torch.autocast] = None
        self._loss_points: List[Tuple[Any, int]] = []
        self._data_time_points: List[Tuple[Any, int]] = []
        self._other_losses: Dict[str, List[Tuple[Any, int]]] = {}
        self._series_limit = 0
        self._data_iter: Optional[Iterator[Any]] = None
        self._batch_device: Optional[torch.device] = None
        self._warned_no_data_state = False
        # Whether the model is sharded by FSDP2, found at the first accumulated
        # step (fully_shard may be applied after the step is built).
        self._fsdp2: Optional[bool] = None
        # What clip_grad_norm clips, listed at the first clipped step rather
        # than rebuilt every step (param groups added later are not seen).
        self._clip_params: Optional[List[torch.Tensor]] = None

    # ------------------------------------------------------------------ iteration
    @property
    def device(self) -> torch.device:
        if self._device is None:
            param = next(iter(self.model.parameters()), None)
            self._device = param.device if param is not None else torch.device("cpu")
        return self._device

    # The iteration is one method with the rare cases (accumulation, a grad
    # scaler, clipping, a custom loss) behind branches: on a small model the
    # step's Python runs with cold caches after every backward, and each
    # extra function costs about a microsecond there.
    def run_step(self) -> None:
        model = self.model
        if not model.training:
            raise RuntimeError(
                "The model is in eval mode at the start of a training step; a hook or an "
                "evaluation did not restore model.train()."
            )
        # get_event_storage() without the call; it raises the clear error.
        storage = _CURRENT_STORAGE_STACK[-1] if _CURRENT_STORAGE_STACK else get_event_storage()
        if storage is not self._series_storage:
            self._open_series(storage)
        optimizer = self.optimizer
        scaler = self.grad_scaler
        optimizer.zero_grad(set_to_none=True)
        loss = None
        if self.grad_accum_steps == 1:
            t0 = _clock()
            # _next_batch's common case inline: an iterator is open and
            # batches stay where they are.
            data_iter = self._data_iter
            if data_iter is None or self._batch_device is not None:
                batch = self._next_batch()
            else:
                try:
                    batch = next(data_iter)
                except StopIteration:
                    batch = self._restart_data()
            data_time = _clock() - t0
            loss_fn = self._direct_loss_fn
            if loss_fn is not None and isinstance(batch, (tuple, list)) and len(batch) == 2:
                # The common case of the loss contract inline: one loss tensor.
                autocast = self._autocast
                if autocast is None:
                    loss = loss_fn(model(batch[0]), batch[1])
                else:
                    with autocast:
                        loss = loss_fn(model(batch[0]), batch[1])
                if not isinstance(loss, _Tensor):
                    losses = _as_losses(loss, "loss_fn")
                    loss = None
            elif self.precision == "fp32" and not self._custom_loss:
                losses = self._compute_losses(model, self.loss_fn, batch)
            else:
                losses = self._forward(batch)
            total = loss if loss is not None else losses["total_loss"]
            try:
                if scaler is None:
                    total.backward()
                else:
                    scaler.scale(total).backward()
            except RuntimeError:
                # A loss that is not one number is found here rather than
                # checked every step: backward refuses it.
                if total.numel() != 1:
                    _raise_not_scalar(total, "loss_fn" if self.loss_fn is not None else "the model", "total_loss")
                raise
        else:
            losses, data_time = self._accumulate()
        if scaler is not None:
            # Hooks and clipping must see true gradients.
            scaler.unscale_(optimizer)
        if self.calls_after_backward:
            self.trainer.after_backward()  # type: ignore[union-attr]
        if self.clip_grad_norm is not None:
            params = self._clip_params
            if params is None:
                params = self._clip_params = [p for group in optimizer.param_groups for p in group["params"]]
            # clip_grad_norm_ skips parameters without a gradient itself.
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            storage.put_scalar("grad_norm", norm)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        # Detached copies: no autograd graph outlives the step. Keeping the
        # loss into the next step, as a hand-written loop keeps `loss`, would
        # spare torch rebuilding each parameter's gradient accumulator (~6k
        # instructions of a 0.3 ms step), but a kept accumulator keeps its
        # parameter's old shape when a hook resizes it through .data: the
        # gradient then comes out wrong (tests/test_steps.py).
        it = storage.iter
        if loss is not None:
            value = loss.detach()
            self._loss_points.append((value.clone() if self._copies_published else value, it))
        else:
            self._publish_losses(storage, losses, it)
        data_points = self._data_time_points
        data_points.append((data_time, it))
        if len(data_points) >= self._series_limit:
            storage.bound_pending()

    def _open_series(self, storage: EventStorage) -> None:
        """Opens the series this step appends to in ``storage`` (a new one each ``train()``)."""
        self._series_storage = storage
        # One autocast context, entered once per step: building one costs
        # more than entering it (it is re-entered, never nested).
        self._autocast = (
            None if self.precision == "fp32"
            else torch.autocast(device_type=self.device.type, dtype=_AUTOCAST_DTYPES[self.precision])
        )
        self._loss_points = storage.open_series("total_loss", kind=ScalarKind.LOSS)
        self._data_time_points = storage.open_series("data_time", kind=ScalarKind.TIME, tensors=False)
        self._other_losses = {}
        # Values in host memory are bounded lower: reading them is no sync.
        self._series_limit = storage.max_pending if self.device.type != "cpu" else storage.max_pending_cpu

    def _publish_losses(self, storage: EventStorage, losses: Dict[str, torch.Tensor], iteration: int) -> None:
        """Appends ``losses`` (by name, ``total_loss`` among them) to their
        series; those of an accumulated step are published copies already."""
        series = self._other_losses
        published = self.grad_accum_steps > 1
        for name, value in losses.items():
            points = self._loss_points if name == "total_loss" else series.get(name)
            if points is None:
                points = series[name] = storage.open_series(name, kind=ScalarKind.LOSS)
            points.append((value if published else self._published(value), iteration))

    @property
    def loss_fn(self) -> Optional[Callable[[Any, Any], Any]]:
        return self._loss_fn

    @loss_fn.setter
    def loss_fn(self, loss_fn: Optional[Callable[[Any, Any], Any]]) -> None:
        self._loss_fn = loss_fn
        # The loss function run_step calls itself, when the loss contract's
        # common case applies: no loss of the user's, no compiled loss.
        direct = not self._custom_loss and type(self)._compute_losses is EagerStep._compute_losses
        self._direct_loss_fn = loss_fn if direct else None

    def compute_loss(self, batch: Any) -> Any:
        """The loss of one (micro-)batch, already on the device: the one method
        to override for a custom loss (pytorch-accelerated's
        ``calculate_train_batch_loss``).

        Returns a scalar loss tensor, a dict of scalar losses (summed into
        ``total_loss``, each published by its name) or an object with a
        ``.loss``. It runs under the step's autocast (``precision``); gradient
        accumulation, clipping, the grad scaler and the optimizer step stay
        the step's. The default is the loss contract above.
        """
        return self._compute_losses(self.model, self.loss_fn, batch)

    def _losses_of(self, batch: Any) -> Dict[str, torch.Tensor]:
        if not self._custom_loss:
            return self._compute_losses(self.model, self.loss_fn, batch)
        out = self.compute_loss(batch)
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            return {"total_loss": out}
        return _as_losses(out, f"{type(self).__name__}.compute_loss")

    def _forward(self, batch: Any) -> Dict[str, torch.Tensor]:
        """The losses of ``batch`` by name, their sum ``total_loss`` included."""
        if self.precision == "fp32":
            return self._losses_of(batch)
        with torch.autocast(device_type=self.device.type, dtype=_AUTOCAST_DTYPES[self.precision]):
            return self._losses_of(batch)

    def train_on_batch(self, batch: Any) -> Dict[str, torch.Tensor]:
        """One optimizer update on ``batch``, outside a training loop (a
        notebook's ``trainer.train_step(batch)``): forward and backward of the
        whole batch, the grad scaler, clipping and the optimizer step, as
        :meth:`run_step` does. No hook runs and nothing is published; the
        losses are returned (detached tensors, by name)."""
        if self.device.type != "cpu":
            batch = to_device(batch, self.device)
        optimizer, scaler = self.optimizer, self.grad_scaler
        optimizer.zero_grad(set_to_none=True)
        losses = self._forward(batch)
        if scaler is None:
            losses["total_loss"].backward()
        else:
            scaler.scale(losses["total_loss"]).backward()
            scaler.unscale_(optimizer)
        if self.clip_grad_norm is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            losses["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        return {name: value.detach() for name, value in losses.items()}

    def _accumulate(self) -> Tuple[Dict[str, torch.Tensor], float]:
        """Forward and backward of ``grad_accum_steps`` micro-batches; returns
        the losses averaged over them and the time spent waiting for data."""
        k = self.grad_accum_steps
        data_time = 0.0
        totals: Dict[str, torch.Tensor] = {}
        fsdp2 = self._fsdp2
        if fsdp2 is None:
            fsdp2 = self._fsdp2 = is_fsdp_model(self.model)
        try:
            for micro in range(k):
                t0 = time.perf_counter()
                batch = self._next_batch()
                data_time += time.perf_counter() - t0
                # Only the last micro-batch synchronizes gradients across ranks.
                # FSDP2 has no no_sync(): it takes a flag, which the last
                # micro-batch sets back to True for whatever runs next.
                if fsdp2:
                    self.model.set_requires_gradient_sync(micro == k - 1)
                    sync_ctx = _NO_CONTEXT
                else:
                    sync_ctx = self.model.no_sync() if micro < k - 1 and hasattr(self.model, "no_sync") else _NO_CONTEXT
                with sync_ctx:
                    losses = self._forward(batch)
                    loss = losses["total_loss"] / k
                    if self.grad_scaler is None:
                        loss.backward()
                    else:
                        self.grad_scaler.scale(loss).backward()
                for name, value in losses.items():
                    value = self._published(value)
                    totals[name] = value if micro == 0 else totals[name] + value
        except BaseException:
            if fsdp2:
                # An error mid-accumulation must not leave gradient sync off
                # for whatever backward runs after it, outside this loop.
                self.model.set_requires_gradient_sync(True)
            raise
        return {name: value / k for name, value in totals.items()}, data_time

    def next_batch(self) -> Any:
        """The next training batch, on the model's device; a new pass over
        the data loader starts when one ends. For a subclass's own
        ``run_step`` (LiBai's and detectron2's ``next(self._data_loader_iter)``)."""
        return self._next_batch()

    def _next_batch(self) -> Any:
        data_iter = self._data_iter
        if data_iter is None:
            data_iter = self._data_iter = iter(self.data_loader)
            # CPU loader, CPU model: nothing to move, and walking the batch
            # costs microseconds that a small step notices.
            self._batch_device = None if self.device.type == "cpu" else self.device
        try:
            batch = next(data_iter)
        except StopIteration:
            batch = self._restart_data()
        if self._batch_device is None:
            return batch
        return to_device(batch, self._batch_device)

    def _restart_data(self) -> Any:
        """The first batch of a new pass over the data loader, whose previous
        pass has ended: iterations, not epochs, bound training."""
        data_iter = self._data_iter = iter(self.data_loader)
        try:
            return next(data_iter)
        except StopIteration:
            raise RuntimeError("The training data loader yields no batches.") from None

    # (model, loss_fn, batch) -> losses by name; CompiledStep compiles it.
    _compute_losses = staticmethod(_forward_losses)

    # Whether published losses are copies (see CompiledStep) rather than
    # detached views of the step's own tensors.
    _copies_published = False

    def _published(self, value: torch.Tensor) -> torch.Tensor:
        return value.detach()

    def _parameters(self) -> List[torch.Tensor]:
        """The optimizer's parameters that have a gradient now (for subclasses
        such as the SAM example, which stack the gradients)."""
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {}
        if hasattr(self.data_loader, "state_dict"):
            state["data"] = self.data_loader.state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if "data" in state:
            if hasattr(self.data_loader, "load_state_dict"):
                self.data_loader.load_state_dict(state["data"])
            else:
                logger.warning(
                    "The checkpoint has a data position, but the data loader (%s) cannot load it: "
                    "the data stream restarts from its beginning.",
                    type(self.data_loader).__name__,
                )
        elif not hasattr(self.data_loader, "load_state_dict") and not self._warned_no_data_state:
            self._warned_no_data_state = True
            logger.warning(
                "The data loader (%s) has no state_dict(): a resumed run restarts its data stream. "
                "Use treadle.data.build_train_loader for an exact resume.",
                type(self.data_loader).__name__,
            )
        if "grad_scaler" in state and self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        # The next batch must come from the restored position.
        self._data_iter = None


def _describe_compile_error(error: BaseException) -> str:
    """The root cause of a compile failure in one line: dynamo wraps backend
    errors, and their first line says only that the backend raised."""
    root = getattr(error, "inner_exception", None) or error.__cause__ or error
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    return f"{type(root).__name__}: {lines[0] if lines else ''}"


class CompiledStep(EagerStep):
    """:class:`EagerStep` with the forward pass and loss run through ``torch.compile``.

    The compiled region is the model's forward plus ``loss_fn``; autograd
    compiles the matching backward. On GPU, ``mode="reduce-overhead"`` captures
    CUDA graphs. Where compilation is impossible (no dynamo on this platform,
    no C++ compiler, an unsupported model, a backend error) the step warns
    once, naming the cause, and runs eagerly from then on.

    Args:
        mode, backend, fullgraph, dynamic, options: passed to ``torch.compile``.
        Other arguments: as :class:`EagerStep`.
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        *,
        mode: Optional[str] = None,
        backend: str | Callable = "inductor",
        fullgraph: bool = False,
        dynamic: Optional[bool] = None,
        options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, data_loader, optimizer, **kwargs)
        if mode is not None and options is not None:
            raise ValueError("torch.compile takes either mode or options, not both")
        self.mode = mode
        self.backend = backend
        self._compiled: Optional[Callable] = None
        self._fell_back_reason: Optional[str] = None
        self._compiled_loss: Optional[Callable] = None
        if not torch._dynamo.is_dynamo_supported():
            self._fall_back("torch.compile is not supported on this platform or Python version")
        else:
            self._compiled = torch.compile(
                _forward_losses, mode=mode, backend=backend, fullgraph=fullgraph, dynamic=dynamic, options=options
            )
            if self._custom_loss:
                # A compute_loss of the user's is what is compiled then.
                self._compiled_loss = torch.compile(
                    self.compute_loss, mode=mode, backend=backend, fullgraph=fullgraph, dynamic=dynamic, options=options
                )
        self._cuda_graphs = mode in ("reduce-overhead", "max-autotune")

    @property
    def compiled(self) -> bool:
        """False once the step has fallen back to eager."""
        return self._compiled is not None

    def run_step(self) -> None:
        if self._compiled is not None and self._cuda_graphs and self.device.type == "cuda":
            # Outputs of the previous replay are read at flush from copies
            # (see _published); the graph may overwrite the originals.
            torch.compiler.cudagraph_mark_step_begin()
        super().run_step()

    def _losses_of(self, batch: Any) -> Dict[str, torch.Tensor]:
        if not self._custom_loss or self._compiled_loss is None:
            return super()._losses_of(batch)
        try:
            out = self._compiled_loss(batch)
        except Exception as e:  # noqa: BLE001 - as for the default contract: fall back, then raise eagerly
            self._fall_back(_describe_compile_error(e))
            return super()._losses_of(batch)
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            return {"total_loss": out}
        return _as_losses(out, f"{type(self).__name__}.compute_loss")

    def _compute_losses(self, model: nn.Module, loss_fn: Optional[Callable], batch: Any) -> Dict[str, torch.Tensor]:
        if self._compiled is None:
            return _forward_losses(model, loss_fn, batch)
        try:
            return self._compiled(model, loss_fn, batch)
        except Exception as e:  # noqa: BLE001 - any compile failure falls back; user errors re-raise eagerly below
            self._fall_back(_describe_compile_error(e))
            return _forward_losses(model, loss_fn, batch)

    # Copies: CUDA-graph outputs are overwritten by the next replay, and the
    # storage reads published tensors only at flush.
    _copies_published = True

    def _published(self, value: torch.Tensor) -> torch.Tensor:
        return value.detach().clone()

    def _fall_back(self, reason: str) -> None:
        self._compiled = None
        self._compiled_loss = None
        self._fell_back_reason = reason
        message = f"CompiledStep: compilation failed, training continues eagerly. Cause: {reason}"
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
