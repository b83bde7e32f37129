"""Step objects: what one training iteration does.

The trainer calls ``step.run_step()`` once per iteration and knows nothing
else of it. Assigning ``trainer.step = MyStep(...)`` replaces the iteration
(a GAN with two optimizers, custom accumulation, ...) while every hook,
writer and checkpoint keeps working.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Optional, Tuple, cast

import torch
from torch import nn

from treadle.checkpoint.fsdp import is_fsdp_model
from treadle.config.rules import is_number
from treadle.config.train_keys import PRECISIONS
from treadle.data.dataloader_position import generator_states, order_generators, restore_pass, why_cannot_restore
from treadle.evaluation.loss import LOSS_FN, MODEL, as_losses, forward_loss, loss_source
from treadle.events import ScalarKind, get_event_storage
from treadle.events.storage import EventStorage
from treadle.hooks.base import TrainerProtocol
from treadle.utils.device import to_device
from treadle.utils.torch_internals import dataloader_batches_taken, dynamo_supported


__all__ = ["StepBase", "EagerStep", "CompiledStep", "PRECISIONS"]

logger = logging.getLogger(__name__)

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NO_CONTEXT = contextlib.nullcontext()


def _three_positional(init: Callable[..., None]) -> Callable[..., None]:
    """A step's ``__init__`` that takes ``model, data_loader, optimizer``
    positionally, and refuses a fourth in one line naming the keyword: LiBai's
    ``EagerTrainer(model, data_loader, optimizer, grad_acc_steps)`` written for
    a step (Python's own "takes 4 positional arguments but 5 were given")."""

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 3:
            name = type(self).__name__
            raise TypeError(
                f"{name}(model, data_loader, optimizer, *, ...) takes 3 positional arguments and {len(args)} were "
                f"given: the rest are keyword-only (LiBai's EagerTrainer(model, data_loader, optimizer, "
                f"grad_acc_steps) is {name}(model, data_loader, optimizer, grad_accum_steps={args[3]!r}))"
            )
        init(self, *args, **kwargs)

    return checked


def _check_update_settings(
    grad_accum_steps: int, clip_grad_norm: Optional[float], clip_grad_value: Optional[float], precision: str
) -> None:
    """Refuses an :class:`EagerStep`'s update settings that it cannot train
    with, when the step is built (one line naming the argument)."""
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

    trainer: Optional[TrainerProtocol] = None

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
        """The trainer's ``after_backward``, when the step runs in a trainer."""
        if self.trainer is not None:
            self.trainer.after_backward()


class EagerStep(StepBase):
    """The standard iteration, run eagerly.

    Loss contract (:mod:`treadle.evaluation.loss`, which evaluation shares),
    in this order:

    1. with ``loss_fn``, the batch is ``(inputs, targets)`` and
       ``loss = loss_fn(model(inputs), targets)``, or a mapping with its
       targets under ``"labels"``: ``loss_fn(model(**rest), batch["labels"])``,
       the model getting the mapping without its ``"labels"``;
    2. without it, ``out = model(batch)`` (``model(**batch)`` for a mapping,
       as Hugging Face models take it; see :mod:`treadle.evaluation.batch`)
       and ``out`` is a scalar tensor, an object with a ``.loss`` attribute
       (Hugging Face model outputs, which are also dicts, so this comes
       first), a dict with a ``"loss"`` next to other outputs (logits), or
       a dict of scalar losses, which are summed and each published under
       its own name;
    3. a ``compute_loss`` (given, or overridden in a subclass) replaces both
       and returns any of the forms of 2.

    A loss that is not a scalar is an error naming where it came from. The
    sum is published as ``total_loss``. One iteration is one optimizer
    update, fed by ``grad_accum_steps`` micro-batches; each micro-batch loss
    is divided by ``grad_accum_steps``, so with mean-reduced losses the update
    equals that of one batch ``grad_accum_steps`` times larger.

    Args:
        model: the module to train; its mode must be ``train``.
        data_loader: any iterable of batches; iterated forever (re-iterated
            when exhausted). A loader with ``state_dict``/``load_state_dict``
            (``treadle.data.build_train_loader``) makes resume exact; a torch
            ``DataLoader`` is put back inside its pass where its order can
            be restored (:mod:`treadle.data.dataloader_position`).
        optimizer: any ``torch.optim.Optimizer``.
        loss_fn: see the loss contract.
        grad_accum_steps: micro-batches per optimizer update.
        clip_grad_norm: clip the total gradient norm to this value; the norm
            before clipping is published as ``grad_norm``.
        clip_grad_value: clamp each gradient element to
            ``[-clip_grad_value, clip_grad_value]``
            (``torch.nn.utils.clip_grad_value_``). Exclusive with
            ``clip_grad_norm``: which runs first changes the result, so the
            step refuses both rather than choose silently.
        precision: ``"fp32"``, ``"bf16"`` (autocast, CPU or GPU) or ``"fp16"``
            (autocast and a ``GradScaler``; needs CUDA).
        grad_scaler: a ``torch.amp.GradScaler`` for fp16 (one is made if not given).
        device: where batches are moved; by default the device of the model's
            parameters.
        compute_loss: ``compute_loss(batch) -> loss``, replacing the loss
            contract (the same as overriding :meth:`compute_loss`).
    """

    @_three_positional
    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        *,
        loss_fn: Optional[Callable[[Any, Any], Any]] = None,
        grad_accum_steps: int = 1,
        clip_grad_norm: Optional[float] = None,
        clip_grad_value: Optional[float] = None,
        precision: str = "fp32",
        grad_scaler: Optional["torch.amp.GradScaler"] = None,
        device: Optional[torch.device | str] = None,
        compute_loss: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        _check_update_settings(grad_accum_steps, clip_grad_norm, clip_grad_value, precision)
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.loss_fn = loss_fn
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
        # With fp32 and bf16 there is no scaler: the update sequence checks for None.
        self.grad_scaler = grad_scaler
        if compute_loss is not None:
            if not callable(compute_loss):
                raise TypeError(f"compute_loss must be callable, got {type(compute_loss).__name__}")
            self.compute_loss = compute_loss  # type: ignore[method-assign,assignment]
        self._data_iter: Optional[Iterator[Any]] = None
        self._warned_no_data_state = False
        # The pass over a torch DataLoader that _data_iter reads (0 for the first), and the
        # states of the generators its order came from, for a resume inside it (data_pass).
        self._passes = 0
        self._pass_start: Optional[List[torch.Tensor]] = None
        # Whether the model is sharded by FSDP2, found at the first accumulated
        # step (fully_shard may be applied after the step is built).
        self._fsdp2: Optional[bool] = None
        # The storage series this step appends to by name (see _publish), and their storage.
        self._series: Dict[str, List[Tuple[Any, int]]] = {}
        self._series_storage: Optional[EventStorage] = None

    @property
    def device(self) -> torch.device:
        if self._device is None:
            param = next(iter(self.model.parameters()), None)
            self._device = param.device if param is not None else torch.device("cpu")
        return self._device

    @property
    def loss_source(self) -> str:
        """Where the loss comes from, as errors name it (``loss_fn``, ``the
        model``, or a ``compute_loss``: ``MyTrainer.compute_loss``)."""
        given = self.__dict__.get("compute_loss")
        if given is not None:
            return loss_source(given)
        if type(self).compute_loss is not EagerStep.compute_loss:
            return f"{type(self).__name__}.compute_loss"
        return LOSS_FN if self.loss_fn is not None else MODEL

    # ------------------------------------------------------------------ iteration
    def run_step(self) -> None:
        """One iteration: ``grad_accum_steps`` batches, one update, the losses published."""
        if not self.model.training:
            raise RuntimeError(
                "The model is in eval mode at the start of a training step; a hook or an "
                "evaluation did not restore model.train()."
            )
        storage = get_event_storage()
        losses, grad_norm, data_time = self._update(self.next_batch, self.grad_accum_steps)
        self._publish(storage, losses, data_time)
        if grad_norm is not None:
            storage.put_scalar("grad_norm", grad_norm)

    def train_on_batch(self, batch: Any) -> Dict[str, torch.Tensor]:
        """One optimizer update on ``batch``, outside a training loop (a
        notebook's ``trainer.train_step(batch)``): the update of
        :meth:`run_step` on the whole batch. No hook runs and nothing is
        published; the losses are returned (detached tensors, by name, with
        ``grad_norm`` when clipping)."""
        batch = self._to_device(batch)
        losses, grad_norm, _ = self._update(lambda: batch, 1, hooks=False)
        if grad_norm is not None:
            losses["grad_norm"] = grad_norm
        return losses

    def _update(
        self, next_batch: Callable[[], Any], count: int, *, hooks: bool = True
    ) -> Tuple[Dict[str, torch.Tensor], Optional[torch.Tensor], float]:
        """The update sequence, written once for every precision and for
        accumulation: zero the gradients; for each of ``count`` micro-batches
        (``next_batch()``), forward and backward of its loss divided by
        ``count``, gradients synced across ranks on the last one only; then
        :meth:`step_optimizer`: unscale them (fp16); the trainer's
        ``after_backward`` (with ``hooks``); clip them (by norm or by value);
        the optimizer step. One straight sequence, without override points: a
        method per point would be paid by every iteration of every user. (The
        plain ``Trainer`` writes the seeds' own sequence in
        :class:`~treadle.compat.step.TrainerStep`.)

        Returns the losses averaged over the micro-batches (detached), the
        gradient norm before clipping (``None`` without ``clip_grad_norm``)
        and the seconds spent waiting in ``next_batch``.
        """
        optimizer, scaler = self.optimizer, self.grad_scaler
        optimizer.zero_grad(set_to_none=True)
        totals: Dict[str, torch.Tensor] = {}
        data_time = 0.0
        try:
            for micro in range(count):
                start = time.perf_counter()
                batch = next_batch()
                data_time += time.perf_counter() - start
                with self._gradient_sync(micro == count - 1) if count > 1 else _NO_CONTEXT:
                    losses = self._forward(batch)
                    loss = losses["total_loss"] if count == 1 else losses["total_loss"] / count
                    (loss if scaler is None else scaler.scale(loss)).backward()
                for name, value in losses.items():
                    value = self._published(value)
                    totals[name] = value if micro == 0 else totals[name] + value
        except BaseException:
            self._sync_after_error(count)
            raise
        grad_norm = self.step_optimizer(hooks=hooks)
        if count > 1:
            totals = {name: value / count for name, value in totals.items()}
        return totals, grad_norm, data_time

    def step_optimizer(self, *, hooks: bool = True) -> Optional[torch.Tensor]:
        """The end of every update, once the gradients are computed: unscale
        them (fp16), the trainer's ``after_backward`` (with ``hooks``), clip
        them (by norm or by value), the optimizer step (through the grad
        scaler with fp16). Returns the gradient norm before clipping (None
        without ``clip_grad_norm``). A research step that computes its
        gradients its own way (SAM's two passes) ends its update with it."""
        optimizer, scaler = self.optimizer, self.grad_scaler
        if scaler is not None:
            scaler.unscale_(optimizer)  # hooks and clipping see true gradients
        if hooks:
            self._after_backward()
        grad_norm = None
        if self.clip_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self._parameters(), self.clip_grad_norm)
        elif self.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(self._parameters(), self.clip_grad_value)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        return grad_norm

    def _sync_after_error(self, count: int) -> None:
        """Gradient sync back on after an error in an update of ``count``
        micro-batches: under FSDP2 an error mid-accumulation must not leave it
        off for whatever backward runs after it, outside this step."""
        if count > 1 and self._fsdp2:
            cast(Any, self.model).set_requires_gradient_sync(True)

    def _gradient_sync(self, sync: bool) -> ContextManager[Any]:
        """A micro-batch's backward, all-reducing gradients across ranks only
        where ``sync``. DDP skips the all-reduce inside ``no_sync()``; FSDP2
        has no ``no_sync()`` and takes a flag, which the last micro-batch sets
        back to True for whatever runs next."""
        if self._fsdp2 is None:
            self._fsdp2 = is_fsdp_model(self.model)
        if self._fsdp2:
            cast(Any, self.model).set_requires_gradient_sync(sync)
            return _NO_CONTEXT
        return cast(Any, self.model).no_sync() if not sync and hasattr(self.model, "no_sync") else _NO_CONTEXT

    def _forward(self, batch: Any) -> Dict[str, torch.Tensor]:
        """The losses of ``batch`` by name, their sum ``total_loss`` included,
        under the step's precision."""
        with self.autocast():
            return as_losses(self._loss_output(batch), self.loss_source)

    def _loss_output(self, batch: Any) -> Any:
        """What :meth:`compute_loss` returns for ``batch`` (run compiled by CompiledStep)."""
        return self.compute_loss(batch)

    def autocast(self) -> ContextManager[Any]:
        """The context a micro-batch's forward and loss run in: autocast to the
        step's ``precision`` (nothing with fp32). For a subclass's own update."""
        if self.precision == "fp32":
            return _NO_CONTEXT
        return torch.autocast(device_type=self.device.type, dtype=_AUTOCAST_DTYPES[self.precision])

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
        return forward_loss(self.model, self.loss_fn, batch)

    def next_batch(self) -> Any:
        """The next training batch, on the model's device; a new pass over
        the data loader starts when one ends (iterations, not epochs, bound
        training). For a subclass's own ``run_step`` (LiBai's and
        detectron2's ``next(self._data_loader_iter)``)."""
        if self._data_iter is None:
            self._data_iter = self._start_pass()
        try:
            batch = next(self._data_iter)
        except StopIteration:
            self._passes += 1
            self._data_iter = self._start_pass()
            try:
                batch = next(self._data_iter)
            except StopIteration:
                raise RuntimeError("The training data loader yields no batches.") from None
        return self._to_device(batch)

    def _start_pass(self) -> Iterator[Any]:
        """A new pass over ``data_loader``; once per pass, never per batch: the
        states its order comes from are recorded first, for a resume inside it."""
        generators = order_generators(self.data_loader)
        self._pass_start = generator_states(generators) if generators is not None else None
        return iter(self.data_loader)

    def _data_pass_state(self) -> Optional[Dict[str, Any]]:
        """Where a torch ``DataLoader`` is: ``epoch`` (its pass, from 0), ``batch``
        (those taken in it) and, where its order can be restored, the states
        of its generators when the pass began (:mod:`treadle.data.dataloader_position`)."""
        loader, iterator = self.data_loader, self._data_iter
        if not isinstance(loader, torch.utils.data.DataLoader):
            return None
        taken = dataloader_batches_taken(iterator) if iterator is not None else 0
        if taken is None:
            return None
        generators = order_generators(loader)
        if generators is not None and iterator is not None and taken == len(loader):
            # A pass read to its end is ended here, which draws what its end draws (RandomSampler's
            # generator), so that what is saved is where the next pass starts: else a resume would
            # read a whole pass again to get there.
            next(iterator, None)
            self._data_iter, self._passes, taken = None, self._passes + 1, 0
        state: Dict[str, Any] = {"epoch": self._passes, "batch": taken}
        if generators is not None:
            state["generators"] = self._pass_start if taken else generator_states(generators)
        return state

    def _continue_pass(self, saved: Dict[str, Any]) -> None:
        """Puts a torch ``DataLoader`` back where the checkpoint's ``data_pass``
        says it was, at resume (reading the batches of the pass already trained
        once); where its order cannot be restored, says so in one line."""
        self._passes, taken = int(saved["epoch"]), int(saved["batch"])
        states: List[torch.Tensor] = list(saved.get("generators") or ())
        why = why_cannot_restore(self.data_loader, states, taken)
        if why is not None:
            if taken:
                where = f"iteration {self.trainer.iter + 1}, " if self.trainer is not None else ""
                logger.warning(
                    "Resuming at %sbatch %d of epoch %d: this DataLoader cannot be put back at that batch (%s), "
                    "so it starts again at its first batch; give the dataset with batch_size= "
                    "(treadle.data.build_train_loader) for an exact resume", where, taken, self._passes, why,
                )
            return
        if taken:
            logger.info("Resuming the DataLoader at batch %d of epoch %d: reading the %d batches before it",
                        taken, self._passes, taken)
        self._data_iter = restore_pass(cast(torch.utils.data.DataLoader, self.data_loader), states, taken)
        self._pass_start = states

    def _to_device(self, batch: Any) -> Any:
        # A CPU model takes the batch as it is: walking it costs microseconds.
        return batch if self.device.type == "cpu" else to_device(batch, self.device)

    def _publish(self, storage: EventStorage, losses: Dict[str, torch.Tensor], data_time: float) -> None:
        """Appends the iteration's losses and ``data_time`` to their series
        (:meth:`EventStorage.open_series`), opened in each ``train()``'s storage."""
        if storage is not self._series_storage:
            self._series_storage = storage
            self._series = {
                "total_loss": storage.open_series("total_loss", kind=ScalarKind.LOSS),
                "data_time": storage.open_series("data_time", kind=ScalarKind.TIME, tensors=False),
            }
        series, iteration = self._series, storage.iter
        for name, value in losses.items():
            points = series.get(name)
            if points is None:
                points = series[name] = storage.open_series(name, kind=ScalarKind.LOSS)
            points.append((value, iteration))
        series["data_time"].append((data_time, iteration))
        # The producer bounds its series; values in host memory lower, as reading them is no sync.
        if len(series["data_time"]) >= (storage.max_pending if self.device.type != "cpu" else storage.max_pending_cpu):
            storage.bound_pending()

    def _published(self, value: torch.Tensor) -> torch.Tensor:
        """What is kept of a loss after the step: no autograd graph outlives
        it (a kept graph keeps each parameter's gradient accumulator with its
        old shape, wrong once a hook resizes the parameter; tests/engine/test_steps.py)."""
        return value.detach()

    def _parameters(self) -> List[torch.Tensor]:
        """The optimizer's parameters that have a gradient now (what clipping
        sees; subclasses such as the SAM example stack their gradients)."""
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {}
        if hasattr(self.data_loader, "state_dict"):
            state["data"] = self.data_loader.state_dict()
        else:
            data_pass = self._data_pass_state()
            if data_pass is not None:
                state["data_pass"] = data_pass
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
        elif (not hasattr(self.data_loader, "load_state_dict") and "data_pass" not in state
              and not self._warned_no_data_state):
            self._warned_no_data_state = True
            logger.warning(
                "The data loader (%s) has no state_dict(): a resumed run restarts its data stream. "
                "Use treadle.data.build_train_loader for an exact resume.",
                type(self.data_loader).__name__,
            )
        if "grad_scaler" in state and self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        # The next batch must come from the restored position.
        self.restart_data()
        if "data_pass" in state and not hasattr(self.data_loader, "load_state_dict"):
            self._continue_pass(state["data_pass"])

    def restart_data(self) -> None:
        """Has the next batch come from a new iterator over ``data_loader``
        (a loader replaced, or its position restored)."""
        self._data_iter = None



