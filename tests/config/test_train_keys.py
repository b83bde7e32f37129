"""The table of ``train`` keys (treadle/config/train_keys.py) that the shipped
config, validation and DefaultTrainer all read."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from treadle.config import ConfigError, LazyConfig, get_config, get_config_file
from treadle.config.rules import anything
from treadle.config.train_keys import (
    KEYS,
    SECTIONS,
    describe,
    train_default,
    train_section,
    train_setting,
    wrapper_options,
)
from treadle.engine.defaults import DefaultTrainer
from treadle.config.validation import check_run_config

ROOT = Path(__file__).resolve().parents[2]
NAMES = [key.name for key in KEYS]


def _leaves(node: Any, prefix: str = "") -> Dict[str, Any]:
    """Every leaf of a DictConfig by its dotted name (a None or a LazyCall is a leaf)."""
    out: Dict[str, Any] = {}
    for name in node.keys():
        value = node[name]
        path = f"{prefix}{name}"
        if isinstance(value, DictConfig) and "_target_" not in value:
            out.update(_leaves(value, path + "."))
        else:
            out[path] = value
    return out


def _without(cfg: DictConfig, key: str) -> DictConfig:
    """A copy of ``cfg`` whose ``train`` lacks ``key`` (dotted below train)."""
    cfg = cfg.copy()
    *parents, last = key.split(".")
    node = cfg.train
    for part in parents:
        node = node[part]
    del node[last]
    return cfg


# ------------------------------------------------------------------ the shipped config
def test_the_shipped_config_has_exactly_the_tables_keys_with_its_defaults():
    shipped = _leaves(get_config("common/train.py").train)
    assert list(shipped) == NAMES
    assert shipped == {key.name: key.default for key in KEYS}
    assert shipped["checkpointer.period"] == 200


def test_the_shipped_config_lists_every_key_with_its_default_and_doc():
    """README: "every key of train is documented in configs/common/train.py"."""
    source = Path(get_config_file("common/train.py")).read_text()
    doc = ast.get_docstring(ast.parse(source), clean=False)
    assert describe() in doc, "run `python -m treadle.config.train_keys` and paste its listing into the docstring"
    for key in KEYS:
        assert f"train.{key.name} = {key.default!r}\n" in doc
    assert "train.checkpointer.period = 200\n    Iterations between periodic checkpoints" in doc


# ------------------------------------------------------------------ code reading a config without a key
def _digits_with_table_defaults() -> DictConfig:
    """digits_mlp.py with the shipped ``train`` (every key at the table's default)."""
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    cfg.train = get_config("common/train.py").train
    # An interpolation is no code reading the config: ${train.max_iter} must not fail once it is removed.
    cfg.lr_multiplier.max_iter = cfg.train.max_iter
    return cfg


_PLAIN = (int, float, str, bool, type(None))


def _settings(obj: Any, depth: int) -> Dict[str, Any]:
    """The plain values an object keeps (a treadle object inside it too, ``depth`` levels down)."""
    out: Dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, _PLAIN):
            out[name] = value
        elif isinstance(value, torch.device):
            out[name] = str(value)
        elif depth and type(value).__module__.startswith("treadle.") and hasattr(value, "__dict__") and not isinstance(
            value, nn.Module
        ):
            out[name] = _settings(value, depth - 1)
    return out


def _built(cfg: DictConfig) -> Dict[str, Any]:
    """What DefaultTrainer made of ``cfg``: the plain settings of the trainer,
    its step, its checkpointer and each hook."""
    trainer = DefaultTrainer(cfg)
    return {
        "trainer": _settings(trainer, 2),
        "device": str(trainer.device),
        "hooks": [(type(h).__name__, _settings(h, 2)) for h in trainer.hooks],
    }


@pytest.fixture(scope="module")
def in_empty_dir(tmp_path_factory):
    # train.output_dir's default is relative: building must not touch the checkout.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("cwd"))
        yield


@pytest.fixture(scope="module")
def built_with_defaults(in_empty_dir):
    return _built(_digits_with_table_defaults())


@pytest.mark.parametrize("key", NAMES + sorted(SECTIONS))
def test_a_config_without_a_key_builds_the_trainer_its_default_builds(key, built_with_defaults, in_empty_dir):
    """No code keeps a fallback of its own: a config without the key (or
    without the whole sub-node) builds what the table's default builds."""
    cfg = _without(_digits_with_table_defaults(), key)
    assert _built(cfg) == built_with_defaults
    assert not os.listdir(".")  # and nothing was written


def test_the_built_settings_follow_the_config(built_with_defaults, in_empty_dir):
    """The comparison above sees the keys: a value other than the default builds another trainer."""
    cfg = _digits_with_table_defaults()
    cfg.train.checkpointer.max_to_keep = 7
    cfg.train.log_period = 9
    built = _built(cfg)
    assert built != built_with_defaults
    hooks = dict(built["hooks"])
    assert hooks["PeriodicCheckpointer"]["max_to_keep"] == 7
    assert hooks["PeriodicCheckpointer"] != dict(built_with_defaults["hooks"])["PeriodicCheckpointer"]
    assert hooks["PeriodicWriter"] != dict(built_with_defaults["hooks"])["PeriodicWriter"]


