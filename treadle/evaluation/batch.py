"""How a batch is fed to a model, and where evaluators find targets and predictions.

The rules, the same in training and evaluation (also in ``docs/evaluation.md``):

- a mapping (a Hugging Face batch: ``input_ids``, ``attention_mask``,
  ``labels``...) is spread into keyword arguments: ``model(**batch)``, as
  Hugging Face and LiBai do; a model whose ``forward`` takes one argument and
  not those keywords gets the mapping whole, ``model(batch)``;
- a list/tuple whose items are all mappings (detectron2's list of per-sample
  dicts) goes to the model whole: ``model(batch)``;
- with a loss function (``loss_fn``), any other list/tuple of two items is
  ``(inputs, targets)``: ``model(inputs)``; the default evaluation forward
  does the same, and rejects a list/tuple of another length (pass ``forward=``);
  a mapping reaches the model without its targets (``"labels"``), as the
  Hugging Face Trainer feeds a model whose loss a custom loss computes:
  ``model(**inputs)``, and the ``loss_fn`` gets ``batch["labels"]``;
- without one, the model computes its own loss from the batch: anything that
  is not a mapping goes whole, ``model(batch)``, in evaluation too
  (:func:`forward_batch` with ``whole=True``);
- anything else (a tensor, a custom object) goes whole: ``model(batch)``.

Evaluators always receive the whole batch, so for ``(inputs, targets)`` they
find the targets at index 1, and for a dict under a key (``"labels"`` by
default, as in Hugging Face models).
"""

from __future__ import annotations

import inspect
import functools
from collections import abc
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch

from treadle.utils.device import to_device
from treadle.utils.torch_internals import compiled_module

__all__ = [
    "ForwardFn",
    "TARGET_KEY",
    "move_to_device",
    "forward_batch",
    "training_forward",
    "get_targets",
    "get_predictions",
    "get_tensor_pair",
    "batch_size",
]

#: How evaluation calls the model on a batch: ``forward(model, batch) -> outputs``.
ForwardFn = Callable[[Any, Any], Any]

#: Where a mapping batch holds its targets, as in Hugging Face models: what a
#: ``loss_fn`` is given and what reaches the model without it.
TARGET_KEY = "labels"


def move_to_device(obj: Any, device: Union[str, torch.device]) -> Any:
    """Returns ``obj`` with every tensor in it moved to ``device``.

    The same walk as training's (:func:`treadle.utils.device.to_device`):
    lists, tuples (named tuples included), mappings and dataclasses; other
    objects are moved with their own ``.to(device)`` when they have one (Hugging
    Face's ``BatchEncoding``), else returned unchanged. Copies are non-blocking
    only towards an accelerator.
    """
    return to_device(obj, device)


def _is_sample_list(batch: Any) -> bool:
    # The first item first: an (inputs, targets) pair of tensors is decided by one check.
    return (
        isinstance(batch, (list, tuple))
        and len(batch) > 0
        and isinstance(batch[0], abc.Mapping)
        and all(isinstance(b, abc.Mapping) for b in batch)
    )


# (type of the module, keys of the batch) -> whether the mapping is spread.
_SPREAD: Dict[Tuple[type, frozenset], bool] = {}


def _innermost(model: Any) -> Any:
    # DDP's .module and torch.compile's ._orig_mod forward whatever they get:
    # the signature that decides is the wrapped model's.
    for _ in range(8):
        inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            inner = compiled_module(model)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def _spreads(model: Any, batch: Mapping) -> bool:
    """Whether ``model`` takes the mapping's keys as keyword arguments."""
    inner = _innermost(model)
    key = (type(inner), frozenset(batch))
    known = _SPREAD.get(key)
    if known is not None:
        return known
    target = inner.forward if isinstance(inner, torch.nn.Module) else inner
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        spread = True
    else:
        try:
            signature.bind(**batch)
            spread = True
        except TypeError:
            try:
                signature.bind(batch)
                spread = False  # forward(self, batch): the mapping whole
            except TypeError:
                spread = True  # neither fits: let the call raise with the keywords' names
    _SPREAD[key] = spread
    return spread


def _call(model: Callable[..., Any], batch: Any) -> Any:
    # A mapping is spread (or given whole, see _spreads); anything else goes whole.
    if isinstance(batch, abc.Mapping) and _spreads(model, batch):
        return model(**batch)
    return model(batch)


def training_forward(loss_fn: Optional[Callable[..., Any]]) -> ForwardFn:
    """The forward training uses, as a :data:`ForwardFn`: with a ``loss_fn``,
    a mapping reaches the model without its :data:`TARGET_KEY` (which the
    ``loss_fn`` gets); without one, the model takes the whole batch (it
    computes its own loss)."""
    return functools.partial(forward_batch, whole=loss_fn is None, target_key=None if loss_fn is None else TARGET_KEY)


