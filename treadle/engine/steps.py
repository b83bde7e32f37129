"""Step objects: what one training iteration does.

The trainer calls ``step.run_step()`` once per iteration and knows nothing
else of it. Assigning ``trainer.step = MyStep(...)`` replaces the iteration
(a GAN with two optimizers, custom accumulation, ...) while every hook,
writer and checkpoint keeps working.

A step is made of parts any step can hold: its data, a
:class:`~treadle.data.DataStream` (batches without end, with a position a
checkpoint keeps), and one :class:`~treadle.engine.Update` per optimizer
(backward, accumulation, precision, clipping, the optimizer step). A step
saves and restores the parts it holds as attributes by itself.
"""

from __future__ import annotations

import collections.abc
import functools
import logging
import warnings
import weakref
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from treadle.config.train_keys import PRECISIONS
from treadle.data.stream import DataStream
from treadle.evaluation.loss import LOSS_FN, MODEL, as_losses, forward_loss, loss_source
from treadle.events import ScalarKind, get_event_storage
from treadle.events.storage import EventStorage
from treadle.hooks.base import TrainerProtocol
from treadle.utils.device import to_device
from treadle.utils.torch_internals import dynamo_supported

from .update import Update


__all__ = ["StepBase", "EagerStep", "CompiledStep", "PRECISIONS", "unknown_data_position"]

logger = logging.getLogger(__name__)


#: What the layers above add to the refusal of a fourth positional argument
#: of a step's constructor: ``hint(step_class_name, args_after_the_third)``,
#: a few words in parentheses, or None (:mod:`treadle.compat` adds another
#: trainer's spelling of the constructor).
POSITIONAL_HINTS: List[Callable[[str, Tuple[Any, ...]], Optional[str]]] = []


def _three_positional(init: Callable[..., None]) -> Callable[..., None]:
    """A step's ``__init__`` that takes ``model, data_loader, optimizer``
    positionally, and refuses a fourth in one line saying the rest are
    keyword-only (Python's own "takes 4 positional arguments but 5 were
    given" counts ``self`` and names no keyword), with the hints of
    :data:`POSITIONAL_HINTS`."""

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 3:
            name = type(self).__name__
            hints = [hint for hint in (h(name, args[3:]) for h in POSITIONAL_HINTS) if hint]
            raise TypeError(
                f"{name}(model, data_loader, optimizer, *, ...) takes 3 positional arguments and {len(args)} were "
                f"given: the rest are keyword-only" + "".join(f" ({hint})" for hint in hints)
            )
        init(self, *args, **kwargs)

    return checked



#: The parts a step holds as attributes, which it saves and restores by itself.
STEP_PARTS = (DataStream, Update)
_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


