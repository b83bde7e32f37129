"""Accuracy, top-k accuracy, precision, recall and F1 from logits and integer targets."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

import torch

from treadle.utils import comm
from treadle.utils.device import to_device

from .batch import get_tensor_pair
from .evaluator import metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator

__all__ = ["ClassificationEvaluator"]

_TOPK = re.compile(r"top([1-9][0-9]*)_accuracy")
_AVERAGES = ("macro", "weighted", "micro")
_NEEDS_CONFUSION = ("precision", "recall", "f1")


@register_metric(["accuracy", "top{k}_accuracy", "precision", "recall", "f1"], higher_is_better=True)
class ClassificationEvaluator(StatisticsEvaluator):
    """Single-label classification metrics from logits ``(N, C)`` (or
    ``(N, ..., C)``) and integer targets ``(N,)`` (or ``(N, ...)``).

    Statistics: the number of counted targets, of correct top-1 and top-k
    predictions, and, when precision, recall or F1 is asked for, a ``C x C``
    confusion matrix (rows: targets, columns: predictions). All are int64, so
    results are exact and identical in distributed runs.

    Averaging of precision/recall/F1 (``average``):

    - ``"macro"`` (default): the unweighted mean over classes that occur in the
      targets or in the predictions; a class absent from both is left out, as
      scikit-learn does without ``labels=``. A class never predicted has
      precision 0 and a class never present has recall 0 (scikit-learn's
      ``zero_division=0``); a class's F1 is ``2 tp / (2 tp + fp + fn)``, so F1
      is the mean of per-class F1, not the F1 of mean precision and recall;
    - ``"weighted"``: the same per-class values, weighted by support;
    - ``"micro"``: from total counts; for single-label data all three equal
      accuracy.

    Targets equal to ``ignore_index`` are not counted. A target outside
    ``[0, C)`` is an error at ``evaluate()`` (checked there, not per batch, to
    keep the pass free of host syncs). ``num_classes``, when given, is checked
    against the logits' last dimension; when not given it is read from the
    logits.
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("accuracy",),
        *,
        num_classes: Optional[int] = None,
        average: str = "macro",
        ignore_index: Optional[int] = None,
        output_key: str = "logits",
        target_key: str = "labels",
    ) -> None:
        self.metrics: List[str] = _check_metrics(metrics)
        if average not in _AVERAGES:
            raise ValueError(f"average must be one of {list(_AVERAGES)}, got {average!r}")
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
        ):
            raise ValueError(f"num_classes must be a positive int or None, got {num_classes!r}")
        self.num_classes = num_classes
        self.average = average
        self.ignore_index = ignore_index
        self.output_key = output_key
        self.target_key = target_key
        self.topk: List[int] = sorted({int(m.group(1)) for m in map(_TOPK.fullmatch, self.metrics) if m})
        self.needs_confusion = any(m in _NEEDS_CONFUSION for m in self.metrics)
        # Read from the first batch when num_classes is not given.
        self._seen_classes: Optional[int] = num_classes
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        stats = {
            "total": torch.zeros((), dtype=torch.int64),
            "correct": torch.zeros((), dtype=torch.int64),
            "out_of_range": torch.zeros((), dtype=torch.int64),
        }
        for k in self.topk:
            stats[f"top{k}_correct"] = torch.zeros((), dtype=torch.int64)
        self._seen_classes = self.num_classes
        if self.needs_confusion and self.num_classes is not None:
            stats["confusion"] = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)
        return stats

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        logits, targets = get_tensor_pair(inputs, outputs, self.output_key, self.target_key, who)
        if logits.dim() != targets.dim() + 1 or logits.shape[:-1] != targets.shape:
            raise ValueError(
                f"{who}: logits of shape {tuple(logits.shape)} do not match targets of shape "
                f"{tuple(targets.shape)}; expected logits (N, C) with targets (N,), "
                "or (N, ..., C) with (N, ...)"
            )
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise TypeError(f"{who}: targets must be integer class indices, got dtype {targets.dtype}")
        num_classes = logits.shape[-1]
        if self._seen_classes is None:
            self._seen_classes = num_classes
        elif num_classes != self._seen_classes:
            expected = (
                f"num_classes is {self.num_classes}"
                if self.num_classes is not None
                else f"earlier batches had {self._seen_classes}"
            )
            raise ValueError(f"{who}: logits have {num_classes} classes but {expected}")
        if self.topk and self.topk[-1] > num_classes:
            k = self.topk[-1]
            raise ValueError(
                f"{who}: top{k}_accuracy needs at least {k} classes, the logits have {num_classes}"
            )

        logits = logits.detach().reshape(-1, num_classes)
        # Logits may be on the host while the batch is on an accelerator (a
        # model that returns CPU outputs); the targets are read right away, so
        # that copy must block. to_device decides by the destination.
        targets = to_device(targets, logits.device).reshape(-1).long()
        in_range = (targets >= 0) & (targets < num_classes)
        if self.ignore_index is not None:
            counted = targets != self.ignore_index
            self.update("out_of_range", (counted & ~in_range).sum())
            counted = counted & in_range
        else:
            self.update("out_of_range", (~in_range).sum())
            counted = in_range

        predictions = logits.argmax(dim=-1)
        self.update("total", counted.sum())
        self.update("correct", ((predictions == targets) & counted).sum())
        if self.topk:
            best = logits.topk(self.topk[-1], dim=-1).indices
            for k in self.topk:
                hit = (best[:, :k] == targets[:, None]).any(dim=-1)
                self.update(f"top{k}_correct", (hit & counted).sum())
        if self.needs_confusion:
            if "confusion" not in self._stats:
                self._stats["confusion"] = torch.zeros(num_classes, num_classes, dtype=torch.int64)
            confusion = self.accumulator("confusion", logits.device)
            # Clamping keeps uncounted targets' indices valid; their weight is 0.
            cells = targets.clamp(0, num_classes - 1) * num_classes + predictions
            confusion.view(-1).index_add_(0, cells, counted.long())

    def evaluate(self) -> Results:
        if self.needs_confusion and self.num_classes is None:
            self._agree_on_num_classes()
        return super().evaluate()

    def _agree_on_num_classes(self) -> None:
        """Makes every rank hold a confusion matrix of the size read from the
        logits, also a rank that saw no batch. Only needed without
        ``num_classes``; every rank takes part in the (tiny) gather."""
        who = type(self).__name__
        seen = sorted({c for c in comm.all_gather(self._seen_classes) if c is not None})
        if not seen:
            raise ValueError(f"{who}: no batch was processed; is the data loader empty?")
        if len(seen) > 1:
            raise ValueError(f"{who}: ranks saw logits with different numbers of classes: {seen}")
        if "confusion" not in self._stats:
            self._seen_classes = seen[0]
            self._stats["confusion"] = torch.zeros(seen[0], seen[0], dtype=torch.int64)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        who = type(self).__name__
        bad = int(stats["out_of_range"])
        if bad:
            raise ValueError(
                f"{who}: {bad} targets are outside [0, {self._seen_classes}) "
                f"(the logits have {self._seen_classes} classes)"
                + (f" and are not ignore_index={self.ignore_index}" if self.ignore_index is not None else "")
            )
        total = int(stats["total"])
        if total == 0:
            raise ValueError(
                f"{who}: no targets were counted; is the data loader empty, or every target ignore_index?"
            )
        results: Results = {}
        per_class = _per_class_scores(stats["confusion"], self.average) if self.needs_confusion else {}
        for name in self.metrics:
            if name == "accuracy":
                results[name] = stats["correct"].double() / total
            elif name in _NEEDS_CONFUSION:
                results[name] = per_class[name]
            else:
                k = int(_TOPK.fullmatch(name).group(1))  # type: ignore[union-attr]
                results[name] = stats[f"top{k}_correct"].double() / total
        return results


