"""Edit distance, CER and WER on hand-computed cases."""

import pytest
import torch

from treadle.evaluation import SequenceEvaluator, edit_distance


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("kitten", "sitting", 3),  # k->s, e->i, +g
        ("", "abc", 3),
        ("abc", "", 3),
        ("", "", 0),
        ("flaw", "lawn", 2),
        (["the", "cat"], ["the", "black", "cat"], 1),
    ],
)
def test_edit_distance(a, b, expected):
    assert edit_distance(a, b) == expected
    assert edit_distance(b, a) == expected


def test_cer_and_wer_are_totals_over_totals():
    # Hypothesis -> reference:
    #   "abd" -> "abc":     CER 1 edit / 3 chars, WER 1 edit / 1 word
    #   "hello" -> "hallo": CER 1 / 5,            WER 1 / 1
    #   "a b c" -> "a bc":  CER 1 / 4 (a space),  WER 2 / 2 ([a b c] -> [a bc])
    # Totals: CER 3 / 12, WER 4 / 4.
    ev = SequenceEvaluator(["wer", "cer"])
    ev.process((None, ["abc", "hallo"]), ["abd", "hello"])
    ev.process((None, ["a bc"]), ["a b c"])
    assert ev.evaluate() == {"wer": 4 / 4, "cer": 3 / 12}


def test_wer_splits_on_runs_of_whitespace():
    # Reference 4 words; hypothesis drops "down" and has extra spaces: 1/4.
    ev = SequenceEvaluator(["wer"])
    ev.process({"labels": ["the cat sat down"]}, ["the  cat\tsat "])
    assert ev.evaluate() == {"wer": 0.25}


def test_decode_turns_outputs_and_targets_into_strings():
    vocab = "_abc"

    def ids_to_text(ids):
        return ["".join(vocab[i] for i in row if i != 0) for row in ids.tolist()]

    ev = SequenceEvaluator(["cer"], decode=lambda logits: ids_to_text(logits.argmax(-1)), decode_targets=ids_to_text)
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 0], [3, 3, 3]]), 4).float()
    targets = torch.tensor([[1, 2, 3], [3, 3, 0]])  # "abc" (hyp "ab": 1 edit), "cc" (hyp "ccc": 1 edit)
    ev.process((None, targets), {"logits": logits})
    assert ev.evaluate() == {"cer": 2 / 5}


def test_errors():
    ev = SequenceEvaluator()
    with pytest.raises(TypeError, match="predictions must be a list of strings, got a single str 'abc'"):
        ev.process((None, ["abc"]), "abc")
    with pytest.raises(TypeError, match=r"predictions are a tensor; pass decode="):
        ev.process((None, ["abc"]), torch.zeros(1, 3))
    with pytest.raises(TypeError, match=r"targets\[1\] is a int, not a str; pass decode_targets="):
        ev.process((None, ["a", 2]), ["a", "b"])
    with pytest.raises(ValueError, match="2 predictions for 1 targets in a batch"):
        ev.process((None, ["a"]), ["a", "b"])
    with pytest.raises(ValueError, match=r"cannot compute \['bleu'\]; it computes \['cer', 'wer'\]"):
        SequenceEvaluator(["bleu"])
    with pytest.raises(ValueError, match="cer is undefined: the references hold no characters"):
        SequenceEvaluator(["cer"]).evaluate()
    empty = SequenceEvaluator(["wer"])
    empty.process((None, ["   "]), ["x"])
    with pytest.raises(ValueError, match="wer is undefined: the references hold no words"):
        empty.evaluate()
