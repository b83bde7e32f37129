"""DatasetEvaluator contract and DatasetEvaluators merging."""

from typing import List

import pytest

from treadle.evaluation import DatasetEvaluator, DatasetEvaluators


class _Fixed(DatasetEvaluator):
    """Counts the batches it sees and reports fixed results."""

    def __init__(self, results):
        self.results = results
        self.seen: List = []
        self.resets = 0

    def reset(self):
        self.resets += 1
        self.seen = []

    def process(self, inputs, outputs):
        self.seen.append((inputs, outputs))

    def evaluate(self):
        return self.results


def test_evaluators_see_every_batch_and_results_merge():
    a, b = _Fixed({"accuracy": 0.5}), _Fixed({"mse": 2.0, "per_class": {"cat": 1.0}})
    both = DatasetEvaluators([a, b])
    both.reset()
    both.process("x1", "y1")
    both.process("x2", "y2")
    assert a.resets == b.resets == 1
    assert a.seen == b.seen == [("x1", "y1"), ("x2", "y2")]
    assert both.evaluate() == {"accuracy": 0.5, "mse": 2.0, "per_class": {"cat": 1.0}}
    assert len(both) == 2 and both.evaluators == [a, b]


def test_duplicate_key_names_the_key_and_both_evaluators():
    class Other(_Fixed):
        pass

    both = DatasetEvaluators([_Fixed({"accuracy": 0.5}), _Fixed({"f1": 0.1}), Other({"accuracy": 0.7})])
    with pytest.raises(ValueError, match=r"'accuracy' is produced by both _Fixed \(evaluator #0\) and Other \(evaluator #2\)"):
        both.evaluate()


def test_none_results_are_skipped_but_every_evaluator_runs():
    calls = []

    class Recording(_Fixed):
        def evaluate(self):
            calls.append(self.results)
            return self.results

    both = DatasetEvaluators([Recording(None), Recording({"f1": 0.25})])
    assert both.evaluate() == {"f1": 0.25}
    assert calls == [None, {"f1": 0.25}]


def test_non_dict_result_is_an_error_naming_the_evaluator():
    with pytest.raises(TypeError, match=r"_Fixed \(evaluator #0\)\.evaluate\(\) returned list"):
        DatasetEvaluators([_Fixed([1.0])]).evaluate()


def test_non_evaluator_item_is_rejected():
    with pytest.raises(TypeError, match=r"item #1 \(int\) is not an evaluator: it lacks reset\(\), process\(\), evaluate\(\)"):
        DatasetEvaluators([_Fixed({}), 3])


def test_base_class_requires_process_and_evaluate():
    class Incomplete(DatasetEvaluator):
        def process(self, inputs, outputs):
            pass

    with pytest.raises(TypeError, match="evaluate"):
        Incomplete()


def test_empty_container_gives_empty_results():
    assert DatasetEvaluators([]).evaluate() == {}
