"""mse and mae on hand-computed cases."""

import pytest
import torch

from treadle.evaluation import RegressionEvaluator


def test_mse_and_mae_over_batches():
    # Errors 0, 2, 3 and then -1: squared 0 + 4 + 9 + 1 = 14, absolute 0 + 2 + 3 + 1 = 6, over 4 values.
    ev = RegressionEvaluator()
    ev.process((None, torch.tensor([1.0, 0.0, 1.0])), torch.tensor([1.0, 2.0, 4.0]))
    ev.process((None, torch.tensor([5.0])), torch.tensor([4.0]))
    assert ev.evaluate() == {"mse": 14 / 4, "mae": 6 / 4}


def test_column_predictions_against_flat_targets():
    ev = RegressionEvaluator(["mae"])
    ev.process({"labels": torch.tensor([0.0, 0.0])}, {"logits": torch.tensor([[1.0], [-3.0]])})
    assert ev.evaluate() == {"mae": 2.0}


def test_multi_output_regression_averages_every_element():
    ev = RegressionEvaluator(["mse"])
    ev.process((None, torch.zeros(2, 2)), torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    assert ev.evaluate() == {"mse": (1 + 4 + 0 + 1) / 4}


def test_mismatched_shapes_are_not_broadcast():
    ev = RegressionEvaluator()
    with pytest.raises(ValueError, match=r"predictions of shape \(3, 2\) do not match targets of shape \(3,\)"):
        ev.process((None, torch.zeros(3)), torch.zeros(3, 2))


def test_errors():
    with pytest.raises(ValueError, match=r"cannot compute \['rmse'\]; it computes \['mse', 'mae'\]"):
        RegressionEvaluator(["mse", "rmse"])
    with pytest.raises(ValueError, match="no values were processed"):
        RegressionEvaluator().evaluate()
    with pytest.raises(TypeError, match="expected tensors for predictions and targets, got list and Tensor"):
        RegressionEvaluator().process((None, torch.zeros(1)), [0.0])


def test_process_never_reads_values_on_the_host():
    ev = RegressionEvaluator()
    ev.process((None, torch.zeros(4, device="meta")), torch.zeros(4, device="meta"))
    assert {v.device.type for v in ev.statistics.values()} == {"meta"}
