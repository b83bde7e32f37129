"""Metrics by name: grouping, options, errors, custom metrics."""

import pytest
import torch
import torch.nn.functional as F

from treadle.evaluation import (
    ClassificationEvaluator,
    DatasetEvaluator,
    DatasetEvaluators,
    LossEvaluator,
    PerplexityEvaluator,
    RegressionEvaluator,
    StatisticsEvaluator,
    available_metrics,
    build_evaluator,
    register_metric,
    unregister_metric,
)

BUILTIN = ["accuracy", "cer", "f1", "loss", "mae", "mse", "perplexity", "precision", "recall", "seqeval", "top{k}_accuracy", "wer"]


@pytest.fixture
def cleanup():
    """Names registered by a test, removed afterwards."""
    names = []
    yield names
    for name in names:
        if name in available_metrics():
            unregister_metric(name)


def test_builtin_names():
    assert available_metrics() == BUILTIN


def test_metrics_of_one_evaluator_are_grouped_into_one_pass():
    ev = build_evaluator(["f1", "accuracy", "top5_accuracy"], num_classes=10)
    assert isinstance(ev, ClassificationEvaluator)
    assert ev.metrics == ["f1", "accuracy", "top5_accuracy"]
    assert ev.topk == [5] and ev.num_classes == 10


def test_metrics_of_several_evaluators_and_option_routing():
    ev = build_evaluator(["accuracy", "mse", "loss", "perplexity"], loss_fn=F.mse_loss, ignore_index=7)
    assert isinstance(ev, DatasetEvaluators)
    kinds = [type(e) for e in ev.evaluators]
    assert kinds == [ClassificationEvaluator, RegressionEvaluator, LossEvaluator, PerplexityEvaluator]
    classification, _, loss, perplexity = ev.evaluators
    assert classification.ignore_index == 7 and perplexity.ignore_index == 7
    assert loss.loss_fn is F.mse_loss


def test_single_name_string():
    ev = build_evaluator("wer")
    ev.process((None, ["a b"]), ["a c"])
    assert ev.evaluate() == {"wer": 0.5}


def test_unknown_metric_lists_all_valid_names():
    with pytest.raises(KeyError, match="unknown metric 'acuracy'; valid metrics: " + ", ".join(BUILTIN).replace("{", r"\{").replace("}", r"\}")):
        build_evaluator(["acuracy"])
    with pytest.raises(KeyError, match="unknown metric 'top0_accuracy'"):
        build_evaluator(["top0_accuracy"])


def test_option_no_selected_metric_uses_is_an_error():
    with pytest.raises(TypeError, match=r"option\(s\) \['num_clases'\] are not used by the evaluators of metrics \['accuracy'\]; they accept \['average', 'ignore_index', 'num_classes', 'output_key', 'target_key'\]"):
        build_evaluator(["accuracy"], num_clases=3)
    with pytest.raises(TypeError, match=r"option\(s\) \['loss_fn'\] are not used"):
        build_evaluator(["mse"], loss_fn=F.mse_loss)


def test_repeated_and_empty_metric_lists():
    with pytest.raises(ValueError, match="metric 'f1' is listed twice"):
        build_evaluator(["f1", "accuracy", "f1"])
    with pytest.raises(ValueError, match="needs at least one metric; valid metrics: accuracy, cer"):
        build_evaluator([])


def test_custom_metric_with_decorator(cleanup):
    @register_metric("max_error")
    class MaxError(StatisticsEvaluator):
        def __init__(self, *, scale: float = 1.0):
            self.scale = scale
            super().__init__()

        def init_statistics(self):
            return {"max": torch.zeros((), dtype=torch.float64)}

        def process(self, inputs, outputs):
            acc = self.accumulator("max", outputs.device)
            torch.maximum(acc, (outputs - inputs[1]).abs().max().to(acc.dtype), out=acc)

        def compute(self, stats):
            return {"max_error": stats["max"] * self.scale}

    cleanup.append("max_error")
    assert "max_error" in available_metrics()
    ev = build_evaluator(["max_error", "mae"], scale=10.0)
    assert [type(e) for e in ev.evaluators] == [MaxError, RegressionEvaluator]
    ev.reset()
    ev.process((None, torch.tensor([0.0, 0.0])), torch.tensor([0.5, -2.0]))
    assert ev.evaluate() == {"max_error": 20.0, "mae": 1.25}


def test_custom_metric_family_with_placeholder_and_function_factory(cleanup):
    class Fixed(DatasetEvaluator):
        def __init__(self, metrics):
            self.metrics = metrics

        def process(self, inputs, outputs):
            pass

        def evaluate(self):
            return {m: float(m.split("@")[1]) for m in self.metrics}

    def make(metrics):
        return Fixed(metrics)

    register_metric("recall@{k}", make)
    cleanup.append("recall@{k}")
    ev = build_evaluator(["recall@10", "recall@1"])
    assert ev.evaluate() == {"recall@10": 10.0, "recall@1": 1.0}


def test_registration_errors(cleanup):
    with pytest.raises(ValueError, match=r"metric 'accuracy' is already registered \(to ClassificationEvaluator\); pass override=True"):
        register_metric("accuracy", lambda: None)
    with pytest.raises(ValueError, match="invalid metric name 'my metric'"):
        register_metric("my metric", lambda: None)
    with pytest.raises(TypeError, match="the factory for metric 'x' must be callable"):
        register_metric("x", 3)
    with pytest.raises(KeyError, match="metric 'nope' is not registered"):
        unregister_metric("nope")


def test_missing_required_option_is_named(cleanup):
    class NeedsThreshold(DatasetEvaluator):
        def __init__(self, threshold):
            self.threshold = threshold

        def process(self, inputs, outputs):
            pass

        def evaluate(self):
            return {"above": self.threshold}

    register_metric("above", NeedsThreshold)
    cleanup.append("above")
    with pytest.raises(TypeError, match=r"metric\(s\) \['above'\] need option\(s\) \['threshold'\]"):
        build_evaluator(["above"])
    assert build_evaluator(["above"], threshold=0.5).evaluate() == {"above": 0.5}


def test_override_replaces(cleanup):
    class Zero(DatasetEvaluator):
        def process(self, inputs, outputs):
            pass

        def evaluate(self):
            return {"zero": 0.0}

    class One(Zero):
        def evaluate(self):
            return {"zero": 1.0}

    register_metric("zero", Zero)
    cleanup.append("zero")
    register_metric("zero", One, override=True)
    assert build_evaluator("zero").evaluate() == {"zero": 1.0}
