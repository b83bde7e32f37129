"""How a batch is fed to a model, and where evaluators find targets and predictions.

The rules (also in ``docs/evaluation.md``):

- a mapping, or a list/tuple whose items are all mappings (detectron2's list of
  per-sample dicts), goes to the model whole: ``model(batch)``;
- any other list/tuple of two items is ``(inputs, targets)``: ``model(inputs)``;
- a list/tuple of any other length is ambiguous and rejected (pass ``forward=``);
- anything else (a tensor, a custom object) goes whole: ``model(batch)``.

Evaluators always receive the whole batch, so for ``(inputs, targets)`` they
find the targets at index 1, and for a dict under a key (``"labels"`` by
default, as in Hugging Face models).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple, Union

import torch

from treadle.utils.device import to_device

__all__ = [
    "ForwardFn",
    "move_to_device",
    "default_forward",
    "get_targets",
    "get_predictions",
    "get_tensor_pair",
    "batch_size",
]

ForwardFn = Callable[[Any, Any], Any]


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
    return isinstance(batch, (list, tuple)) and len(batch) > 0 and all(isinstance(b, Mapping) for b in batch)


def default_forward(model: Callable[..., Any], batch: Any) -> Any:
    """Feeds ``batch`` to ``model`` by the rules in this module's docstring."""
    if isinstance(batch, Mapping) or _is_sample_list(batch):
        return model(batch)
    if isinstance(batch, (list, tuple)):
        if len(batch) != 2:
            raise ValueError(
                f"cannot feed a batch that is a {type(batch).__name__} of {len(batch)} items: "
                "the default feeds (inputs, targets) pairs as model(inputs), dicts as model(batch); "
                "pass forward=lambda model, batch: ... to inference_on_dataset"
            )
        return model(batch[0])
    return model(batch)


def get_targets(batch: Any, target_key: str, who: str) -> Any:
    """The targets of ``batch``: ``batch[1]`` of an ``(inputs, targets)`` pair,
    ``batch[target_key]`` of a mapping. ``who`` names the evaluator in errors."""
    if isinstance(batch, Mapping):
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
    if isinstance(outputs, Mapping):
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
    if isinstance(obj, Mapping):
        for v in obj.values():
            n = batch_size(v)
            if n is not None:
                return n
        return None
    if isinstance(obj, (list, tuple)):
        if not obj:
            return 0
        if all(not isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in obj):
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