class StepBase:
    """One training iteration.

    ``run_step`` fetches data, computes losses, updates the parameters and
    publishes what it measured to the event storage (tensors, never read on
    the host). Between backward and the optimizer step it calls
    :meth:`after_backward` so that hooks can inspect gradients.

    ``state_dict`` returns what a resume needs, as plain data; it is saved
    with the trainer's state, each rank's on its rank. By default it is the
    state of the step's parts: each :class:`~treadle.data.DataStream` (the
    data position) and :class:`~treadle.engine.Update` (the grad scaler) held
    as an attribute (or in a list or dict attribute), by the attribute's name. A step with state of its own
    (a queue, a memory bank) adds it to ``super().state_dict()``.

    ``self.trainer`` is set (as a weak proxy) when the step is assigned to
    ``trainer.step``; it is ``None`` for a step run on its own.
    """

    trainer: Optional[TrainerProtocol] = None

    def run_step(self) -> None:
        raise NotImplementedError

    @property
    def storage(self) -> EventStorage:
        return get_event_storage()

    def after_backward(self) -> None:
        """Runs the trainer's ``after_backward`` hooks, when the step runs in a
        trainer: call it between backward and the optimizer step (or give it
        to :meth:`Update.step <treadle.engine.Update.step>`)."""
        if self.trainer is not None:
            self.trainer.after_backward()

    _after_backward = after_backward  # its name before it was public

    def parts(self) -> Dict[str, Any]:
        """The step's parts by attribute name: each
        :class:`~treadle.data.DataStream` and :class:`~treadle.engine.Update`
        it holds, which ``state_dict()`` saves; those in a list, tuple or dict
        attribute by ``name.index`` or ``name.key``."""
        parts: Dict[str, Any] = {}
        # By type, not isinstance: the trainer is a weak proxy, which a dead referent makes raise.
        for name, value in vars(self).items():
            if issubclass(type(value), STEP_PARTS):
                parts[name] = value
            elif type(value) in (list, tuple, dict):
                items = value.items() if type(value) is dict else enumerate(value)
                parts.update((f"{name}.{key}", item) for key, item in items if issubclass(type(item), STEP_PARTS))
        return parts

    def state_dict(self) -> Dict[str, Any]:
        return {name: state for name, part in self.parts().items() if (state := part.state_dict())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        parts = self.parts()
        unknown = sorted(set(state) - set(parts))
        if unknown:
            raise KeyError(f"{type(self).__name__} keeps no state under {unknown} (its parts: {sorted(parts)}); "
                           f"a step with state of its own loads it in its load_state_dict")
        for name, part_state in state.items():
            parts[name].load_state_dict(part_state)


def unknown_data_position(step: StepBase) -> Optional[str]:
    """Why a checkpoint of ``step`` holds no position of its data, in one line,
    or None: a step that reads batches from something other than a
    :class:`~treadle.data.DataStream` (a DataLoader, an iterator,
    ``itertools.cycle``) and saves no ``data`` state of its own."""
    if any(issubclass(type(part), DataStream) for part in step.parts().values()):
        return None
    # By type, not isinstance, and the trainer left out: a weak proxy, which passes for an iterator.
    types = [type(value) for value in vars(step).values() if not issubclass(type(value), _PROXIES)]
    sources = [kind for kind in types if issubclass(kind, (collections.abc.Iterator, torch.utils.data.DataLoader))]
    if not sources:
        return None
    state = step.state_dict()
    if any(key in state for key in ("data", "data_pass")):
        return None
    return (f"{type(step).__name__} reads its batches from a {sources[0].__name__}, whose position no "
            f"checkpoint keeps: a resumed run starts its data again at the first batch. Read them from a "
            f"treadle.data.DataStream (self.data = DataStream(loader); next(self.data)) for an exact resume")


def _of_update(name: str, doc: str, *, settable: bool = False) -> Any:
    """A property of :class:`EagerStep` that is its update's attribute ``name``."""

    def get(step: "EagerStep") -> Any:
        return getattr(step.update, name)

    def set_(step: "EagerStep", value: Any) -> None:
        setattr(step.update, name, value)

    return property(get, set_ if settable else None, doc=doc)


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

    The step holds its data as ``self.data``, a
    :class:`~treadle.data.DataStream`, and its update as ``self.update``, an
    :class:`~treadle.engine.Update`: a subclass's own ``run_step`` calls their
    parts (``next(self.data)``, ``self.update.apply(loss)``).

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
        self.model = model
        self.loss_fn = loss_fn
        self._device = torch.device(device) if device is not None else None
        # The update checks its settings (fp16 against the model's device) before anything else is built.
        self.update = Update(
            optimizer, model=model, grad_accum_steps=grad_accum_steps, clip_grad_norm=clip_grad_norm,
            clip_grad_value=clip_grad_value, precision=precision, grad_scaler=grad_scaler,
            device=self.device if precision == "fp16" else device,
        )
        # The device is the model's, found at the first batch (the model may move after the step is built).
        self.data = DataStream(data_loader)
        if compute_loss is not None:
            if not callable(compute_loss):
                raise TypeError(f"compute_loss must be callable, got {type(compute_loss).__name__}")
            self.compute_loss = compute_loss  # type: ignore[method-assign,assignment]
        # The storage series this step appends to by name (see _publish), and their storage.
        self._series: Dict[str, List[Tuple[Any, int]]] = {}
        self._series_storage: Optional[EventStorage] = None

    # The update's settings, read (and the optimizer and scaler set) on the step as before it held an Update.
    optimizer = _of_update("optimizer", "The optimizer the step's :class:`~treadle.engine.Update` steps.", settable=True)
    grad_scaler = _of_update("grad_scaler", "The fp16 ``GradScaler`` of the step's update (None otherwise).",
                             settable=True)
    grad_accum_steps = _of_update("grad_accum_steps", "Micro-batches per optimizer update.")
    clip_grad_norm = _of_update("clip_grad_norm", "The total gradient norm clipped to, or None for no clipping by norm.")
    clip_grad_value = _of_update("clip_grad_value", "The bound of the gradient elements, or None for no clipping by value.")
    precision = _of_update("precision", "``fp32``, ``bf16`` or ``fp16``.")

    @property
    def data_loader(self) -> Iterable[Any]:
        """The loader ``self.data`` reads; setting it replaces the loader (the
        next batch comes from the new one's first pass... call :meth:`restart_data`)."""
        return self.data.loader

    @data_loader.setter
    def data_loader(self, loader: Iterable[Any]) -> None:
        self.data.loader = loader

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
        losses, grad_norm, data_time = self._update(self.next_batch, self.update.grad_accum_steps)
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
        """One update on ``count`` micro-batches (``next_batch()``): the
        gradients of their losses (:meth:`Update.accumulate
        <treadle.engine.Update.accumulate>`), then :meth:`Update.step
        <treadle.engine.Update.step>` with the trainer's ``after_backward``
        (with ``hooks``). Returns the losses averaged over the micro-batches
        (detached), the gradient norm before clipping (``None`` without
        ``clip_grad_norm``) and the seconds spent waiting in ``next_batch``.
        (The plain ``Trainer``'s step for other trainers' override points
        calls the same parts in their order.)"""
        update = self.update
        losses, data_time = update.accumulate(next_batch, self._forward, count, self._published)
        return losses, update.step(self.after_backward if hooks else None), data_time

    def step_optimizer(self, *, hooks: bool = True) -> Optional[torch.Tensor]:
        """The end of an update whose gradients the step computed its own way
        (SAM's two passes): :meth:`Update.step <treadle.engine.Update.step>`,
        with the trainer's ``after_backward`` hooks (``hooks``). Returns the
        gradient norm before clipping (None without ``clip_grad_norm``)."""
        return self.update.step(self.after_backward if hooks else None)

    def _forward(self, batch: Any) -> Dict[str, torch.Tensor]:
        """The losses of ``batch`` by name, their sum ``total_loss`` included,
        under the step's precision."""
        with self.update.autocast():
            return as_losses(self._loss_output(batch), self.loss_source)

    def _loss_output(self, batch: Any) -> Any:
        """What :meth:`compute_loss` returns for ``batch`` (run compiled by CompiledStep)."""
        return self.compute_loss(batch)

    def autocast(self) -> ContextManager[Any]:
        """The context a micro-batch's forward and loss run in: autocast to the
        step's ``precision`` (nothing with fp32). For a subclass's own update."""
        return self.update.autocast()

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
        detectron2's ``next(self._data_loader_iter)``); ``next(self.data)``
        is the same."""
        data = self.data
        if data.device is None:
            data.device = self.device
        return next(data)

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
        """The optimizer's parameters that have a gradient now (what clipping sees)."""
        return self.update.parameters()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """The data position (``data`` or ``data_pass``) and the grad scaler
        (``grad_scaler``) at the top, as before the step held parts; any other
        part of a subclass by its name."""
        state = super().state_dict()
        state.update(state.pop("data", {}))
        state.update(state.pop("update", {}))
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        own = {"data", "data_pass", "grad_scaler"}
        super().load_state_dict({key: value for key, value in state.items() if key not in own})
        where = f"iteration {self.trainer.iter + 1}, " if "data_pass" in state and self.trainer is not None else ""
        # The next batch comes from the restored position.
        self.data.load_state_dict({key: value for key, value in state.items() if key in ("data", "data_pass")},
                                  where=where)
        self.update.load_state_dict(state)

    def restart_data(self) -> None:
        """Has the next batch come from a new iterator over ``data_loader``
        (a loader replaced, or its position restored)."""
        self.data.restart()

    @property
    def _data_iter(self) -> Any:
        return self.data.iterator


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