def test_a_config_without_checkpointer_period_checkpoints_every_200_iterations(tmp_path):
    """It fell back to 5000 in DefaultTrainer while the shipped config said 200."""
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    assert cfg.train.checkpointer.period == 500  # the example's own value, removed below
    cfg = LazyConfig.apply_overrides(
        _without(cfg, "checkpointer.period"),
        [f"train.output_dir={tmp_path}", "train.max_iter=201", "train.eval_period=0", "train.log_period=100"],
    )
    assert train_setting(cfg, "checkpointer.period") == train_default("checkpointer.period") == 200
    DefaultTrainer(cfg).train()
    assert sorted(p.name for p in tmp_path.glob("model_0*.pth")) == ["model_0000199.pth"]
    assert (tmp_path / "model_final.pth").is_file()


# ------------------------------------------------------------------ the accessors
def test_train_setting_reads_the_config_else_the_tables_default():
    cfg = OmegaConf.create({"train": {"checkpointer": {"period": 7, "format": None}, "ema": None}})
    assert train_setting(cfg, "checkpointer.period") == 7
    assert train_setting(cfg, "checkpointer.format") is None  # None is a value
    assert train_setting(cfg, "checkpointer.max_to_keep") == 3
    assert train_setting(cfg, "ema.decay") == 0.999  # a null sub-node means its defaults
    assert train_setting(OmegaConf.create({}), "log_period") == 20
    assert train_setting({"train": {"log_period": 5}}, "log_period") == 5  # plain dicts too
    with pytest.raises(KeyError, match="train.max_iters is not a key of the table"):
        train_setting(cfg, "max_iters")
    with pytest.raises(ConfigError, match="^train.checkpointer must be a config node with keys, got 5$"):
        train_setting(OmegaConf.create({"train": {"checkpointer": 5}}), "checkpointer.period")


def test_train_section_fills_the_defaults_and_keeps_the_configs_own_keys():
    cfg = OmegaConf.create({"train": {"step": {"precision": "bf16", "compile": {"mode": "default"}, "extra": 1}}})
    step = train_section(cfg, "step")
    assert step == {
        "kind": "eager", "precision": "bf16", "grad_accum_steps": 1, "clip_grad_norm": None, "clip_grad_value": None,
        "loss_fn": None,
        "compile": {"mode": "default", "backend": "inductor", "fullgraph": False, "dynamic": None},
        "extra": 1,
    }


def test_the_other_wrappers_options_are_dropped_at_their_defaults_and_refused_otherwise():
    ddp = train_section(OmegaConf.create({}), "ddp")
    assert wrapper_options("ddp", ddp) == {
        "broadcast_buffers": False, "find_unused_parameters": False, "fp16_compression": False,
        "gradient_as_bucket_view": False, "static_graph": False, "bucket_cap_mb": None,
    }
    assert wrapper_options("fsdp", {**ddp, "bucket_size": 25}) == {
        "reshard_after_forward": True, "param_dtype": None, "reduce_dtype": None, "sync_module_states": True,
        "bucket_size": 25,  # not the table's: create_fsdp_model says what it makes of it
    }
    with pytest.raises(ConfigError, match=r"^train.ddp.param_dtype is an option of FSDP; it has no meaning with "
                                          r"train.ddp.kind='ddp'. Set it to None or use kind='fsdp'.$"):
        wrapper_options("ddp", {**ddp, "param_dtype": "bf16"})
    with pytest.raises(ConfigError, match="^train.ddp.static_graph is an option of DistributedDataParallel"):
        wrapper_options("fsdp", {**ddp, "static_graph": True})


def test_wrap_model_refuses_an_fsdp_option_with_ddp_on_one_process():
    cfg = OmegaConf.create({"train": {"ddp": {"kind": "ddp", "reshard_after_forward": False}}})
    model = nn.Linear(2, 2)
    trainer = object.__new__(DefaultTrainer)  # wrap_model reads only its arguments
    with pytest.raises(ValueError, match="train.ddp.reshard_after_forward is an option of FSDP"):
        trainer.wrap_model(cfg, model)
    # detectron2's create_ddp_model(model, **cfg.train.ddp) takes the shipped train.ddp.
    from treadle.engine.defaults import create_ddp_model

    assert create_ddp_model(model, **get_config("common/train.py").train.ddp) is model


# ------------------------------------------------------------------ validation reads the rules
@pytest.mark.parametrize("key", [key.name for key in KEYS if key.rule is not anything])
def test_a_bad_value_is_refused_in_one_line_naming_the_key(key):
    cfg = _digits_with_table_defaults()
    OmegaConf.update(cfg, f"train.{key}", [1, 2], merge=False)
    with pytest.raises(ConfigError) as error:
        check_run_config(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"train.{key}"), message
