"""Matching weights across wrappers and heads (treadle/checkpoint/key_matching.py, weights.py)."""

import logging

import pytest
import torch
from torch import nn

from treadle.checkpoint import (
    Checkpointer,
    canonical_keys,
    init_weights_from,
    unwrap_model,
)
from tests.checkpoint.helpers import Net, assert_same_weights, messages, trained


# ---------------------------------------------------------------- model key matching
def test_canonical_keys():
    assert canonical_keys(["module._orig_mod.a.weight", "module._orig_mod.b"]) == {
        "a.weight": "module._orig_mod.a.weight",
        "b": "module._orig_mod.b",
    }
    # A compiled submodule inside, and a lone child called "module" that must stay.
    assert canonical_keys(["backbone._orig_mod.conv.weight", "module.x", "y"]) == {
        "backbone.conv.weight": "backbone._orig_mod.conv.weight",
        "module.x": "module.x",
        "y": "y",
    }
    with pytest.raises(ValueError, match="'a' and '_orig_mod.a' are the same parameter"):
        canonical_keys(["a", "_orig_mod.a"])


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."])
def test_load_accepts_wrapper_prefixed_state_dicts(tmp_path, prefix):
    source, _ = trained(3)
    state = {prefix + k: v for k, v in source.state_dict().items()}
    torch.save({"model": state, "iteration": 4}, tmp_path / "wrapped.pth")
    target = Net()
    extra = Checkpointer(target, str(tmp_path)).load(str(tmp_path / "wrapped.pth"))
    assert extra == {"iteration": 4}
    assert_same_weights(target, source)


def test_load_into_wrapped_model(tmp_path):
    source, _ = trained(3)
    torch.save({"model": source.state_dict()}, tmp_path / "plain.pth")
    inner = Net()
    wrapped = torch.compile(nn.DataParallel(inner))
    Checkpointer(wrapped, str(tmp_path)).load(str(tmp_path / "plain.pth"))
    assert_same_weights(inner, source)


def test_shape_mismatch_is_skipped_and_tabulated(tmp_path, treadle_caplog):
    source, _ = trained(0, num_classes=10)
    source.extra = nn.Linear(1, 1)  # in the checkpoint, not in the target: unexpected
    torch.save({"model": source.state_dict()}, tmp_path / "ten.pth")
    target = Net(num_classes=5)
    target.neck = nn.Linear(4, 4)  # in the target, not in the checkpoint: missing
    head_before = target.head.weight.clone()

    Checkpointer(target, str(tmp_path)).load(str(tmp_path / "ten.pth"))

    for k, v in source.backbone.state_dict().items():
        assert torch.equal(target.backbone.state_dict()[k], v), k
    assert torch.equal(target.head.weight, head_before)
    (message,) = [m for m in messages(treadle_caplog, logging.WARNING) if "were not loaded" in m]
    rows = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
        for line in message.splitlines()
        if line.startswith("| ") and "status" not in line
    }
    assert rows == {
        "head.weight": ["shape mismatch", "head.weight", "(10, 4)", "(5, 4)"],
        "head.bias": ["shape mismatch", "head.bias", "(10,)", "(5,)"],
        "neck.weight": ["missing", "neck.weight", "-", "(4, 4)"],
        "neck.bias": ["missing", "neck.bias", "-", "(4,)"],
        "extra.weight": ["unexpected", "extra.weight", "(1, 1)", "-"],
        "extra.bias": ["unexpected", "extra.bias", "(1,)", "-"],
    }  # loaded keys are not listed on load, only what went wrong


def test_init_weights_from_backbone_into_new_head(tmp_path, treadle_caplog):
    pretrained, _ = trained(0, num_classes=1000)
    Checkpointer(pretrained, str(tmp_path)).save("pretrained")
    model = torch.compile(Net(num_classes=7))

    report = init_weights_from(model, str(tmp_path / "pretrained.pth"))

    backbone_keys = sorted(pretrained.backbone.state_dict())
    assert sorted(report.loaded) == ["backbone." + k for k in backbone_keys]
    assert [(m.key, m.checkpoint_shape, m.model_shape) for m in report.shape_mismatched] == [
        ("head.weight", (1000, 4), (7, 4)),
        ("head.bias", (1000,), (7,)),
    ]
    assert report.missing == [] and report.unexpected == [] and not report.complete
    assert torch.equal(unwrap_model(model).backbone[0].weight, pretrained.backbone[0].weight)
    (message,) = [m for m in messages(treadle_caplog) if "Initialized" in m]
    assert "Initialized 7 of 9 model keys" in message
    assert "| loaded         | backbone.0.{bias, weight}" in message
    assert "| shape mismatch | head.weight" in message and "(1000, 4)" in message


def test_init_weights_from_bare_backbone_with_prefix_map():
    torch.manual_seed(1)
    backbone = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))
    model = Net()
    report = init_weights_from(model, backbone.state_dict(), prefix_map={"": "backbone."})
    assert report.missing == ["head.weight", "head.bias"]
    assert report.unexpected == []
    assert torch.equal(model.backbone[1].running_var, backbone[1].running_var)
    with pytest.raises(TypeError, match="a file path or a state dict"):
        init_weights_from(model, 3)
