"""The "seqeval" metric: seqeval's entity-level scores of token classification."""

import sys

import pytest
import torch

from treadle.evaluation import build_evaluator, inference_on_dataset

seqeval_metrics = pytest.importorskip("seqeval.metrics")

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def _ids(rows, width):
    """Tag rows as label ids, padded with -100 to ``width``."""
    return torch.tensor([[TAGS.index(t) for t in row] + [-100] * (width - len(row)) for row in rows])


# seqeval's README example, and a sentence with an I- tag after O (a chunk of its own for seqeval).
Y_TRUE = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"], ["I-LOC", "O", "B-PER"]]
Y_PRED = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"], ["I-LOC", "O", "B-LOC"]]


def _expected():
    return {
        "precision": seqeval_metrics.precision_score(Y_TRUE, Y_PRED),
        "recall": seqeval_metrics.recall_score(Y_TRUE, Y_PRED),
        "f1": seqeval_metrics.f1_score(Y_TRUE, Y_PRED),
        "accuracy": seqeval_metrics.accuracy_score(Y_TRUE, Y_PRED),
    }


def test_seqeval_equals_seqevals_own_functions_with_padding_ignored():
    targets = _ids(Y_TRUE, 8)
    # Logits whose argmax is the predicted tag; a padded position predicts anything.
    logits = torch.nn.functional.one_hot(_ids(Y_PRED, 8).clamp(min=0), len(TAGS)).float()
    logits[0, 7] = torch.arange(len(TAGS)).float()  # padding: ignored whatever it predicts
    evaluator = build_evaluator("seqeval", id2label=dict(enumerate(TAGS)))
    # Two batches: the counts add up to the dataset's.
    results = inference_on_dataset(torch.nn.Identity(), [(logits[:2], targets[:2]), (logits[2:], targets[2:])],
                                   evaluator)
    assert results["seqeval"] == pytest.approx(_expected(), rel=1e-12)
    assert _expected()["precision"] not in (0.0, 1.0)  # a case that tells the counts apart


def test_seqeval_options_are_checked_in_one_line():
    with pytest.raises(TypeError, match=r"metric\(s\) \['seqeval'\] need option\(s\) \['id2label'\]"):
        build_evaluator("seqeval")
    with pytest.raises(ValueError, match=r"^seqeval: label 0 is 'LABEL_0', not an IOB tag"):
        build_evaluator(("seqeval", {"id2label": {0: "LABEL_0", 1: "LABEL_1"}}))


def _tiny_token_classifier():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)},
    )
    torch.manual_seed(0)
    return transformers.BertForTokenClassification(config)


def _token_batches(n=4, length=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(1, 30, (2, length), generator=g)
        labels = torch.randint(0, len(TAGS), (2, length), generator=g)
        labels[:, 0] = labels[:, -1] = -100  # [CLS] and [SEP]: no label, as a tokenizer's word_ids leave them
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    # Ready batches, read once per epoch: a list given as it is would be a dataset of samples.
    return torch.utils.data.DataLoader(batches, batch_size=None)


def test_a_trainer_evaluates_seqeval_with_the_models_own_labels(tmp_path):
    """Hezar's ``metrics=["seqeval"]``: no labels given, the model's config.id2label."""
    from treadle.trainer import Trainer

    model = _tiny_token_classifier()
    train, val = _token_batches(), _token_batches(2, seed=1)
    trainer = Trainer(model, "adamw", train, lr=1e-3, eval_loader=val, metrics=["seqeval", "loss"], max_iter=2,
                      device="cpu", progress_bar=False)
    history = trainer.train()
    assert {"seqeval/f1", "seqeval/precision", "seqeval/recall", "seqeval/accuracy"} <= set(history.iterations)
    results = trainer.evaluate()
    # seqeval's functions on the same predictions.
    model.eval()
    y_true, y_pred = [], []
    with torch.no_grad():
        for batch in val:
            predicted = model(**batch).logits.argmax(-1)
            for p_row, t_row in zip(predicted.tolist(), batch["labels"].tolist()):
                y_true.append([TAGS[t] for t in t_row if t != -100])
                y_pred.append([TAGS[p] for p, t in zip(p_row, t_row) if t != -100])
    expected = {
        "precision": seqeval_metrics.precision_score(y_true, y_pred, zero_division=0),
        "recall": seqeval_metrics.recall_score(y_true, y_pred, zero_division=0),
        "f1": seqeval_metrics.f1_score(y_true, y_pred, zero_division=0),
        "accuracy": seqeval_metrics.accuracy_score(y_true, y_pred),
    }
    assert results["seqeval"] == pytest.approx(expected, rel=1e-12)


def test_without_the_seqeval_package_the_trainer_says_what_to_install(monkeypatch):
    from treadle.trainer import Trainer

    for name in [m for m in sys.modules if m == "seqeval" or m.startswith("seqeval.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "seqeval", None)
    with pytest.raises(ImportError, match=r'^metric "seqeval" needs the seqeval package: pip install seqeval'):
        Trainer(_tiny_token_classifier(), "adamw", _token_batches(), lr=1e-3, eval_loader=_token_batches(1),
                metrics=["seqeval"], max_iter=1, device="cpu", progress_bar=False)
