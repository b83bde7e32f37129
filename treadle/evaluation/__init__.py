"""Evaluation: evaluators, metrics by name, and the inference loop.

``inference_on_dataset(model, loader, build_evaluator(["accuracy", "f1"]))``
runs a model over a data loader and returns ``{"accuracy": ..., "f1": ...}``.
See ``docs/evaluation.md``.
"""

import functools
import warnings
from typing import Any

from .batch import (
    TARGET_KEY,
    ForwardFn,
    batch_size,
    forward_batch,
    get_predictions,
    get_targets,
    get_tensor_pair,
    move_to_device,
    training_forward,
)
from .evaluator import DatasetEvaluator, DatasetEvaluators
from .inference import inference_context, inference_on_dataset
from .registry import (
    MetricSpec,
    available_metrics,
    build_evaluator,
    known_metric_mode,
    metric_mode,
    register_metric,
    unregister_metric,
)
from .results import Results, flatten_results, format_results, print_csv_format
from .statistics import StatisticsEvaluator, all_reduce_statistics, float_accumulator_dtype

# The built-in evaluators register their metric names when imported.
from .classification import ClassificationEvaluator
from .loss import LossEvaluator, as_losses, evaluator_loss_fn, forward_loss
from .perplexity import PerplexityEvaluator
from .regression import RegressionEvaluator
from .sequence import SequenceEvaluator, edit_distance
from .token_classification import SeqevalEvaluator, model_id2label
from .torchmetrics_evaluator import TorchMetricsEvaluator, is_torchmetrics_metric, torchmetrics_name

# The forward's names before forward_batch, kept for one release with a warning.
_FOLDED_FORWARDS = {
    "default_forward": ("forward_batch", lambda: forward_batch),
    "call_model": ("forward_batch(model, batch, whole=True)", lambda: functools.partial(forward_batch, whole=True)),
    "whole_batch_forward": (
        "forward_batch(model, batch, whole=True)",
        lambda: functools.partial(forward_batch, whole=True),
    ),
    "forward_for": (
        "functools.partial(forward_batch, whole=loss_fn is None)",
        lambda: lambda loss_fn: functools.partial(forward_batch, whole=loss_fn is None),
    ),
}


def __getattr__(name: str) -> Any:
    folded = _FOLDED_FORWARDS.get(name)
    if folded is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    replacement, make = folded
    warnings.warn(
        f"treadle.evaluation.{name} is folded into forward_batch: use {replacement}", FutureWarning, stacklevel=2
    )
    return make()


__all__ = [
    "DatasetEvaluator",
    "DatasetEvaluators",
    "StatisticsEvaluator",
    "ClassificationEvaluator",
    "RegressionEvaluator",
    "LossEvaluator",
    "as_losses",
    "evaluator_loss_fn",
    "forward_loss",
    "SequenceEvaluator",
    "SeqevalEvaluator",
    "model_id2label",
    "PerplexityEvaluator",
    "TorchMetricsEvaluator",
    "is_torchmetrics_metric",
    "torchmetrics_name",
    "MetricSpec",
    "forward_batch",
    "training_forward",
    "inference_on_dataset",
    "inference_context",
    "build_evaluator",
    "register_metric",
    "unregister_metric",
    "available_metrics",
    "metric_mode",
    "known_metric_mode",
    "Results",
    "flatten_results",
    "format_results",
    "print_csv_format",
    "all_reduce_statistics",
    "float_accumulator_dtype",
    "edit_distance",
    "ForwardFn",
    "TARGET_KEY",
    "move_to_device",
    "get_targets",
    "get_predictions",
    "get_tensor_pair",
    "batch_size",
]