def _check_metrics(metrics: Sequence[str]) -> List[str]:
    names = metric_names(metrics)
    valid = ["accuracy", "top{k}_accuracy", *_NEEDS_CONFUSION]
    for name in names:
        if name not in ("accuracy", *_NEEDS_CONFUSION) and not _TOPK.fullmatch(name):
            raise ValueError(f"ClassificationEvaluator cannot compute {name!r}; it computes {valid} (k >= 1)")
    if not names:
        raise ValueError(f"ClassificationEvaluator needs at least one metric of {valid}")
    return names


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    # zero_division=0: a ratio with an empty denominator counts as 0.
    return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))


def _per_class_scores(confusion: torch.Tensor, average: str) -> Dict[str, torch.Tensor]:
    cm = confusion.double()
    tp = cm.diagonal()
    predicted = cm.sum(dim=0)
    support = cm.sum(dim=1)
    if average == "micro":
        score = tp.sum() / support.sum()
        return {"precision": score, "recall": score, "f1": score}
    precision = _safe_div(tp, predicted)
    recall = _safe_div(tp, support)
    f1 = _safe_div(2 * tp, support + predicted)
    if average == "macro":
        weights = ((support + predicted) > 0).double()
    else:
        weights = support
    weights = weights / weights.sum()
    return {
        "precision": (precision * weights).sum(),
        "recall": (recall * weights).sum(),
        "f1": (f1 * weights).sum(),
    }
