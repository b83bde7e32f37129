"""inference_on_dataset: feeding, modes, grad, devices, progress logging."""

import logging
import sys

import pytest
import torch
from torch import nn

from treadle.evaluation import (
    ClassificationEvaluator,
    DatasetEvaluator,
    RegressionEvaluator,
    inference_context,
    inference_on_dataset,
)
from tests.tiny_models import DeepForward, minor_faults


class _Recorder(DatasetEvaluator):
    def __init__(self):
        self.batches = []

    def reset(self):
        self.batches = []

    def process(self, inputs, outputs):
        self.batches.append((inputs, outputs))

    def evaluate(self):
        return {"batches": float(len(self.batches))}


class _Spy(nn.Module):
    """Records the mode and grad state it runs under; raises on request."""

    def __init__(self, fail_at=None):
        super().__init__()
        self.linear = nn.Linear(2, 3)
        self.norm = nn.BatchNorm1d(3)
        self.calls = []
        self.fail_at = fail_at

    def forward(self, x):
        self.calls.append((self.training, self.norm.training, torch.is_grad_enabled()))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise RuntimeError("boom in forward")
        return self.norm(self.linear(x))


@pytest.fixture
def progress_log():
    """Messages of the inference logger (a handler of our own: the treadle
    logger may not propagate to pytest's)."""
    records = []

    class Handler(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("treadle.evaluation.inference")
    handler, old_level = Handler(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield records
    log.removeHandler(handler)
    log.setLevel(old_level)


def _pairs(n, batch=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 2, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(n)]


def test_runs_in_eval_mode_without_grad_and_restores_training():
    model = _Spy().train()
    results = inference_on_dataset(model, _pairs(3), _Recorder())
    assert results == {"batches": 3.0}
    assert model.calls == [(False, False, False)] * 3
    assert model.training and model.norm.training
    assert torch.is_grad_enabled()


def test_mode_restored_after_exception_in_model():
    model = _Spy(fail_at=2).train()
    model.norm.eval()  # a frozen BatchNorm inside a training model stays frozen
    with pytest.raises(RuntimeError, match="boom in forward"):
        inference_on_dataset(model, _pairs(3), _Recorder())
    assert model.training is True
    assert model.linear.training is True
    assert model.norm.training is False
    assert torch.is_grad_enabled()


def test_eval_model_stays_in_eval():
    model = _Spy().eval()
    inference_on_dataset(model, _pairs(1), None)
    assert not model.training and not model.norm.training


def test_inference_context_restores_each_module():
    model = nn.Sequential(nn.Linear(1, 1), nn.Dropout(), nn.BatchNorm1d(1)).train()
    model[2].eval()
    with inference_context(model):
        assert [m.training for m in model.modules()] == [False, False, False, False]
    assert [m.training for m in model.modules()] == [True, True, True, False]


def test_pair_batch_is_fed_as_inputs_and_given_whole_to_the_evaluator():
    data = _pairs(2)
    model = nn.Linear(2, 3)
    rec = _Recorder()
    inference_on_dataset(model, data, rec)
    for (batch, outputs), (x, y) in zip(rec.batches, data):
        assert batch[0] is x and batch[1] is y
        torch.testing.assert_close(outputs, model(x).detach())


def test_dict_batch_is_fed_whole():
    class DictModel(nn.Module):
        def forward(self, batch):
            return {"logits": batch["x"] * 2}

    data = [{"x": torch.tensor([[1.0, 0.0]]), "labels": torch.tensor([0])}]
    ev = ClassificationEvaluator(["accuracy"])
    assert inference_on_dataset(DictModel(), data, ev) == {"accuracy": 1.0}


def test_forward_override_and_device():
    seen = []

    def forward(model, batch):
        seen.append(batch["x"].device.type)
        return torch.zeros(1, device="meta")

    rec = _Recorder()
    inference_on_dataset(nn.Identity(), [{"x": torch.ones(1)}], rec, device="meta", forward=forward)
    assert seen == ["meta"]
    assert rec.batches[0][0]["x"].device.type == "meta"


def test_list_of_evaluators_and_none():
    data = [(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 0.0]))]
    model = nn.Identity()

    def forward(m, batch):
        return m(batch[0])[:, 0]  # predicts [1, 0]: exact

    results = inference_on_dataset(model, data, [RegressionEvaluator(["mae"]), _Recorder()], forward=forward)
    assert results == {"mae": 0.0, "batches": 1.0}
    assert inference_on_dataset(model, data, None, forward=forward) == {}


