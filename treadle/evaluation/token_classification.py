"""``seqeval``: entity-level precision, recall and F1 of token classification
(named entities, chunks), as Hezar's ``metrics=["seqeval"]`` reports them.

Entities are read from IOB tags by the ``seqeval`` package (an optional
extra: ``pip install seqeval``), in its default (CoNLL evaluation script)
mode. Its micro-averaged scores are ratios of counts (matched entities,
predicted entities, true entities, correct tokens, tokens), so each process
sums them over its batches and one all-reduce gives the dataset's: the
results are seqeval's own on the whole dataset, on one process or several.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from .batch import get_predictions, get_targets
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator

__all__ = ["SeqevalEvaluator", "model_id2label"]

_COUNTS = ("matched_entities", "predicted_entities", "true_entities", "correct_tokens", "tokens")
_PREFIXES = ("B-", "I-", "E-", "S-")

Labels = Union[Mapping[Any, str], Sequence[str]]


def _get_entities() -> Any:
    try:
        from seqeval.metrics.sequence_labeling import get_entities
    except ImportError:
        raise ImportError(
            'metric "seqeval" needs the seqeval package: pip install seqeval (or pip install "treadle[seqeval]")'
        ) from None
    return get_entities


def _label_names(id2label: Labels) -> Dict[int, str]:
    """``{id: tag}`` from a mapping (a model config's ``id2label``, whose keys
    may be strings after a JSON round trip) or a list of tags; each tag
    checked to be IOB (``O``, ``B-PER``...), which seqeval reads entities from."""
    if isinstance(id2label, Mapping):
        try:
            names = {int(k): v for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise TypeError(f"seqeval: id2label's keys must be label ids (integers), got {list(id2label)!r}") from None
    elif isinstance(id2label, Sequence) and not isinstance(id2label, str):
        names = dict(enumerate(id2label))
    else:
        raise TypeError(f"seqeval: id2label must be a dict {{id: tag}} or a list of tags, got {id2label!r}")
    if not names:
        raise ValueError("seqeval: id2label is empty; give the tag of each label id")
    for i, name in sorted(names.items()):
        if not isinstance(name, str) or not (name == "O" or name.startswith(_PREFIXES)):
            raise ValueError(
                f"seqeval: label {i} is {name!r}, not an IOB tag ('O', 'B-PER', 'I-PER'...): give "
                "id2label={id: tag} with the tags the entities are read from"
            )
    return names


def model_id2label(model: Any) -> Optional[Dict[Any, str]]:
    """A Hugging Face-style model's ``config.id2label`` (through a DDP
    wrapper's ``module``), or None when it has none."""
    config = getattr(getattr(model, "module", model), "config", None)
    id2label = getattr(config, "id2label", None)
    return dict(id2label) if isinstance(id2label, Mapping) and id2label else None


@register_metric("seqeval", higher_is_better=True)
class SeqevalEvaluator(StatisticsEvaluator):
    """``seqeval``: ``{"seqeval": {"precision", "recall", "f1", "accuracy"}}``,
    entity-level micro precision, recall and F1 and token accuracy, as
    ``seqeval.metrics`` computes them (zero where nothing was predicted or
    nothing is true).

    Predictions are the model's logits (``outputs.logits``, argmax over the
    last dimension) or label ids of the targets' shape; targets are label
    ids ``(batch, tokens)``. Positions whose target is ``ignore_index``
    (-100, Hugging Face's padding and sub-word positions) are left out.

    Args:
        id2label: the tag of each label id: ``{0: "O", 1: "B-PER", ...}`` or a
            list of tags. The plain ``Trainer`` takes the model's
            ``config.id2label`` when the metric is named without one.
    """

    def __init__(
        self,
        id2label: Labels,
        *,
        ignore_index: int = -100,
        output_key: str = "logits",
        target_key: str = "labels",
    ) -> None:
        self.get_entities = _get_entities()
        self.id2label = _label_names(id2label)
        self.ignore_index = ignore_index
        self.output_key = output_key
        self.target_key = target_key
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        return {name: torch.zeros((), dtype=torch.int64) for name in _COUNTS}

    def _tags(self, ids: List[int]) -> List[str]:
        try:
            return [self.id2label[i] for i in ids]
        except KeyError as e:
            raise ValueError(
                f"seqeval: label id {e.args[0]} has no tag in id2label (ids {sorted(self.id2label)})"
            ) from None

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        predictions = get_predictions(outputs, self.output_key, who)
        targets = torch.as_tensor(get_targets(inputs, self.target_key, who))
        predictions = torch.as_tensor(predictions)
        if predictions.is_floating_point() and predictions.dim() == targets.dim() + 1:
            predictions = predictions.argmax(-1)
        if predictions.shape != targets.shape:
            raise ValueError(
                f"{who}: predictions of shape {tuple(predictions.shape)} for targets of shape "
                f"{tuple(targets.shape)}; give logits (batch, tokens, labels) or label ids (batch, tokens)"
            )
        if targets.dim() == 1:
            predictions, targets = predictions[None], targets[None]
        counts = dict.fromkeys(_COUNTS, 0)
        # Tags are strings: the host has them (evaluation only, not the training step).
        for predicted_row, target_row in zip(predictions.tolist(), targets.tolist()):
            kept = [(p, t) for p, t in zip(predicted_row, target_row) if t != self.ignore_index]
            if not kept:
                continue
            predicted = self._tags([p for p, _ in kept])
            true = self._tags([t for _, t in kept])
            predicted_entities = set(self.get_entities(predicted))
            true_entities = set(self.get_entities(true))
            counts["matched_entities"] += len(predicted_entities & true_entities)
            counts["predicted_entities"] += len(predicted_entities)
            counts["true_entities"] += len(true_entities)
            counts["correct_tokens"] += sum(p == t for p, t in zip(predicted, true))
            counts["tokens"] += len(kept)
        for name, value in counts.items():
            self.update(name, value)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        matched, predicted, true, correct, tokens = (int(stats[name]) for name in _COUNTS)
        if tokens == 0:
            raise ValueError(
                f"{type(self).__name__}: seqeval is undefined: no token had a label other than "
                f"ignore_index={self.ignore_index} (is the data loader empty?)"
            )
        precision = matched / predicted if predicted else 0.0
        recall = matched / true if true else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"seqeval": {"precision": precision, "recall": recall, "f1": f1, "accuracy": correct / tokens}}
