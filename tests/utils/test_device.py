"""to_device: the one walker that moves batches, for training and evaluation."""

import pytest
import torch
from torch import nn

from tests.tiny_models import classification
from treadle.trainer import Trainer
from treadle.evaluation import build_evaluator, inference_on_dataset
from treadle.utils.device import to_device


def _record_to_calls(monkeypatch):
    calls = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        calls.append(kwargs.get("non_blocking"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    return calls


def test_copies_to_the_host_are_blocking(monkeypatch):
    # A non-blocking device-to-host copy may be read before it has landed.
    calls = _record_to_calls(monkeypatch)
    moved = to_device({"x": torch.ones(2), "y": [torch.zeros(1)]}, torch.device("cpu"))
    assert moved["x"].device.type == "cpu"
    assert calls == [False, False]


def test_copies_to_an_accelerator_are_non_blocking_unless_told(monkeypatch):
    # What the training step relies on for overlapping copies with compute.
    calls = _record_to_calls(monkeypatch)
    to_device(torch.ones(2), torch.device("meta"))
    to_device(torch.ones(2), "meta", non_blocking=False)
    assert calls == [True, False]


class _Movable:
    def __init__(self):
        self.moved_to = None

    def to(self, device):
        self.moved_to = device
        return self


def test_other_objects_with_to_are_moved_and_leaves_kept():
    obj = _Movable()
    moved = to_device([obj, "text", b"raw", 3, None], "meta")
    assert moved[0] is obj and obj.moved_to == torch.device("meta")
    assert moved[1:] == ["text", b"raw", 3, None]
    # A class is not an object to move, even if it defines .to.
    assert to_device(_Movable, "meta") is _Movable


def test_cuda_asked_for_without_cuda_is_one_line_at_every_entry_point():
    # The tests run as on a machine without CUDA (conftest): docs/evaluation.md's
    # device="cuda" must say so in one line, not end in torch's assertion.
    expected = "device='cuda' was asked for, but CUDA is not available on this machine"
    batches = [(torch.randn(4, 6), torch.randint(0, 2, (4,)))]
    with pytest.raises(ValueError) as raised:
        inference_on_dataset(nn.Linear(6, 2), batches, build_evaluator(["accuracy"]), device="cuda")
    assert str(raised.value) == expected
    with pytest.raises(ValueError) as raised:
        Trainer(nn.Linear(6, 2), "sgd", classification(), batch_size=4, lr=0.1,
                loss_fn=nn.functional.cross_entropy, max_epochs=1, device="cuda")
    assert str(raised.value) == expected


@pytest.mark.parametrize("device, name", [("mps", "MPS"), ("xpu", "xpu")])
def test_an_unavailable_device_of_any_type_is_one_line_as_cuda_is(device, name, monkeypatch):
    """device="mps" gave torch's own error from model.to() where "cuda" got treadle's line."""
    backend = torch.backends.mps if device == "mps" else torch.xpu
    monkeypatch.setattr(backend, "is_available", lambda: False)
    with pytest.raises(ValueError) as raised:
        Trainer(nn.Linear(6, 2), "sgd", classification(), batch_size=4, lr=0.1,
                loss_fn=nn.functional.cross_entropy, max_epochs=1, device=device)
    assert str(raised.value) == f"device='{device}' was asked for, but {name} is not available on this machine"
