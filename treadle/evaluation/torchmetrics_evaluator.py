"""torchmetrics ``Metric`` and ``MetricCollection`` objects as evaluators.

torchmetrics is optional: nothing here imports it. An object is taken for a
torchmetrics metric by what it does (``update``, ``compute``, ``reset``, and a
class from the ``torchmetrics`` package), so treadle runs without it.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

import torch

from .batch import get_predictions, get_targets
from .evaluator import DatasetEvaluator
from .results import Results

__all__ = ["TorchMetricsEvaluator", "is_torchmetrics_metric", "torchmetrics_name"]


def is_torchmetrics_metric(obj: Any) -> bool:
    """Whether ``obj`` is a torchmetrics ``Metric`` or ``MetricCollection``."""
    module = type(obj).__module__ or ""
    return module.split(".")[0] == "torchmetrics" and all(
        callable(getattr(obj, m, None)) for m in ("update", "compute", "reset")
    )


def torchmetrics_name(metric: Any) -> str:
    """The result name of a metric given without one: its class name in
    snake case (``MulticlassAUROC`` -> ``multiclass_auroc``)."""
    name = type(metric).__name__
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def _is_collection(metric: Any) -> bool:
    return callable(getattr(metric, "keys", None)) and hasattr(metric, "items")


def _as_floats(name: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return float(value.detach().reshape(()).cpu())
        # One value per class (average=None, say): a nested result, name/0, name/1, ...
        return {str(i): float(v) for i, v in enumerate(value.detach().reshape(-1).cpu())}
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _as_floats(f"{name}/{k}", v) for k, v in value.items()}
    raise TypeError(f"torchmetrics metric {name!r} computed a {type(value).__name__}; expected a tensor or a number")


class TorchMetricsEvaluator(DatasetEvaluator):
    """Feeds a torchmetrics ``Metric`` (or ``MetricCollection``) with each batch.

    ``metric.update(predictions, targets)`` runs on the device of the
    predictions (the metric is moved there once): torchmetrics keeps its
    state as tensors, so no host sync happens per batch. ``compute()`` is
    torchmetrics' own, which also synchronizes across processes. Results are
    Python floats, keyed by ``name`` (a ``Metric``) or by the collection's
    keys.

    Args:
        metric: the torchmetrics object.
        name: the result name of a single ``Metric``; by default its class
            name in snake case.
        output_key, target_key: where predictions and targets are (as for
            the built-in evaluators: a model output's ``logits``, a batch's
            ``labels``; ``(inputs, targets)`` pairs need no key).
    """

    def __init__(self, metric: Any, name: Optional[str] = None, *, output_key: str = "logits", target_key: str = "labels") -> None:
        if not is_torchmetrics_metric(metric):
            raise TypeError(f"TorchMetricsEvaluator needs a torchmetrics Metric or MetricCollection, got {type(metric).__name__}")
        self.metric = metric
        self.collection = _is_collection(metric)
        self.name = name or ("" if self.collection else torchmetrics_name(metric))
        self.output_key = output_key
        self.target_key = target_key
        self._device: Optional[torch.device] = None

    @property
    def result_names(self) -> Tuple[str, ...]:  # type: ignore[override]  # computed, where the base class has a class attribute
        if self.collection:
            return tuple(str(k) for k in self.metric.keys())
        return (self.name,)

    @property
    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        """Each result's direction as torchmetrics declares it (None where unknown)."""
        if self.collection:
            return {str(k): getattr(m, "higher_is_better", None) for k, m in self.metric.items()}
        return {self.name: getattr(self.metric, "higher_is_better", None)}

    def reset(self) -> None:
        self.metric.reset()

    def process(self, inputs: Any, outputs: Any) -> None:
        who = f"TorchMetricsEvaluator({self.name or type(self.metric).__name__})"
        predictions = get_predictions(outputs, self.output_key, who)
        targets = get_targets(inputs, self.target_key, who)
        if isinstance(predictions, torch.Tensor):
            if self._device != predictions.device:
                self._device = predictions.device
                self.metric.to(self._device)
            predictions = predictions.detach()
            if isinstance(targets, torch.Tensor):
                targets = targets.to(self._device)
        self.metric.update(predictions, targets)

    def evaluate(self) -> Results:
        value = self.metric.compute()
        if self.collection:
            return {str(k): _as_floats(str(k), v) for k, v in value.items()}
        return {self.name: _as_floats(self.name, value)}
