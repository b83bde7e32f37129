"""StatisticsEvaluator: tensor accumulation and the single-process reduction."""

import pytest
import torch

from treadle.evaluation import StatisticsEvaluator, all_reduce_statistics, float_accumulator_dtype


class _MeanEvaluator(StatisticsEvaluator):
    """Mean of every value seen, plus a histogram of integer values 0..2."""

    def init_statistics(self):
        return {
            "sum": torch.zeros((), dtype=torch.float64),
            "count": torch.zeros((), dtype=torch.int64),
            "histogram": torch.zeros(3, dtype=torch.int64),
        }

    def process(self, inputs, outputs):
        self.update("sum", outputs.sum())
        self.update("count", outputs.numel(), device=outputs.device)
        self.accumulator("histogram", outputs.device).index_add_(
            0, outputs.long(), torch.ones_like(outputs, dtype=torch.int64)
        )

    def compute(self, stats):
        return {"mean": stats["sum"] / stats["count"], "hist": {str(i): v for i, v in enumerate(stats["histogram"])}}


def test_statistics_accumulate_and_resolve_to_floats():
    ev = _MeanEvaluator()
    ev.process(None, torch.tensor([0.0, 1.0, 2.0]))
    ev.process(None, torch.tensor([2.0]))
    result = ev.evaluate()
    assert result == {"mean": 1.25, "hist": {"0": 1.0, "1": 1.0, "2": 2.0}}
    assert type(result["mean"]) is float


def test_reset_forgets_previous_pass():
    ev = _MeanEvaluator()
    ev.process(None, torch.tensor([2.0, 2.0]))
    ev.reset()
    ev.process(None, torch.tensor([1.0]))
    assert ev.evaluate()["mean"] == 1.0


def test_accumulators_follow_the_device_of_the_data():
    # A meta tensor has no data: if process() read a value on the host it would raise.
    ev = _MeanEvaluator()
    ev.process(None, torch.zeros(4, device="meta"))
    assert {k: v.device.type for k, v in ev.statistics.items()} == {"sum": "meta", "count": "meta", "histogram": "meta"}
    assert ev.statistics["sum"].dtype == torch.float64


def test_unknown_statistic_is_an_error_listing_the_declared_ones():
    ev = _MeanEvaluator()
    with pytest.raises(KeyError, match=r"_MeanEvaluator has no statistic 'total'; declared: \['count', 'histogram', 'sum'\]"):
        ev.update("total", torch.tensor(1))


def test_all_reduce_statistics_keeps_shapes_and_dtypes_without_process_group():
    stats = {
        "b": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64),
        "a": torch.tensor(0.1, dtype=torch.float64),
        "c": torch.tensor(2**52 + 1, dtype=torch.int64),
    }
    out = all_reduce_statistics(stats)
    assert sorted(out) == ["a", "b", "c"]
    assert out["b"].dtype == torch.int64 and out["b"].tolist() == [[1, 2], [3, 4]]
    assert out["a"].dtype == torch.float64 and out["a"].item() == 0.1
    assert out["c"].item() == 2**52 + 1
    assert all_reduce_statistics({}) == {}


def test_float_accumulator_dtype():
    assert float_accumulator_dtype(torch.device("cpu")) == torch.float64
    assert float_accumulator_dtype(torch.device("mps")) == torch.float32


def test_non_scalar_metric_is_rejected():
    class Bad(_MeanEvaluator):
        def compute(self, stats):
            return {"hist": stats["histogram"]}

    ev = Bad()
    ev.process(None, torch.tensor([1.0]))
    with pytest.raises(TypeError, match=r"a metric must be a scalar, got a tensor of shape \(3,\)"):
        ev.evaluate()
