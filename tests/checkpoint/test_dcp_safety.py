"""DCP checkpoint directories are read without running code from them."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from treadle.checkpoint import UnsafeCheckpointError
from treadle.checkpoint.dcp_safety import load_dcp


def trained():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def save(directory, extra=None):
    model, optimizer = trained()
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    state["extra"] = extra if extra is not None else {"iteration": 7, "rng": torch.get_rng_state()}
    dcp.save(state, checkpoint_id=str(directory))
    return model, optimizer


def load(directory):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    state = {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
        "extra": {"iteration": 0, "rng": torch.zeros_like(torch.get_rng_state())},
    }
    load_dcp(state, str(directory))
    return state


def test_a_dcp_checkpoint_loads_through_the_safe_reader(tmp_path):
    model, optimizer = save(tmp_path / "ckpt")
    state = load(tmp_path / "ckpt")
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"][key], value), key
    saved_opt = get_optimizer_state_dict(model, optimizer)
    for key, value in saved_opt["state"]["0.weight"].items():
        assert torch.equal(state["optimizer"]["state"]["0.weight"][key], value)
    assert state["extra"]["iteration"] == 7


class _RunsCode:
    def __reduce__(self):
        return (exec, ("open(__import__('os').environ['TREADLE_PWNED'], 'w').write('pwned')",))


def test_metadata_that_would_run_code_is_refused(tmp_path, monkeypatch):
    save(tmp_path / "ckpt")
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("TREADLE_PWNED", str(pwned))
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(UnsafeCheckpointError, match=r"refers to builtins\.exec"):
        load(tmp_path / "ckpt")
    assert not pwned.exists()


def test_an_item_that_would_run_code_is_refused(tmp_path, monkeypatch):
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("TREADLE_PWNED", str(pwned))
    directory = tmp_path / "ckpt"
    dcp.save({"extra": {"payload": _RunsCode()}}, checkpoint_id=str(directory))
    assert not pwned.exists()
    state = {"extra": {"payload": None}}
    with pytest.raises(UnsafeCheckpointError, match="extra.payload"):
        load_dcp(state, str(directory))
    assert not pwned.exists()
    # DCP's own reader would have run it: the refusal is what protects the user.
    dcp.load({"extra": {"payload": None}}, checkpoint_id=str(directory))
    assert pwned.read_text() == "pwned"
