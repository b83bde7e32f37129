"""How batches are fed to models, moved to devices and taken apart."""

import dataclasses
from collections import namedtuple

import pytest
import torch

from treadle.evaluation import batch_size, forward_batch, get_predictions, get_targets, move_to_device


def _echo(x):
    return ("called with", x)


def test_pair_feeds_inputs_only():
    x, y = torch.ones(2), torch.zeros(2)
    assert forward_batch(_echo, (x, y)) == ("called with", x)
    assert forward_batch(_echo, [x, y]) == ("called with", x)


def test_dict_and_sample_list_and_tensor_go_whole():
    batch = {"input_ids": torch.ones(2), "labels": torch.zeros(2)}
    assert forward_batch(_echo, batch)[1] is batch
    samples = [{"image": torch.ones(1)}, {"image": torch.zeros(1)}]
    assert forward_batch(_echo, samples)[1] is samples
    t = torch.ones(3)
    assert forward_batch(_echo, t)[1] is t


def test_tuple_of_three_is_rejected_with_the_way_out():
    with pytest.raises(ValueError, match=r"a tuple of 3 items.*pass forward="):
        forward_batch(_echo, (1, 2, 3))


Pair = namedtuple("Pair", ["x", "y"])


class _Movable:
    def __init__(self):
        self.moved_to = None

    def to(self, device):
        self.moved_to = device
        return self


def test_move_to_device_walks_containers():
    obj = _Movable()
    batch = {
        "pair": Pair(torch.ones(1), [torch.zeros(2), "text"]),
        "obj": obj,
        "n": 3,
        "none": None,
    }
    moved = move_to_device(batch, "meta")
    assert moved["pair"].x.device.type == "meta"
    assert isinstance(moved["pair"], Pair)
    assert moved["pair"].y[0].device.type == "meta" and moved["pair"].y[1] == "text"
    assert obj.moved_to == torch.device("meta")
    assert moved["n"] == 3 and moved["none"] is None
    assert batch["pair"].x.device.type == "cpu"  # the input is not modified


@dataclasses.dataclass
class _DataclassBatch:
    images: torch.Tensor
    names: list


def test_move_to_device_moves_a_dataclass_batch():
    # The same walk as training's to_device, which always handled dataclasses.
    batch = _DataclassBatch(torch.ones(2, 3), ["a", "b"])
    moved = move_to_device(batch, "meta")
    assert isinstance(moved, _DataclassBatch)
    assert moved.images.device.type == "meta" and moved.names == ["a", "b"]
    assert batch.images.device.type == "cpu"


def test_get_targets_from_pair_and_dict():
    y = torch.tensor([1, 2])
    assert get_targets((torch.ones(2), y), "labels", "E") is y
    assert get_targets({"x": 1, "labels": y}, "labels", "E") is y


def test_get_targets_missing_key_names_the_keys():
    with pytest.raises(KeyError, match=r"E: the batch has no target key 'labels'; its keys are \['input_ids', 'target'\]"):
        get_targets({"input_ids": 1, "target": 2}, "labels", "E")


def test_get_targets_rejects_unlabelled_batches():
    with pytest.raises(TypeError, match=r"E: cannot find targets in a batch of type Tensor"):
        get_targets(torch.ones(3), "labels", "E")


class _ModelOutput:
    def __init__(self, logits):
        self.logits = logits


def test_get_predictions():
    t = torch.ones(2)
    assert get_predictions(t, "logits", "E") is t
    assert get_predictions({"logits": t, "loss": 0}, "logits", "E") is t
    assert get_predictions(_ModelOutput(t), "logits", "E") is t
    assert get_predictions(["a", "b"], "logits", "E") == ["a", "b"]
    with pytest.raises(KeyError, match=r"E: the model outputs have no key 'logits'; their keys are \['scores'\]"):
        get_predictions({"scores": t}, "logits", "E")


def test_batch_size():
    assert batch_size(torch.zeros(5, 3)) == 5
    assert batch_size(torch.tensor(2.0)) == 1
    assert batch_size((torch.zeros(4, 2), torch.zeros(4))) == 4
    assert batch_size({"mask": None, "ids": torch.zeros(6, 2)}) == 6
    assert batch_size(["a", "b", "c"]) == 3
    assert batch_size([{"a": 1}, {"a": 2}]) == 2
    assert batch_size(object()) is None


def test_forward_batch_whole_gives_a_pair_whole_and_explains_a_predictions_model():
    pair = (torch.ones(2, 3), torch.zeros(2))
    assert forward_batch(_echo, pair, whole=True)[1] is pair
    with pytest.raises(TypeError, match=r"needs a loss_fn"):
        forward_batch(torch.nn.Linear(3, 1), pair, whole=True)


def test_the_forwards_folded_into_forward_batch_warn_and_still_feed():
    import treadle.evaluation as evaluation

    x, y = torch.ones(2, 3), torch.zeros(2)
    with pytest.warns(FutureWarning, match=r"treadle.evaluation.default_forward is folded into forward_batch"):
        assert evaluation.default_forward(_echo, (x, y))[1] is x
    with pytest.warns(FutureWarning, match=r"use forward_batch\(model, batch, whole=True\)"):
        assert evaluation.whole_batch_forward(_echo, (x, y))[1][0] is x
    with pytest.warns(FutureWarning, match=r"whole=loss_fn is None"):
        assert evaluation.forward_for(None)(_echo, (x, y))[1][0] is x
    with pytest.raises(AttributeError, match="no attribute 'forward_everything'"):
        getattr(evaluation, "forward_everything")  # noqa: B009
