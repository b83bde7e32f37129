"""Classification metrics on hand-computed cases."""

import pytest
import torch

from treadle.evaluation import ClassificationEvaluator

# Predictions (argmax) are [0, 1, 2, 0]; targets [0, 2, 2, 1].
#   class 0: tp 1, predicted 2, support 1 -> P 1/2, R 1,   F1 2*1/(2*1+1+0) = 2/3
#   class 1: tp 0, predicted 1, support 1 -> P 0,   R 0,   F1 0
#   class 2: tp 1, predicted 1, support 2 -> P 1,   R 1/2, F1 2*1/(2*1+0+1) = 2/3
# Top-2 sets: {0,1} {1,2} {2,0} {0,2}: hits for targets 0, 2, 2 but not 1 -> 3/4.
LOGITS = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0], [2.0, 0.0, 1.0]])
TARGETS = torch.tensor([0, 2, 2, 1])
ALL = ["accuracy", "top2_accuracy", "precision", "recall", "f1"]


def _run(metrics, batches, **kwargs):
    ev = ClassificationEvaluator(metrics, **kwargs)
    for logits, targets in batches:
        ev.process((None, targets), logits)
    return ev.evaluate()


def _split(logits, targets, sizes):
    out, start = [], 0
    for n in sizes:
        out.append((logits[start : start + n], targets[start : start + n]))
        start += n
    return out


def test_macro_metrics_exact_values_in_requested_order():
    results = _run(ALL, [(LOGITS, TARGETS)])
    assert list(results) == ALL
    assert results["accuracy"] == 0.5
    assert results["top2_accuracy"] == 0.75
    assert results["precision"] == pytest.approx((0.5 + 0 + 1) / 3, abs=1e-15)
    assert results["recall"] == pytest.approx((1 + 0 + 0.5) / 3, abs=1e-15)
    assert results["f1"] == pytest.approx((2 / 3 + 0 + 2 / 3) / 3, abs=1e-15)


def test_results_do_not_depend_on_batching():
    whole = _run(ALL, [(LOGITS, TARGETS)])
    assert _run(ALL, _split(LOGITS, TARGETS, [1, 3])) == whole
    assert _run(ALL, _split(LOGITS, TARGETS, [1, 1, 1, 1])) == whole


def test_classes_absent_from_targets_and_predictions_are_not_averaged():
    # A fourth class that is never the target nor the argmax: scikit-learn's
    # macro average without labels= leaves it out, and so do we.
    logits = torch.cat([LOGITS, torch.full((4, 1), -9.0)], dim=1)
    results = _run(["precision", "recall", "f1"], [(logits, TARGETS)], num_classes=4)
    assert results == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 4 / 9}, abs=1e-15)


def test_class_with_support_but_no_predictions_scores_zero():
    # Targets [0, 1], both predicted 0: class 1 has no predictions -> P_1 = 0
    # (zero_division=0), R_1 = 0, F1_1 = 0; class 0: P 1/2, R 1, F1 2/3.
    logits = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    results = _run(["precision", "recall", "f1"], [(logits, torch.tensor([0, 1]))])
    assert results == pytest.approx({"precision": 0.25, "recall": 0.5, "f1": 1 / 3}, abs=1e-15)


def test_weighted_and_micro_averages():
    # Supports are [1, 1, 2] out of 4.
    weighted = _run(["precision", "recall", "f1"], [(LOGITS, TARGETS)], average="weighted")
    assert weighted == pytest.approx(
        {"precision": (0.5 + 0 + 2 * 1) / 4, "recall": (1 + 0 + 2 * 0.5) / 4, "f1": (2 / 3 + 0 + 2 * 2 / 3) / 4},
        abs=1e-15,
    )
    micro = _run(["precision", "recall", "f1"], [(LOGITS, TARGETS)], average="micro")
    assert micro == {"precision": 0.5, "recall": 0.5, "f1": 0.5}


