"""Perplexity on hand-computed cases."""

import math

import pytest
import torch

from treadle.evaluation import PerplexityEvaluator

# Logits are log-probabilities (1/2, 1/4, 1/8, 1/8): the cross-entropy of token
# id i is -log p_i = (i + 1) log 2 for i < 3. float64, so that the
# comparisons can be tight (float32 logits are tested separately).
LOGP = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64).log()


def _logits(n, t):
    return LOGP.expand(n, t, 4).clone()


def test_token_weighted_mean_with_ignore_index():
    # Batch 1 counts tokens 0, 1 (the -100 is padding); batch 2 counts token 2.
    # Mean NLL = (1 + 2 + 3) log 2 / 3 = 2 log 2 -> perplexity 4.
    ev = PerplexityEvaluator()
    ev.process((None, torch.tensor([[0, 1, -100]])), _logits(1, 3))
    ev.process({"labels": torch.tensor([[2]])}, {"logits": _logits(1, 1)})
    assert ev.evaluate()["perplexity"] == pytest.approx(4.0, rel=1e-12)


def test_not_a_mean_of_batch_perplexities():
    # Batch 1: three tokens of id 0 (NLL log 2 each); batch 2: one token of id 2 (3 log 2).
    # exp((3 log 2 + 3 log 2) / 4) = 2 ** 1.5; the mean of batch values would be (2 + 8) / 2.
    ev = PerplexityEvaluator()
    ev.process((None, torch.tensor([[0, 0, 0]])), _logits(1, 3))
    ev.process((None, torch.tensor([[2]])), _logits(1, 1))
    assert ev.evaluate()["perplexity"] == pytest.approx(2**1.5, rel=1e-12)


def test_shift_labels_scores_the_next_token():
    # labels == input_ids = [9, 1, 2]: positions 0, 1 predict tokens 1, 2 -> (2 + 3) / 2 log 2.
    ev = PerplexityEvaluator(shift_labels=True)
    logits = torch.cat([_logits(1, 3), torch.full((1, 3, 6), -math.inf, dtype=torch.float64)], dim=-1)  # V = 10
    ev.process((None, torch.tensor([[9, 1, 2]])), logits)
    assert ev.evaluate()["perplexity"] == pytest.approx(2**2.5, rel=1e-12)


def test_half_precision_logits_are_scored_in_float32():
    # Logits (1, 0, 0, 0) are exact in bfloat16; target 0 has NLL log(e + 3) - 1.
    # Computed in bfloat16 the result would be off in the third digit.
    ev = PerplexityEvaluator()
    logits = torch.tensor([[[1.0, 0.0, 0.0, 0.0]] * 5], dtype=torch.bfloat16)
    ev.process((None, torch.zeros(1, 5, dtype=torch.long)), logits)
    assert ev.evaluate()["perplexity"] == pytest.approx((math.e + 3) / math.e, rel=1e-6)


def test_custom_ignore_index():
    ev = PerplexityEvaluator(ignore_index=3)
    ev.process((None, torch.tensor([[1, 3]])), _logits(1, 2))
    assert ev.evaluate()["perplexity"] == pytest.approx(4.0, rel=1e-12)


def test_errors():
    ev = PerplexityEvaluator()
    with pytest.raises(ValueError, match=r"expected logits \(N, T, V\) and targets \(N, T\), got \(1, 3, 4\) and \(1, 2\)"):
        ev.process((None, torch.zeros(1, 2, dtype=torch.long)), _logits(1, 3))
    ev.process((None, torch.tensor([[0, 4, -5]])), _logits(1, 3))
    with pytest.raises(ValueError, match=r"2 target token ids are outside \[0, 4\) and are not ignore_index=-100"):
        ev.evaluate()
    only_padding = PerplexityEvaluator()
    only_padding.process((None, torch.tensor([[-100]])), _logits(1, 1))
    with pytest.raises(ValueError, match="no tokens were counted"):
        only_padding.evaluate()
    with pytest.raises(TypeError, match="ignore_index must be an int, got None"):
        PerplexityEvaluator(ignore_index=None)


def test_process_never_reads_values_on_the_host():
    ev = PerplexityEvaluator()
    ev.process((None, torch.zeros(2, 3, dtype=torch.long, device="meta")), torch.zeros(2, 3, 5, device="meta"))
    assert {v.device.type for v in ev.statistics.values()} == {"meta"}
