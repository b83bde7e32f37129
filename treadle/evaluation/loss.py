"""Validation loss over a dataset."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import torch

from .batch import batch_size, get_targets
from .evaluator import metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator, float_accumulator_dtype

__all__ = ["LossEvaluator"]

LossFn = Callable[[Any, Any], Any]


def _loss_from_outputs(outputs: Any, who: str) -> torch.Tensor:
    # Mirrors the training step without a loss_fn (treadle.engine.steps._as_losses,
    # not imported: evaluation sits below the engine), so that the validation
    # loss is the quantity training minimizes. The order matters: an object
    # with a tensor .loss (a Hugging Face ModelOutput, itself a Mapping) is
    # read before being treated as a dict.
    if isinstance(outputs, torch.Tensor):
        return outputs
    loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(outputs, Mapping):
        tensors = [v for v in outputs.values() if isinstance(v, torch.Tensor)]
        # A dict of scalars is a dict of losses, summed as training sums them
        # ({"loss": ..., "aux": ...}); a dict that also holds non-scalar
        # tensors (logits) is a model output whose loss is under "loss".
        if tensors and all(v.numel() == 1 for v in tensors):
            return torch.stack([v.reshape(()).float() for v in tensors]).sum()
        if "loss" in outputs:
            return outputs["loss"]
        raise ValueError(
            f"{who}: without loss_fn the model must return a loss: a tensor, a dict with 'loss' "
            f"or a dict of scalar losses; got a dict with keys {sorted(map(str, outputs))}"
        )
    raise TypeError(
        f"{who}: without loss_fn the model must return a loss (a tensor, a dict, or an object "
        f"with .loss); got {type(outputs).__name__}. Pass loss_fn=..."
    )


@register_metric("loss", higher_is_better=False)
class LossEvaluator(StatisticsEvaluator):
    """``loss``: the mean loss per sample over the dataset.

    With ``loss_fn``, each batch is ``(inputs, targets)`` (or a dict with
    ``target_key``) and its loss is ``loss_fn(outputs, targets)``; without it,
    the model's outputs are the loss, as in training (a tensor, an object with
    a tensor ``.loss``, or a dict: of scalar losses, summed, else with a
    ``"loss"`` entry, e.g. next to the logits).

    A scalar loss is taken as the batch's mean and weighted by the batch size
    (the first dimension of the targets, or of the batch's first tensor without
    ``loss_fn``), so a short last batch counts for what it holds. A loss with
    one value per sample (or per element) is summed and counted element by
    element. Sums are kept in float64.
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("loss",),
        *,
        loss_fn: Optional[LossFn] = None,
        target_key: str = "labels",
    ) -> None:
        names = metric_names(metrics)
        if names != ["loss"]:
            raise ValueError(f"LossEvaluator computes only ['loss'], got {names}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
        self.loss_fn = loss_fn
        self.target_key = target_key
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        return {
            "loss_sum": torch.zeros((), dtype=torch.float64),
            "count": torch.zeros((), dtype=torch.int64),
        }

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        if self.loss_fn is not None:
            targets = get_targets(inputs, self.target_key, who)
            loss = self.loss_fn(outputs, targets)
            size_source = targets
        else:
            loss = _loss_from_outputs(outputs, who)
            size_source = inputs
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"{who}: the loss must be a tensor, got {type(loss).__name__}")
        loss = loss.detach().to(float_accumulator_dtype(loss.device))
        if loss.dim() == 0:
            n = batch_size(size_source)
            if n is None:
                raise ValueError(
                    f"{who}: cannot tell the batch size of a {type(size_source).__name__} to weight "
                    "the batch's mean loss; return one loss per sample instead"
                )
            self.update("loss_sum", loss * n)
        else:
            n = loss.numel()
            self.update("loss_sum", loss.sum())
        self.update("count", n, device=loss.device)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        count = int(stats["count"])
        if count == 0:
            raise ValueError(f"{type(self).__name__}: no samples were processed; is the data loader empty?")
        return {"loss": stats["loss_sum"] / count}