def _describe_compile_error(error: BaseException) -> str:
    """The root cause of a compile failure in one line: dynamo wraps backend
    errors, and their first line says only that the backend raised."""
    root = getattr(error, "inner_exception", None) or error.__cause__ or error
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    return f"{type(root).__name__}: {lines[0] if lines else ''}"


class CompiledStep(EagerStep):
    """:class:`EagerStep` with :meth:`compute_loss` (the forward pass and the
    loss) run through ``torch.compile``.

    The compiled region is the model's forward plus ``loss_fn`` (or a
    ``compute_loss`` of the user's); autograd compiles the matching backward.
    On GPU, ``mode="reduce-overhead"`` captures CUDA graphs. Where
    compilation is impossible (no dynamo on this platform, no C++ compiler,
    an unsupported model, a backend error) the step warns once, naming the
    cause, and runs eagerly from then on.

    Args:
        mode, backend, fullgraph, dynamic, options: passed to ``torch.compile``.
        others: as :class:`EagerStep`.
    """

    @_three_positional
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
        if not dynamo_supported():
            self._fall_back("torch.compile is not supported on this platform or Python version")
        else:
            self._compiled = torch.compile(
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

    def _loss_output(self, batch: Any) -> Any:
        if self._compiled is not None:
            try:
                return self._compiled(batch)
            except Exception as e:  # noqa: BLE001 - any compile failure falls back; user errors re-raise eagerly below
                self._fall_back(_describe_compile_error(e))
        return self.compute_loss(batch)

    def _published(self, value: torch.Tensor) -> torch.Tensor:
        # Copies: CUDA-graph outputs are overwritten by the next replay, and
        # the storage reads published tensors only at flush.
        return value.detach().clone()

    def _fall_back(self, reason: str) -> None:
        self._compiled = None
        self._fell_back_reason = reason
        message = f"CompiledStep: compilation failed, training continues eagerly. Cause: {reason}"
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
