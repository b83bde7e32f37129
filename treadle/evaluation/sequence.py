"""Character and word error rates of predicted strings against references."""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence

import torch

from .batch import get_predictions, get_targets
from .evaluator import checked_metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator

__all__ = ["edit_distance", "SequenceEvaluator"]

_METRICS = ("cer", "wer")

Decoder = Callable[[Any], Sequence[str]]


def edit_distance(hypothesis: Sequence[Hashable], reference: Sequence[Hashable]) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions
    (each costing 1) turning ``hypothesis`` into ``reference``.

    Works on any sequences of comparable items: strings (characters) or lists
    of words. O(len(a) * len(b)) time, O(min(len(a), len(b))) memory.
    """
    a, b = hypothesis, reference
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(
                min(
                    previous[j] + 1,  # deletion
                    current[j - 1] + 1,  # insertion
                    previous[j - 1] + (x != y),  # substitution or match
                )
            )
        previous = current
    return previous[-1]


def _as_strings(value: Any, what: str, who: str, hint: str) -> List[str]:
    # A lone string would iterate as characters and silently score nonsense.
    if isinstance(value, str):
        raise TypeError(f"{who}: {what} must be a list of strings, got a single str {value!r}")
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{who}: {what} are a tensor; {hint}")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(
            f"{who}: {what} must be a list of strings, got {type(value).__name__}; {hint}"
        ) from None
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise TypeError(f"{who}: {what}[{i}] is a {type(s).__name__}, not a str; {hint}")
    return items


@register_metric(list(_METRICS), higher_is_better=False)
class SequenceEvaluator(StatisticsEvaluator):
    """``cer`` and ``wer``: total edit distance over total reference length.

    CER compares characters of the raw strings (spaces and case included); WER
    compares words, split on runs of whitespace (``str.split()``). Summing
    distances and lengths over the dataset before dividing weights each
    string by its length, as jiwer does, rather than averaging per-string
    rates. Normalize text (case, punctuation) in ``decode`` if wanted.

    Predictions are the model outputs (or ``outputs[output_key]`` of a dict),
    targets the batch's targets; both must be lists of strings, or become so
    through ``decode(predictions)`` and ``decode_targets(targets)`` (e.g. token
    ids to text).
    Strings live on the host, so the statistics are CPU int64 tensors.
    """

    def __init__(
        self,
        metrics: Sequence[str] = _METRICS,
        *,
        decode: Optional[Decoder] = None,
        decode_targets: Optional[Decoder] = None,
        output_key: str = "logits",
        target_key: str = "labels",
    ) -> None:
        names = checked_metric_names("SequenceEvaluator", metrics, _METRICS)
        for label, fn in (("decode", decode), ("decode_targets", decode_targets)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be callable, got {fn!r}")
        self.metrics = names
        self.decode = decode
        self.decode_targets = decode_targets
        self.output_key = output_key
        self.target_key = target_key
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        stats = {}
        for unit in ("char", "word"):
            stats[f"{unit}_edits"] = torch.zeros((), dtype=torch.int64)
            stats[f"{unit}_reference_length"] = torch.zeros((), dtype=torch.int64)
        return stats

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        raw_predictions = get_predictions(outputs, self.output_key, who)
        raw_targets = get_targets(inputs, self.target_key, who)
        if self.decode is not None:
            raw_predictions = self.decode(raw_predictions)
        if self.decode_targets is not None:
            raw_targets = self.decode_targets(raw_targets)
        predictions = _as_strings(
            raw_predictions, "predictions", who, "pass decode=... to turn outputs into strings"
        )
        references = _as_strings(
            raw_targets, "targets", who, "pass decode_targets=... to turn targets into strings"
        )
        if len(predictions) != len(references):
            raise ValueError(
                f"{who}: {len(predictions)} predictions for {len(references)} targets in a batch"
            )
        char_edits = char_length = word_edits = word_length = 0
        for hypothesis, reference in zip(predictions, references):
            if "cer" in self.metrics:
                char_edits += edit_distance(hypothesis, reference)
                char_length += len(reference)
            if "wer" in self.metrics:
                ref_words = reference.split()
                word_edits += edit_distance(hypothesis.split(), ref_words)
                word_length += len(ref_words)
        self.update("char_edits", char_edits)
        self.update("char_reference_length", char_length)
        self.update("word_edits", word_edits)
        self.update("word_reference_length", word_length)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        results: Results = {}
        for name, unit in (("cer", "char"), ("wer", "word")):
            if name not in self.metrics:
                continue
            length = int(stats[f"{unit}_reference_length"])
            if length == 0:
                raise ValueError(
                    f"{type(self).__name__}: {name} is undefined: the references hold no "
                    f"{'characters' if unit == 'char' else 'words'} (is the data loader empty?)"
                )
            results[name] = stats[f"{unit}_edits"].double() / length
        return {m: results[m] for m in self.metrics}
