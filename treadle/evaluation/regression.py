"""Mean squared and mean absolute error."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch

from .batch import get_tensor_pair
from .evaluator import checked_metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator, float_accumulator_dtype

__all__ = ["RegressionEvaluator"]

_METRICS = ("mse", "mae")


def _squeezed_shape(t: torch.Tensor) -> List[int]:
    return [d for d in t.shape if d != 1]


@register_metric(list(_METRICS), higher_is_better=False)
class RegressionEvaluator(StatisticsEvaluator):
    """``mse`` and ``mae``: squared and absolute errors averaged over every
    element of every batch (so over samples, for one value per sample).

    Predictions and targets must have the same shape up to dimensions of size 1
    (``(N, 1)`` against ``(N,)`` is accepted; ``(N, 2)`` against ``(N,)`` is an
    error rather than a silent broadcast). Sums are kept in float64.
    """

    def __init__(
        self,
        metrics: Sequence[str] = _METRICS,
        *,
        output_key: str = "logits",
        target_key: str = "labels",
    ) -> None:
        names = checked_metric_names("RegressionEvaluator", metrics, _METRICS)
        self.metrics = names
        self.output_key = output_key
        self.target_key = target_key
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        return {
            "squared_error": torch.zeros((), dtype=torch.float64),
            "absolute_error": torch.zeros((), dtype=torch.float64),
            "count": torch.zeros((), dtype=torch.int64),
        }

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        predictions, targets = get_tensor_pair(inputs, outputs, self.output_key, self.target_key, who)
        if _squeezed_shape(predictions) != _squeezed_shape(targets):
            raise ValueError(
                f"{who}: predictions of shape {tuple(predictions.shape)} do not match "
                f"targets of shape {tuple(targets.shape)}"
            )
        dtype = float_accumulator_dtype(predictions.device)
        targets = targets.reshape(-1).to(device=predictions.device, dtype=dtype)
        error = predictions.detach().reshape(-1).to(dtype) - targets
        self.update("squared_error", error.square().sum())
        self.update("absolute_error", error.abs().sum())
        self.update("count", error.numel(), device=error.device)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        count = int(stats["count"])
        if count == 0:
            raise ValueError(f"{type(self).__name__}: no values were processed; is the data loader empty?")
        values = {"mse": stats["squared_error"] / count, "mae": stats["absolute_error"] / count}
        return {m: values[m] for m in self.metrics}
