"""treadle.config as a whole: its public names and the load -> override -> instantiate path."""

from pathlib import Path

import torch

import treadle.config as config
from treadle.config import ConfigError, LazyConfig, instantiate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


def test_public_names_are_reexported():
    assert sorted(config.__all__) == [
        "ConfigError",
        "L",
        "LazyCall",
        "LazyConfig",
        "Override",
        "apply_overrides",
        "get_config",
        "get_config_file",
        "import_path",
        "instantiate",
        "locate",
        "parse_override",
        "parse_value",
        "shipped_configs",
    ]
    for name in config.__all__:
        assert getattr(config, name) is not None
    assert issubclass(ConfigError, ValueError)


def test_config_error_messages_are_one_line():
    assert str(ConfigError("first\n  second\n\nthird")) == "first; second; third"


def test_load_override_instantiate_train_one_step(tmp_path):
    cfg = LazyConfig.load(str(FIXTURES / "mlp.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            "optimizer.lr=0.5",
            "model.modules.0.out_features=6",
            "model.modules.2.in_features=6",
            f"train.output_dir={tmp_path}",
            "+train.note='from the command line'",
        ],
    )
    model = instantiate(cfg.model)
    cfg.optimizer.params = list(model.parameters())
    optimizer = instantiate(cfg.optimizer)
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == 0.5
    assert all(a is b for a, b in zip(optimizer.param_groups[0]["params"], model.parameters()))
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.ones(2, 4)
    for layer in model:
        x = layer(x)
    x.sum().backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert cfg.log_dir == f"{tmp_path}/logs"
    assert cfg.train.note == "from the command line"
    scheduler = instantiate(cfg.lr_multiplier)
    assert scheduler(0.3) == 1.0

    # The run's config can be saved next to its outputs and read back.
    cfg.optimizer.params = None  # tensors are not config
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    again = LazyConfig.load(str(tmp_path / "config.yaml"))
    assert again.optimizer.lr == 0.5 and again.optimizer._target_ == "torch.optim.SGD"
    assert again.train.note == "from the command line"