def forward_batch(model: Callable[..., Any], batch: Any, *, whole: bool = False,
                  target_key: Optional[str] = None) -> Any:
    """Feeds ``batch`` to ``model`` by the rules of this module's docstring:
    treadle's one forward, in training and evaluation.

    ``target_key`` (given where a ``loss_fn`` computes the loss from the
    targets under it): a mapping reaches the model without that key.

    ``whole=False`` (a model trained with a ``loss_fn``; evaluation's
    default): an ``(inputs, targets)`` pair is ``model(inputs)``; a list or
    tuple of another length is refused (pass ``forward=``). ``whole=True`` (a
    model that computes its own loss, trained without ``loss_fn``): the batch
    goes whole, and a model that fails on a whole pair is explained in one
    line: it returns predictions, and needs a ``loss_fn``. Either way a
    mapping is spread, ``model(**batch)``, and a list of per-sample mappings
    or any other object goes whole.
    """
    if target_key is not None and isinstance(batch, abc.Mapping):
        batch = {key: value for key, value in batch.items() if key != target_key}
    if whole:
        try:
            return _call(model, batch)
        except (TypeError, AttributeError) as e:
            if isinstance(batch, (tuple, list)) and len(batch) == 2 and not _is_sample_list(batch):
                raise type(e)(
                    f"the model was given the whole (inputs, targets) batch, as there is no loss_fn, and raised: "
                    f"{e}. A model that returns predictions needs a loss_fn (train.step.loss_fn in a config)"
                ) from e
            raise
    if isinstance(batch, (list, tuple)) and not _is_sample_list(batch):
        if len(batch) != 2:
            raise ValueError(
                f"cannot feed a batch that is a {type(batch).__name__} of {len(batch)} items: "
                "the default feeds (inputs, targets) pairs as model(inputs), dicts as model(batch); "
                "pass forward=lambda model, batch: ... to inference_on_dataset"
            )
        return model(batch[0])
    return _call(model, batch)


def get_targets(batch: Any, target_key: str, who: str) -> Any:
    """The targets of ``batch``: ``batch[1]`` of an ``(inputs, targets)`` pair,
    ``batch[target_key]`` of a mapping. ``who`` names the evaluator in errors."""
    if isinstance(batch, abc.Mapping):
        if target_key not in batch:
            raise KeyError(
                f"{who}: the batch has no target key {target_key!r}; its keys are "
                f"{sorted(map(str, batch))}. Pass target_key=... to the evaluator"
            )
        return batch[target_key]
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and not _is_sample_list(batch):
        return batch[1]
    raise TypeError(
        f"{who}: cannot find targets in a batch of type {type(batch).__name__}; "
        "expected an (inputs, targets) pair or a dict holding the targets under target_key"
    )


def get_predictions(outputs: Any, output_key: str, who: str) -> Any:
    """The predictions in a model's ``outputs``: the outputs themselves, or
    ``outputs[output_key]`` / ``outputs.output_key`` (Hugging Face ``ModelOutput``)."""
    if isinstance(outputs, abc.Mapping):
        if output_key not in outputs:
            raise KeyError(
                f"{who}: the model outputs have no key {output_key!r}; their keys are "
                f"{sorted(map(str, outputs))}. Pass output_key=... to the evaluator"
            )
        return outputs[output_key]
    if not isinstance(outputs, (torch.Tensor, list, tuple, str)) and hasattr(outputs, output_key):
        return getattr(outputs, output_key)
    return outputs


def batch_size(obj: Any) -> Optional[int]:
    """Number of samples in ``obj``: the first dimension of its first tensor
    (searching pairs and mappings in order), or the length of a list of
    non-tensors. ``None`` when there is no way to tell."""
    if isinstance(obj, torch.Tensor):
        return int(obj.shape[0]) if obj.dim() > 0 else 1
    if isinstance(obj, abc.Mapping):
        for v in obj.values():
            n = batch_size(v)
            if n is not None:
                return n
        return None
    if isinstance(obj, (list, tuple)):
        if not obj:
            return 0
        if all(not isinstance(v, (torch.Tensor, abc.Mapping, list, tuple)) for v in obj):
            return len(obj)
        if _is_sample_list(obj):
            return len(obj)
        for v in obj:
            n = batch_size(v)
            if n is not None:
                return n
        return None
    return None


def get_tensor_pair(inputs: Any, outputs: Any, output_key: str, target_key: str, who: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(predictions, targets)`` of a batch, both tensors.

    Raises:
        TypeError: naming the evaluator (``who``) when either is not a tensor.
    """
    predictions = get_predictions(outputs, output_key, who)
    targets = get_targets(inputs, target_key, who)
    if not isinstance(predictions, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError(
            f"{who}: expected tensors for predictions and targets, got "
            f"{type(predictions).__name__} and {type(targets).__name__}"
        )
    return predictions, targets
