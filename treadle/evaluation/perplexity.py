"""Perplexity of a language model over a dataset."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from .batch import get_tensor_pair
from .evaluator import metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator, float_accumulator_dtype

__all__ = ["PerplexityEvaluator"]


@register_metric("perplexity", higher_is_better=False)
class PerplexityEvaluator(StatisticsEvaluator):
    """``perplexity``: ``exp`` of the mean cross-entropy per counted token.

    Logits ``(N, T, V)`` and targets ``(N, T)``; targets equal to
    ``ignore_index`` (default -100, PyTorch's and Hugging Face's padding label)
    are not counted. The mean is over tokens of the whole dataset, not over
    batches or sequences, so long sequences weigh what they hold.

    ``shift_labels=True`` scores position ``t`` of the logits against target
    ``t + 1``, for causal language models that are given ``labels ==
    input_ids`` (as Hugging Face's do internally). ``None`` (the default)
    shifts when the model's output says it is a causal language model's (a
    Hugging Face ``CausalLMOutput...``): the perplexity is then ``exp`` of the
    loss the model itself computes, token-weighted over the dataset. Cross-entropy is computed in
    float32 at least and summed in float64. A target outside ``[0, V)`` that is
    not ``ignore_index`` is an error at ``evaluate()``.
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("perplexity",),
        *,
        ignore_index: int = -100,
        shift_labels: Optional[bool] = None,
        output_key: str = "logits",
        target_key: str = "labels",
    ) -> None:
        names = metric_names(metrics)
        if names != ["perplexity"]:
            raise ValueError(f"PerplexityEvaluator computes only ['perplexity'], got {names}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = ignore_index
        self.shift_labels = shift_labels
        self.output_key = output_key
        self.target_key = target_key
        self._vocab_size = 0
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        return {
            "nll_sum": torch.zeros((), dtype=torch.float64),
            "tokens": torch.zeros((), dtype=torch.int64),
            "out_of_range": torch.zeros((), dtype=torch.int64),
        }

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        logits, targets = get_tensor_pair(inputs, outputs, self.output_key, self.target_key, who)
        if logits.dim() != 3 or targets.dim() != 2 or logits.shape[:2] != targets.shape:
            raise ValueError(
                f"{who}: expected logits (N, T, V) and targets (N, T), got "
                f"{tuple(logits.shape)} and {tuple(targets.shape)}"
            )
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise TypeError(f"{who}: targets must be integer token ids, got dtype {targets.dtype}")
        logits = logits.detach()
        targets = targets.to(logits.device).long()
        shift = self.shift_labels
        if shift is None:
            shift = type(outputs).__name__.startswith("CausalLMOutput")
        if shift:
            logits = logits[:, :-1]
            targets = targets[:, 1:]
        vocab = logits.shape[-1]
        self._vocab_size = vocab
        targets = targets.reshape(-1)
        counted = targets != self.ignore_index
        in_range = (targets >= 0) & (targets < vocab)
        self.update("out_of_range", (counted & ~in_range).sum())
        counted = counted & in_range
        # Out-of-range ids are zero-weighted, then reported at evaluate(): a
        # check here would need a host sync every batch. Every uncounted
        # position gets cross_entropy's own ignore_index, which zeroes its
        # loss; no counted id is negative, so -100 cannot collide with one.
        safe_targets = targets.masked_fill(~counted, -100)
        compute_dtype = torch.promote_types(logits.dtype, torch.float32)
        nll = F.cross_entropy(
            logits.reshape(-1, vocab).to(compute_dtype), safe_targets, ignore_index=-100, reduction="none"
        )
        self.update("nll_sum", nll.sum(dtype=float_accumulator_dtype(nll.device)))
        self.update("tokens", counted.sum())

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        who = type(self).__name__
        bad = int(stats["out_of_range"])
        if bad:
            raise ValueError(
                f"{who}: {bad} target token ids are outside [0, {self._vocab_size}) "
                f"and are not ignore_index={self.ignore_index}"
            )
        tokens = int(stats["tokens"])
        if tokens == 0:
            raise ValueError(
                f"{who}: no tokens were counted; is the data loader empty, or every "
                f"target ignore_index={self.ignore_index}?"
            )
        return {"perplexity": torch.exp(stats["nll_sum"] / tokens)}
