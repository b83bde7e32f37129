"""The configs that ship inside the package: get_config, model_zoo, and
train_net's --config-file lookup from any directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import treadle
from treadle import model_zoo
from treadle.config import ConfigError, get_config, get_config_file, shipped_configs
from treadle.tools.train_net import cli

PACKAGE = Path(treadle.__file__).resolve().parent


def test_shipped_configs_are_inside_the_package():
    names = shipped_configs()
    assert {"digits_mlp.py", "charlm_transformer.py", "common/train.py", "common/optim.py"} <= set(names)
    for name in names:
        path = Path(get_config_file(name))
        assert path.is_file() and PACKAGE in path.parents, path


def test_get_config_returns_the_config_a_file_defines():
    train = get_config("common/train.py").train
    assert train.max_iter > 0 and "checkpointer" in train
    job = get_config("digits_mlp.py")
    assert {"model", "optimizer", "dataloader", "train"} <= set(job.keys())
    # A checkout's path and detectron2's module name work too.
    assert get_config_file("configs/digits_mlp.py") == get_config_file("digits_mlp.py")
    assert model_zoo.get_config("digits_mlp.py").train.max_iter == job.train.max_iter


def test_unknown_config_suggests_the_closest_shipped_name():
    with pytest.raises(ConfigError, match=r"No shipped config named 'digit_mlp.py'; did you mean 'digits_mlp.py'"):
        get_config("digit_mlp.py")
    with pytest.raises(ConfigError, match=r"No shipped config named 'charlm.py'; did you mean 'common/data/charlm.py'\?"):
        get_config("charlm.py")
    # A name close to none: the list, and no unrelated guess (every name
    # ending in ".py" made 'nope.py' look like 'common/optim.py').
    with pytest.raises(ConfigError, match=r"No shipped config named 'nope.py'; shipped configs: "):
        get_config("nope.py")
    with pytest.raises(ConfigError, match=r"'Digits_MLP.py'; did you mean 'digits_mlp.py'"):
        get_config("Digits_MLP.py")


def test_trained_weights_are_refused_with_a_reason():
    with pytest.raises(ConfigError, match="ships no trained weights"):
        model_zoo.get_config("digits_mlp.py", trained=True)


def test_train_net_finds_a_shipped_config_from_another_directory(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = cli(["--config-file", "configs/digits_mlp.py", f"train.output_dir={out}", "train.max_iter=4",
                "train.eval_period=0", "train.log_period=2"])
    assert code == 0, capfd.readouterr().err
    assert (out / "model_final.pth").is_file()


def test_train_net_missing_config_is_one_line_with_a_suggestion(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code = cli(["--config-file", "configs/digits_mpl.py", f"train.output_dir={tmp_path / 'run'}"])
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert "Config file not found: 'configs/digits_mpl.py'" in err[0] and "'digits_mlp.py'" in err[0]
    assert os.listdir(tmp_path) == []
