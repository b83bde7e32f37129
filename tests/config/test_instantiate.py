"""LazyCall, instantiate, locate and import_path."""

import dataclasses
import enum
import sys

import pytest
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from treadle.config import ConfigError, L, LazyCall, import_path, instantiate, locate


def error_of(fn, *args, **kwargs) -> str:
    """The message of the ConfigError that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def make_pair(first, second=0):
    return (first, second)


def raise_value_error(x):
    raise ValueError(f"x must be positive, got {x}")


@dataclasses.dataclass
class Point:
    x: int = 0
    y: int = 0


class Color(enum.Enum):
    RED = 1


# ---------------------------------------------------------------------------- LazyCall


def test_lazy_call_records_target_and_arguments():
    cfg = L(torch.nn.Linear)(in_features=3, out_features=4)
    assert isinstance(cfg, DictConfig)
    assert list(cfg.keys()) == ["_target_", "in_features", "out_features"]
    assert cfg._target_ is torch.nn.Linear
    assert (cfg.in_features, cfg.out_features) == (3, 4)
    assert LazyCall is L
    assert L("torch.nn.Linear")(in_features=1)._target_ == "torch.nn.Linear"


def test_lazy_call_arguments_are_config_nodes_and_tuples_become_lists():
    cfg = L(make_pair)(first=L(make_pair)(first=1), second=(1, (2, 3)))
    assert isinstance(cfg.first, DictConfig)
    assert isinstance(cfg.second, ListConfig)
    assert OmegaConf.to_container(cfg.second) == [1, [2, 3]]


def test_lazy_call_rejects_bad_use():
    assert error_of(L, 3) == (
        "LazyCall target must be a callable or a dotted import path string, got 3 (int)"
    )
    assert error_of(L, "torch..nn") == (
        "LazyCall target 'torch..nn' is not a dotted import path like 'torch.nn.Linear'"
    )
    assert error_of(L(torch.nn.Linear), 3, 4) == (
        "LazyCall(torch.nn.Linear) takes keyword arguments only (a config names every "
        "argument); got 2 positional argument(s)"
    )
    assert error_of(L(torch.nn.Linear), _target_="x") == (
        "LazyCall(torch.nn.Linear) got '_target_' as an argument; the target is set by LazyCall"
    )


def test_lazy_call_stores_dataclass_targets_by_path():
    cfg = L(Point)(x=1)
    assert cfg._target_ == f"{__name__}.Point"
    assert instantiate(cfg) == Point(x=1)

    @dataclasses.dataclass
    class Local:
        a: int = 0

    assert "is a dataclass/attrs class that cannot be imported by name" in error_of(L(Local), a=1)


# ---------------------------------------------------------------------------- instantiate


def test_instantiate_recurses_through_dicts_lists_and_nested_calls():
    cfg = OmegaConf.create(
        {
            "model": L(torch.nn.ModuleList)(
                modules=[L(torch.nn.Linear)(in_features=2, out_features=3), L("torch.nn.ReLU")()]
            ),
            "pairs": [L(make_pair)(first="${width}"), {"plain": L(make_pair)(first=1, second=2)}],
            "width": 7,
        },
        flags={"allow_objects": True},
    )
    built = instantiate(cfg)
    assert type(built) is dict and list(built) == ["model", "pairs", "width"]
    assert [type(m) for m in built["model"]] == [torch.nn.Linear, torch.nn.ReLU]
    assert built["model"][0].weight.shape == (3, 2)
    # Plain containers, interpolations resolved.
    assert built["pairs"] == [(7, 0), {"plain": (1, 2)}]
    assert type(built["pairs"]) is list and type(built["pairs"][1]) is dict


def test_instantiate_passes_objects_through_unchanged():
    tensor = torch.zeros(2)
    cfg = OmegaConf.create(
        {"t": tensor, "call": L(make_pair)(first=tensor)}, flags={"allow_objects": True}
    )
    built = instantiate(cfg)
    assert built["t"] is tensor and built["call"][0] is tensor
    for obj in (tensor, 3, "s", None, torch.Size([1, 2])):
        assert instantiate(obj) is obj
    assert instantiate((1, [L(make_pair)(first=2)])) == (1, [(2, 0)])


def test_instantiate_structured_config_gives_the_dataclass():
    assert instantiate(OmegaConf.structured(Point(x=2))) == Point(x=2, y=0)


def test_unimportable_target_names_target_and_config_path():
    cfg = OmegaConf.create(
        {"model": {"backbone": L("torch.nn.Linaer")(in_features=1)}}, flags={"allow_objects": True}
    )
    expected = (
        "Cannot import _target_ 'torch.nn.Linaer' of config node 'model.backbone': "
        "module 'torch.nn' has no attribute 'Linaer' (did you mean 'Linear'"
    )
    assert error_of(instantiate, cfg).startswith(expected)
    # The path is from the root even when a sub-node is instantiated.
    assert error_of(instantiate, cfg.model).startswith(expected)
    assert error_of(instantiate, {"_target_": "no_such_pkg.Thing"}) == (
        "Cannot import _target_ 'no_such_pkg.Thing' of config node <root>: "
        "no module named 'no_such_pkg'"
    )


def test_wrong_argument_names_node_target_and_message():
    bad_head = L(torch.nn.Linear)(in_feature=3, out_features=2)
    cfg = OmegaConf.create(
        {"model": {"heads": [L(torch.nn.Identity)(), bad_head]}}, flags={"allow_objects": True}
    )
    with pytest.raises(ConfigError) as info:
        instantiate(cfg)
    assert str(info.value) == (
        "Cannot instantiate config node 'model.heads.1' (_target_ torch.nn.Linear): "
        "Linear.__init__() got an unexpected keyword argument 'in_feature'; "
        "did you mean 'in_features' instead of 'in_feature'?"
    )
    assert isinstance(info.value.__cause__, TypeError)
    assert error_of(instantiate, L(make_pair)()) == (
        f"Cannot instantiate config node <root> (_target_ {__name__}.make_pair): "
        "make_pair() missing 1 required positional argument: 'first'; "
        "its arguments are: first, second"
    )


def test_type_error_inside_the_target_is_reported_as_such():
    message = error_of(instantiate, L(torch.nn.Linear)(in_features="a", out_features=2))
    assert message.startswith("Cannot instantiate config node <root> (_target_ torch.nn.Linear): ")
    assert message.endswith(" (raised inside the call; the arguments match its signature)")


def test_other_exceptions_keep_their_type_and_gain_a_note():
    cfg = OmegaConf.create({"a": [L(raise_value_error)(x=-1)]}, flags={"allow_objects": True})
    with pytest.raises(ValueError) as info:
        instantiate(cfg)
    assert type(info.value) is ValueError
    assert str(info.value) == "x must be positive, got -1"
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == [
            f"while instantiating config node 'a.0' (_target_ {__name__}.raise_value_error)"
        ]


def test_non_callable_and_invalid_targets():
    assert error_of(instantiate, {"_target_": "math.pi"}) == (
        "_target_ 'math.pi' of config node <root> is a float, not a callable"
    )
    assert error_of(instantiate, OmegaConf.create({"x": {"_target_": 5}}).x) == (
        "_target_ of config node 'x' must be a callable or an import path string, got 5 (int)"
    )


def test_missing_and_broken_values_name_their_path():
    cfg = OmegaConf.create({"model": L("torch.nn.Linear")(in_features="???", out_features=1)})
    assert error_of(instantiate, cfg.model) == (
        "Cannot read config value 'model.in_features': Missing mandatory value: model.in_features"
    )
    cfg = OmegaConf.create({"a": {"b": "${nowhere.x}"}})
    assert error_of(instantiate, cfg) == (
        "Cannot read config value 'a.b': Interpolation key 'nowhere.x' not found"
    )


# ---------------------------------------------------------------------------- locate / import_path


def test_locate_and_import_path_are_inverse():
    assert locate("torch.nn.Linear") is torch.nn.Linear
    assert locate("dict") is dict
    assert locate("torch.nn.functional.relu") is torch.nn.functional.relu
    assert import_path(torch.nn.Linear) == "torch.nn.Linear"  # shortest public path
    assert import_path(torch.relu) == "torch.relu"
    assert import_path(Color.RED) == f"{__name__}.Color.RED"
    assert import_path(lambda x: x) is None
    assert import_path(object()) is None


def test_locate_errors_name_the_path(tmp_path, monkeypatch):
    assert error_of(locate, "torch.nn.Linear.nope").startswith(
        "Cannot locate 'torch.nn.Linear.nope': type 'torch.nn.Linear' has no attribute 'nope'"
    )
    assert error_of(locate, "a..b") == (
        "Cannot locate 'a..b': it is not a dotted import path like 'package.module.name'"
    )
    # A module that exists but fails to import is reported as such, not as missing.
    broken = tmp_path / "treadle_test_broken_mod.py"
    broken.write_text("import treadle_test_missing_dependency\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert error_of(locate, "treadle_test_broken_mod.X") == (
        "Cannot locate 'treadle_test_broken_mod.X': importing module 'treadle_test_broken_mod' "
        "failed: ModuleNotFoundError: No module named 'treadle_test_missing_dependency'"
    )