def test_evaluator_returning_none_gives_empty_dict():
    class Silent(_Recorder):
        def evaluate(self):
            return None

    assert inference_on_dataset(nn.Identity(), [torch.ones(1)], Silent()) == {}


def test_reset_is_called_before_the_pass():
    rec = _Recorder()
    rec.process("stale", "stale")
    inference_on_dataset(nn.Identity(), [torch.ones(1)], rec)
    assert len(rec.batches) == 1


def test_progress_is_logged_with_eta_when_length_is_known(progress_log):
    inference_on_dataset(nn.Identity(), [torch.ones(1)] * 3, None, log_period=0.0)
    progress = [m for m in progress_log if m.startswith("Inference: batch")]
    assert [m.split(".")[0] for m in progress] == ["Inference: batch 1/3", "Inference: batch 2/3", "Inference: batch 3/3"]
    assert all("ETA=" in m for m in progress)
    assert progress_log[0] == "Start inference on 3 batches"
    assert progress_log[-1].startswith("Total inference time: ")
    assert progress_log[-1].endswith("over 3 batches on this process)")


def test_progress_without_length_has_no_eta(progress_log):
    inference_on_dataset(nn.Identity(), (torch.ones(1) for _ in range(2)), None, log_period=0.0)
    progress = [m for m in progress_log if m.startswith("Inference: batch")]
    assert [m.split(".")[0] for m in progress] == ["Inference: batch 1/?", "Inference: batch 2/?"]
    assert not any("ETA" in m for m in progress)
    assert progress_log[0] == "Start inference on an unknown number of batches"


def test_no_progress_lines_within_the_period(progress_log):
    inference_on_dataset(nn.Identity(), [torch.ones(1)] * 3, None, log_period=3600.0)
    assert not any(m.startswith("Inference: batch") for m in progress_log)


def test_results_are_logged(progress_log):
    data = [(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))]
    inference_on_dataset(nn.Identity(), data, ClassificationEvaluator(["accuracy"]))
    assert "Evaluation results:\n| metric   |   value |" in progress_log[-1]
    assert "| accuracy |  1.0000 |" in progress_log[-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="log_period must be >= 0 seconds, got -1"):
        inference_on_dataset(nn.Identity(), [], None, log_period=-1)
    with pytest.raises(TypeError, match="expected a DatasetEvaluator, a list of them or None; got str"):
        inference_on_dataset(nn.Identity(), [], "accuracy")


@pytest.mark.skipif(sys.platform != "linux" or sys.implementation.name != "cpython" or sys.version_info < (3, 11),
                    reason="CPython's frame stack in chunks (3.11+); page faults counted by Linux")
def test_inference_maps_no_frame_stack_chunk_per_batch_however_deep_the_forward_calls():
    model = DeepForward()
    batches = [torch.randn(8, 4) for _ in range(100)]

    def faults(count):
        start = minor_faults()
        inference_on_dataset(model, batches[:count], None)
        return minor_faults() - start

    faults(20)  # warm
    # What 80 more batches cost: a forward 300 frames deep would map a chunk
    # of CPython's frame stack per batch (and fault it in) without the room
    # the loop runs with (treadle.utils.frame_stack).
    assert (faults(100) - faults(20)) / 80 < 0.25
