"""engine/data_parallel.py: wrapping a model (DDP, FSDP2), a module apart
from launching processes (engine/launch.py), its names still importable
where they were. Its options are checked in test_distributed.py."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from torch import nn

import treadle
from tests.engine.test_import_footprint import _treadle_imports
from treadle.engine import data_parallel

MOVED = ("create_ddp_model", "create_fsdp_model", "wrap_model", "check_optimizer_holds")


def test_the_model_wrappers_are_defined_in_their_module_and_importable_where_they_were():
    launch = importlib.import_module("treadle.engine.launch")  # the module; treadle.engine.launch is the function
    for name in MOVED:
        assert getattr(data_parallel, name).__module__ == "treadle.engine.data_parallel"
        assert getattr(launch, name) is getattr(data_parallel, name)
    from treadle.engine import create_ddp_model
    from treadle.engine.defaults import create_ddp_model as detectron2s_place

    assert create_ddp_model is detectron2s_place is data_parallel.create_ddp_model


def test_wrapping_models_does_not_reach_launching_processes():
    edges = _treadle_imports(os.path.dirname(treadle.__file__))
    assert "treadle.engine.launch" not in edges["treadle.engine.data_parallel"]
    launch = importlib.import_module("treadle.engine.launch")
    assert not set(MOVED) & set(launch.__all__), "launch.py's own names are the processes'"


def test_an_optimizer_that_does_not_hold_the_models_parameters_is_refused():
    model = nn.Linear(2, 2)
    data_parallel.check_optimizer_holds(torch.optim.SGD(model.parameters(), lr=0.1), model)
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError) as error:
        data_parallel.check_optimizer_holds(other, model)
    assert str(error.value) == (
        "with ddp='fsdp' the model's parameters are replaced by shards, so this optimizer (built before) "
        "does not hold them: give the optimizer by name (optimizer='adamw', lr=...)"
    )
