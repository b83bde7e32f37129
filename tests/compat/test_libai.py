"""LiBai's names, read through the core's seams once :mod:`treadle.compat` is imported: a step's
constructor written as LiBai's ``EagerTrainer``, and a config's ``graph.enabled``."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import treadle.compat  # noqa: F401  (fills the seams)
from treadle.config import ConfigError, LazyConfig
from treadle.config.top_nodes import TOP_LEVEL_NODES, check_top_level_nodes, step_kind
from treadle.engine import CompiledStep, EagerStep

ROOT = Path(__file__).resolve().parents[2]


def digits(*overrides):
    return LazyConfig.apply_overrides(LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py")), list(overrides))


def make_model():
    return torch.nn.Linear(4, 1)


@pytest.mark.parametrize("step_class", [EagerStep, CompiledStep])
def test_a_fourth_positional_argument_names_grad_accum_steps(step_class):
    """LiBai's EagerTrainer(model, data_loader, optimizer, grad_acc_steps) written for a step got
    Python's "takes 4 positional arguments but 5 were given"."""
    model = make_model()
    with pytest.raises(TypeError) as error:
        step_class(model, [], torch.optim.SGD(model.parameters(), lr=0.1), 4)
    name = step_class.__name__
    assert str(error.value) == (
        f"{name}(model, data_loader, optimizer, *, ...) takes 3 positional arguments and 4 were given: the rest are "
        f"keyword-only (LiBai's EagerTrainer(model, data_loader, optimizer, grad_acc_steps) is {name}(model, "
        "data_loader, optimizer, grad_accum_steps=4))"
    )


def test_the_nodes_a_job_reads_are_one_list():
    assert list(TOP_LEVEL_NODES) == ["model", "optimizer", "lr_multiplier", "dataloader", "train", "graph"]


def test_libai_graph_enabled_selects_the_compiled_step():
    assert step_kind(digits()) == "eager"
    cfg = digits()
    cfg.graph = {"enabled": True}  # LiBai's config.py, as its seed writes it
    assert step_kind(cfg) == "compiled"
    cfg.train.step.kind = "compiled"
    assert step_kind(cfg) == "compiled"
    cfg.graph.enabled = False
    with pytest.raises(ConfigError, match=r"graph.enabled=False .* train.step.kind='compiled'"):
        step_kind(cfg)
    cfg.train.step.kind = "eager"
    assert step_kind(cfg) == "eager"


def test_graph_enabled_true_with_train_step_kind_eager_given_is_refused_naming_both_keys():
    """``graph.enabled=True train.step.kind=eager``: the mirror of ``graph.enabled=False train.step.kind=compiled``."""
    cfg = digits("+graph.enabled=true", "train.step.kind=eager")
    assert step_kind(cfg) == "compiled"  # 'eager' is also the default, which graph.enabled overrides
    with pytest.raises(ConfigError) as e:
        step_kind(cfg, kind_given=True)
    assert str(e.value) == (
        "graph.enabled=True asks for the compiled step and train.step.kind='eager' for the eager one: "
        "give train.step.kind only (treadle's key)"
    )
    assert step_kind(digits("+graph.enabled=true", "train.step.kind=compiled"), kind_given=True) == "compiled"
    assert step_kind(digits("+graph.enabled=false", "train.step.kind=eager"), kind_given=True) == "eager"


def test_a_graph_node_of_libais_other_settings_is_refused():
    cfg = digits()
    cfg.graph = {"enabled": True, "debug": -1}
    with pytest.raises(ConfigError, match="^graph.debug is a setting of LiBai's OneFlow graph"):
        step_kind(cfg)
    cfg.graph = {"enabled": "yes"}
    with pytest.raises(ConfigError, match="^graph.enabled must be True or False, got 'yes'"):
        step_kind(cfg)
    own = digits()
    own.train.step = OmegaConf.create({"_target_": "treadle.examples.SAMStep", "rho": 0.05})
    own.graph = {"enabled": True}
    with pytest.raises(ConfigError, match=r"graph.enabled=True .* train.step._target_"):
        step_kind(own)


def test_libais_shipped_graph_node_is_there_and_off():
    """LiBai's ``graph = get_config("common/models/graph.py").graph``, then ``graph.enabled=True``."""
    from treadle.model_zoo import get_config

    cfg = digits()
    cfg.graph = get_config("common/models/graph.py").graph
    check_top_level_nodes(cfg)
    assert step_kind(cfg) == "eager"
    cfg = LazyConfig.apply_overrides(cfg, ["graph.enabled=True"])
    assert step_kind(cfg) == "compiled"