def test_ignore_index_and_dict_batches_with_sequence_logits():
    # Token classification: logits (N, T, C), targets (N, T) with -100 padding.
    logits = LOGITS.reshape(2, 2, 3)
    targets = torch.tensor([[0, -100], [2, 1]])  # counted: preds 0, 2, 0 vs 0, 2, 1
    ev = ClassificationEvaluator(["accuracy", "top2_accuracy"], ignore_index=-100)
    ev.process({"input_ids": None, "labels": targets}, {"logits": logits, "loss": None})
    assert ev.evaluate() == {"accuracy": 2 / 3, "top2_accuracy": 2 / 3}


def test_top1_equals_accuracy_and_top_c_is_one():
    results = _run(["top1_accuracy", "top3_accuracy", "accuracy"], [(LOGITS, TARGETS)])
    assert results == {"top1_accuracy": 0.5, "top3_accuracy": 1.0, "accuracy": 0.5}


def test_out_of_range_target_is_reported_at_evaluate():
    ev = ClassificationEvaluator(["accuracy", "f1"])
    ev.process((None, torch.tensor([0, 3, 5, -1])), LOGITS)  # process never syncs to check
    with pytest.raises(ValueError, match=r"3 targets are outside \[0, 3\) \(the logits have 3 classes\)"):
        ev.evaluate()


def test_shape_and_dtype_errors():
    ev = ClassificationEvaluator()
    with pytest.raises(ValueError, match=r"logits of shape \(4, 3\) do not match targets of shape \(3,\)"):
        ev.process((None, torch.tensor([0, 1, 2])), LOGITS)
    with pytest.raises(TypeError, match=r"targets must be integer class indices, got dtype torch.float32"):
        ev.process((None, TARGETS.float()), LOGITS)
    with pytest.raises(ValueError, match=r"logits have 3 classes but num_classes is 5"):
        ClassificationEvaluator(num_classes=5).process((None, TARGETS), LOGITS)
    with pytest.raises(ValueError, match=r"top5_accuracy needs at least 5 classes, the logits have 3"):
        ClassificationEvaluator(["top5_accuracy"]).process((None, TARGETS), LOGITS)


def test_class_count_must_not_change_between_batches():
    ev = ClassificationEvaluator()
    ev.process((None, TARGETS), LOGITS)
    with pytest.raises(ValueError, match="logits have 2 classes but earlier batches had 3"):
        ev.process((None, TARGETS[:2]), LOGITS[:2, :2])


def test_bad_options():
    with pytest.raises(ValueError, match=r"average must be one of \['macro', 'weighted', 'micro'\], got 'binary'"):
        ClassificationEvaluator(average="binary")
    with pytest.raises(ValueError, match=r"cannot compute 'auc'; it computes \['accuracy', 'top\{k\}_accuracy', 'precision', 'recall', 'f1'\]"):
        ClassificationEvaluator(["accuracy", "auc"])
    with pytest.raises(ValueError, match="num_classes must be a positive int or None, got 0"):
        ClassificationEvaluator(num_classes=0)


def test_empty_pass_is_an_error():
    with pytest.raises(ValueError, match="no targets were counted"):
        ClassificationEvaluator(["accuracy"]).evaluate()
    with pytest.raises(ValueError, match="no batch was processed"):
        ClassificationEvaluator(["f1"]).evaluate()


def test_process_never_reads_values_on_the_host():
    # Meta tensors carry no data: any .item()/.cpu() in process() would raise.
    ev = ClassificationEvaluator(ALL, ignore_index=-100)
    ev.process((None, torch.zeros(4, dtype=torch.long, device="meta")), torch.zeros(4, 3, device="meta"))
    assert {v.device.type for v in ev.statistics.values()} == {"meta"}


def test_targets_copied_to_host_logits_are_not_non_blocking(monkeypatch):
    # A model may return CPU logits for a batch on an accelerator; a
    # non-blocking device-to-host copy of the targets could be read before
    # it lands, so the copy towards CPU logits must block.
    non_blocking = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        non_blocking.append(kwargs.get("non_blocking", False))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    ev = ClassificationEvaluator(["accuracy"])
    ev.process((None, TARGETS), LOGITS)
    assert True not in non_blocking
    assert ev.evaluate() == {"accuracy": 0.5}
