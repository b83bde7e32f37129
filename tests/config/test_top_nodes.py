"""The top-level nodes a job reads, and the seam through which a layer above the job reads another trainer's node."""

from pathlib import Path

import pytest

from treadle.config import ConfigError, LazyConfig
from treadle.config import other_nodes, top_nodes
from treadle.config.top_nodes import TOP_LEVEL_NODES, check_top_level_nodes, step_kind, step_kind_and_why

ROOT = Path(__file__).resolve().parents[2]


def digits(*overrides):
    return LazyConfig.apply_overrides(LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py")), list(overrides))


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.py")), ids=lambda p: p.stem)
def test_the_shipped_configs_have_no_unread_node(config):
    check_top_level_nodes(LazyConfig.load(str(config)))  # charlm's corpus is interpolated


def test_a_node_read_by_nothing_is_named_and_one_that_is_interpolated_is_not():
    cfg = digits()
    cfg.tokenization = {"vocab": 100}
    with pytest.raises(ConfigError, match="^The config's top-level node 'tokenization' is read by nothing: a job"):
        check_top_level_nodes(cfg)
    cfg.train.max_iter = "${tokenization.vocab}"
    check_top_level_nodes(cfg)
    optim = digits()
    optim.optim = {"lr": 0.1}  # LiBai's name
    with pytest.raises(ConfigError, match="'optim' is read by nothing: did you mean 'optimizer'?"):
        check_top_level_nodes(optim)


@pytest.fixture
def no_registered_nodes(monkeypatch):
    """The config package alone: no layer above registered a node (treadle.compat does, when imported)."""
    monkeypatch.setattr(other_nodes, "OTHER_NODES", {})
    monkeypatch.setattr(top_nodes, "OTHER_NODES", other_nodes.OTHER_NODES)


def test_the_jobs_own_nodes_are_one_list_and_another_trainers_node_is_read_only_where_registered(no_registered_nodes):
    assert list(TOP_LEVEL_NODES) == ["model", "optimizer", "lr_multiplier", "dataloader", "train"]
    cfg = digits("+graph.enabled=true")
    with pytest.raises(ConfigError, match="^The config's top-level node 'graph' is read by nothing: a job reads "
                                          "model, optimizer, lr_multiplier, dataloader, train, and"):
        check_top_level_nodes(cfg)
    assert step_kind(cfg) == "eager"


def test_a_registered_node_is_read_and_chooses_the_step_with_the_line_that_says_why(no_registered_nodes):
    seen = []

    def compiled_when_on(cfg, kind, kind_given):
        seen.append((kind, kind_given))
        return ("compiled", "fast.on=True: compiled") if cfg.fast.on else (kind, None)

    other_nodes.register_node("fast", other_nodes.NodeReader("another trainer's switch", compiled_when_on))
    assert list(TOP_LEVEL_NODES)[-1] == "fast" and TOP_LEVEL_NODES["fast"] == "another trainer's switch"
    cfg = digits("+fast.on=true")
    check_top_level_nodes(cfg)
    assert step_kind_and_why(cfg, kind_given=True) == ("compiled", "fast.on=True: compiled")
    cfg.fast.on = False
    assert step_kind_and_why(cfg) == ("eager", None)
    assert seen == [("eager", False), ("eager", True), ("eager", False)]
