"""LazyConfig.load / save: Python and YAML files, relative imports, round trips, errors."""

import builtins
import logging
import os
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from treadle.config import ConfigError, L, LazyConfig, instantiate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
MLP = str(FIXTURES / "mlp.py")


def error_of(fn, *args, **kwargs) -> str:
    """The message of the ConfigError that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def write(root: Path, name: str, text: str) -> str:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def config_warnings(treadle_caplog):
    """A function giving the messages of the warnings logged so far by treadle.config."""
    return lambda: [
        r.getMessage()
        for r in treadle_caplog.records
        if r.name.startswith("treadle.config") and r.levelno == logging.WARNING
    ]


# ---------------------------------------------------------------------------- load .py


def test_python_config_keeps_config_values_and_drops_tools():
    cfg = LazyConfig.load(MLP)
    assert isinstance(cfg, DictConfig)
    # Imported sibling configs come first (import order), then the file's own names;
    # the module `optim`, the function `helper`, `L` and `_scratch` are dropped.
    assert list(cfg.keys()) == [
        "model",
        "train",
        "optimizer",
        "dataloader",
        "lr_multiplier",
        "name",
        "sizes",
        "log_dir",
    ]
    assert cfg.optimizer._target_ is torch.optim.SGD
    assert cfg.optimizer.lr == 0.05
    assert cfg.train.max_iter == 10
    assert cfg.train.checkpointer.max_to_keep == 3
    assert isinstance(cfg.sizes, ListConfig) and list(cfg.sizes) == [4, 8, 2]
    assert cfg.log_dir == "/tmp/mlp/logs"
    assert cfg.model.modules[1]._target_ == "torch.nn.ReLU"


def test_relative_imports_two_levels_up_and_fresh_execution():
    deep = LazyConfig.load(str(FIXTURES / "nested" / "deep.py"))
    assert list(deep.keys()) == ["train", "model", "optimizer"]
    assert deep.train.max_iter == 7
    assert deep.optimizer._target_ == "torch.optim.AdamW"
    assert list(deep.optimizer.betas) == [0.9, 0.999]
    # mlp.py set max_iter=10 on its own copy: every import re-executes the file.
    assert LazyConfig.load(MLP).train.max_iter == 10
    assert LazyConfig.load(str(FIXTURES / "common" / "train.py")).train.max_iter == 100


def test_from_dot_import_loads_files_and_packages(tmp_path):
    write(
        tmp_path,
        "common/optim.py",
        "from treadle.config import L\nSGD = L('torch.optim.SGD')(lr=0.1)\n",
    )
    write(tmp_path, "common/sub/data.py", "data = dict(batch=4)\n")
    write(tmp_path, "pkg/__init__.py", "shared = dict(a=1)\n")
    main = write(
        tmp_path,
        "main.py",
        "from .common import optim\n"
        "from .common.sub import data as data_module\n"
        "from .pkg import shared\n"
        "from . import common\n"
        "optimizer = optim.SGD\n"
        "batch = data_module.data.batch\n",
    )
    cfg = LazyConfig.load(main)
    assert OmegaConf.to_container(cfg) == {
        "shared": {"a": 1},
        "optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1},
        "batch": 4,
    }


def test_plain_values_and_absolute_imports_in_python_config(tmp_path):
    path = write(
        tmp_path,
        "plain.py",
        "import math\nimport enum\nfrom pathlib import Path\n"
        "pi = math.pi\nflag = True\nnothing = None\nsizes = (1, (2, 3))\nroot = Path('/data')\n"
        "device = object()\nclass Local: pass\n",
    )
    cfg = LazyConfig.load(path)
    assert list(cfg.keys()) == ["pi", "flag", "nothing", "sizes", "root"]
    assert cfg.pi == pytest.approx(3.141592653589793)
    # Tuples are stored as lists, nested ones too.
    assert OmegaConf.to_container(cfg.sizes) == [1, [2, 3]]
    assert cfg.root == Path("/data")


def test_tuples_assigned_into_config_nodes_are_lists_too(tmp_path):
    """A tuple set on a node after it was built (a derived config's habit) is a
    list like any other: one item can be overridden, interpolations stay."""
    path = write(
        tmp_path,
        "derived.py",
        "from types import SimpleNamespace\nfrom treadle.config import LazyCall as L\n"
        "model = L(SimpleNamespace)(width=4)\n"
        "model.sizes = (1, (2, '${model.width}'))\n"
        "layers = [L(SimpleNamespace)(kernel=(3, 3))]\n"
        "layers[0].pad = (1, 1)\n",
    )
    cfg = LazyConfig.load(path)
    assert isinstance(cfg.model.sizes, ListConfig) and isinstance(cfg.model.sizes[1], ListConfig)
    LazyConfig.apply_overrides(cfg, ["model.sizes.0=5", "layers.0.pad.1=2"])
    assert OmegaConf.to_container(cfg.model.sizes, resolve=True) == [5, [2, 4]]
    assert vars(instantiate(cfg.layers[0])) == {"kernel": [3, 3], "pad": [1, 2]}
    assert vars(instantiate(cfg.model)) == {"width": 4, "sizes": [5, [2, 4]]}


def test_load_keys_selects_one_or_several(tmp_path):
    train = LazyConfig.load(MLP, keys="train")
    assert isinstance(train, DictConfig) and train.max_iter == 10
    model, optimizer = LazyConfig.load(MLP, keys=("model", "optimizer"))
    assert model._target_ is torch.nn.ModuleList and optimizer.lr == 0.05
    assert LazyConfig.load(MLP, keys="train.checkpointer.period") == 50
    # A selected value still resolves interpolations against the whole file.
    assert LazyConfig.load(MLP, keys="log_dir") == "/tmp/mlp/logs"
    assert error_of(LazyConfig.load, MLP, keys=("train", "optimzer")) == (
        f"Config key 'optimzer' not found in config file '{MLP}'; did you mean 'optimizer'?"
    )


def test_load_rel_resolves_from_the_calling_file(tmp_path):
    write(tmp_path, "base/train.py", "train = dict(max_iter=3)\n")
    path = write(
        tmp_path,
        "child.py",
        "from treadle.config import LazyConfig\n"
        "train = LazyConfig.load_rel('base/train.py', keys='train')\n",
    )
    assert LazyConfig.load(path).train.max_iter == 3


# ---------------------------------------------------------------------------- load .yaml


def test_yaml_config_loads_with_floats_interpolations_and_objects_allowed():
    cfg = LazyConfig.load(str(FIXTURES / "base.yaml"))
    assert cfg.train.lr == 0.001 and isinstance(cfg.train.lr, float)
    assert cfg.train.answer == "yes"
    assert cfg.train.log_dir == "/tmp/out/logs"
    assert list(cfg.train.tags) == ["a", "b"]
    cfg.model.act = torch.relu  # objects may be assigned after loading
    assert cfg.model.act is torch.relu


def test_yaml_errors_name_file_and_line(tmp_path):
    bad = write(tmp_path, "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n")
    assert error_of(LazyConfig.load, bad) == (
        f"Invalid YAML in config file '{bad}', line 3: did not find expected ',' or ']'"
    )
    dup = write(tmp_path, "dup.yaml", "a: 1\na: 2\n")
    assert error_of(LazyConfig.load, dup) == (
        f"Invalid YAML in config file '{dup}', line 2: found duplicate key a"
    )
    listed = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    assert error_of(LazyConfig.load, listed) == (
        f"Config file '{listed}' must hold a mapping of keys at the top level, not a list"
    )


# ---------------------------------------------------------------------------- file errors


def test_missing_file_and_bad_suffix(tmp_path):
    missing = str(tmp_path / "nope.py")
    assert error_of(LazyConfig.load, missing) == f"Config file not found: '{missing}'"
    assert error_of(LazyConfig.load, str(tmp_path)) == (
        f"Config file '{tmp_path}' is a directory, not a file"
    )
    txt = write(tmp_path, "cfg.txt", "a=1")
    assert error_of(LazyConfig.load, txt) == (
        f"Unsupported config file '{txt}': expected a file ending in one of .py, .yaml, .yml"
    )


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.py", "a = 1\nb = 2\nc = (\nd = 4\n")
    assert error_of(LazyConfig.load, path) == (
        f"Syntax error in config file '{path}', line 3: '(' was never closed"
    )


def test_syntax_error_in_imported_file_names_that_file(tmp_path):
    inner = write(tmp_path, "common/inner.py", "x = 1\n  y = 2\n")
    path = write(tmp_path, "outer.py", "from .common.inner import x\n")
    with pytest.raises(ConfigError) as info:
        LazyConfig.load(path)
    assert str(info.value) == f"Syntax error in config file '{inner}', line 2: unexpected indent"
    # The import chain is kept for tracebacks (exception notes, Python >= 3.11).
    assert getattr(info.value, "__notes__", [f"imported at config file '{path}', line 1"]) == [
        f"imported at config file '{path}', line 1"
    ]


def test_exception_in_config_names_file_and_line(tmp_path):
    path = write(tmp_path, "raises.py", "a = 1\n\nb = undefined_name\n")
    with pytest.raises(ConfigError) as info:
        LazyConfig.load(path)
    assert str(info.value) == (
        f"Error while executing config file '{path}', line 3: "
        "NameError: name 'undefined_name' is not defined"
    )
    assert isinstance(info.value.__cause__, NameError)


def test_import_machinery_is_patched_only_while_loading(tmp_path):
    original = builtins.__import__
    write(tmp_path, "common/train.py", "train = dict(max_iter=1)\n")
    ok = write(
        tmp_path,
        "ok.py",
        "import builtins\nfrom .common.train import train\nhook = builtins.__import__.__name__\n",
    )
    assert LazyConfig.load(ok).hook == "config_import"
    assert builtins.__import__ is original


def test_import_machinery_restored_when_config_raises(tmp_path):
    original = builtins.__import__
    write(tmp_path, "common/train.py", "train = dict(max_iter=1)\n")
    write(tmp_path, "common/bad.py", "x = 1 / 0\n")
    raises = write(
        tmp_path, "raises.py", "from .common.train import train\nraise RuntimeError('boom')\n"
    )
    assert error_of(LazyConfig.load, raises) == (
        f"Error while executing config file '{raises}', line 2: RuntimeError: boom"
    )
    assert builtins.__import__ is original
    nested = write(tmp_path, "nested.py", "from .common.bad import x\n")
    with pytest.raises(ConfigError) as info:
        LazyConfig.load(nested)
    assert str(info.value).endswith("common/bad.py', line 1: ZeroDivisionError: division by zero")
    assert builtins.__import__ is original


def test_concurrent_loads_leave_the_import_machinery_intact():
    original = builtins.__import__
    results = []

    def load_many() -> None:
        for _ in range(5):
            results.append(LazyConfig.load(MLP).train.max_iter)

    threads = [threading.Thread(target=load_many) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [10] * 15
    assert builtins.__import__ is original


def test_relative_import_of_missing_file_or_name(tmp_path):
    write(tmp_path, "common/train.py", "train = dict(max_iter=1)\n")
    nofile = write(tmp_path, "nofile.py", "a = 1\nfrom .common.optim import SGD\n")
    expected = str(tmp_path / "common" / "optim")
    assert error_of(LazyConfig.load, nofile) == (
        f"config file '{nofile}', line 2: 'from .common.optim import ...' found neither "
        f"'{expected}.py' nor a directory '{expected}'"
    )
    noname = write(tmp_path, "noname.py", "from .common.train import trian\n")
    train = tmp_path / "common" / "train.py"
    assert error_of(LazyConfig.load, noname) == (
        f"config file '{noname}', line 1: cannot import name 'trian' from config file "
        f"'{train}' (it defines: train)"
    )


def test_circular_imports_are_reported(tmp_path):
    a = write(tmp_path, "a.py", "from .b import x\ny = 1\n")
    b = write(tmp_path, "b.py", "from .a import y\nx = 1\n")
    with pytest.raises(ConfigError) as info:
        LazyConfig.load(a)
    assert str(info.value) == f"Circular import between config files: {a} -> {b} -> {a}"


# ---------------------------------------------------------------------------- save


def test_round_trip_python_config_through_yaml(tmp_path):
    cfg1 = LazyConfig.load(MLP)
    LazyConfig.save(cfg1, str(tmp_path / "a.yaml"))
    cfg2 = LazyConfig.load(str(tmp_path / "a.yaml"))
    # Callables come back as their import paths; everything else as it was.
    expected = OmegaConf.to_container(cfg1, resolve=False)
    expected["model"]["_target_"] = "torch.nn.ModuleList"
    expected["model"]["modules"][0]["_target_"] = "torch.nn.Linear"
    expected["model"]["modules"][2]["_target_"] = "torch.nn.Linear"
    expected["optimizer"]["_target_"] = "torch.optim.SGD"
    assert OmegaConf.to_container(cfg2, resolve=False) == expected
    assert cfg2.log_dir == "/tmp/mlp/logs"
    # A saved config is a fixed point: load -> save -> load gives an equal config and file.
    LazyConfig.save(cfg2, str(tmp_path / "b.yaml"))
    cfg3 = LazyConfig.load(str(tmp_path / "b.yaml"))
    assert cfg3 == cfg2
    assert (tmp_path / "a.yaml").read_text() == (tmp_path / "b.yaml").read_text()
    # Both build the same model.
    m1, m2 = instantiate(cfg1.model), instantiate(cfg2.model)
    layers = [torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear]
    assert [type(m) for m in m1] == [type(m) for m in m2] == layers
    assert [p.shape for p in m1.parameters()] == [p.shape for p in m2.parameters()]


def test_round_trip_is_exact_for_string_targets(tmp_path):
    cfg = OmegaConf.create(
        {
            "model": L("torch.nn.ModuleDict")(
                modules={
                    "head": L("torch.nn.Linear")(in_features=2, out_features=1),
                    "blocks": [
                        L("torch.nn.Identity")(),
                        {"kind": "plain", "values": [1, [2.5, None]]},
                    ],
                }
            ),
            "train": {"lr": 1e-3, "answer": "yes", "num": "1e-3", "null_str": "null", "on": True},
            "log": "${train.lr}",
            "todo": "???",
            "empty": {},
            "blob": b"\x00\x01",
            "path": Path("/data/x"),
        },
        flags={"allow_objects": True},
    )
    target = str(tmp_path / "deep" / "dir" / "cfg.yaml")
    LazyConfig.save(cfg, target)
    loaded = LazyConfig.load(target)
    assert loaded == cfg
    assert OmegaConf.is_missing(loaded, "todo")
    assert loaded.log == 0.001
    assert loaded.train.num == "1e-3" and loaded.train.answer == "yes"
    assert loaded.path == Path("/data/x")


def test_save_writes_callables_as_import_paths_without_modifying_cfg(tmp_path):
    cfg = OmegaConf.create(
        {
            "model": L(torch.nn.Linear)(in_features=2, out_features=3),
            "norm": torch.nn.BatchNorm1d,
            "act": torch.relu,
        },
        flags={"allow_objects": True},
    )
    LazyConfig.save(cfg, str(tmp_path / "cfg.yaml"))
    loaded = LazyConfig.load(str(tmp_path / "cfg.yaml"))
    assert OmegaConf.to_container(loaded) == {
        "model": {"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3},
        "norm": "torch.nn.BatchNorm1d",
        "act": "torch.relu",
    }
    assert cfg.model._target_ is torch.nn.Linear  # the saved config is untouched
    assert isinstance(instantiate(loaded.model), torch.nn.Linear)


def test_unserializable_values_warn_by_key_and_no_pickle(tmp_path, config_warnings):
    cfg = OmegaConf.create(
        {"model": {"act": lambda x: x, "lr": 0.1}, "layers": [1, object()]},
        flags={"allow_objects": True},
    )
    LazyConfig.save(cfg, str(tmp_path / "cfg.yaml"))
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]  # no .pkl next to it
    warned = config_warnings()
    assert len(warned) == 2
    assert warned[0].startswith("Config key 'model.act' holds function ")
    assert "<lambda>" in warned[0] and "saved as ??? (missing)" in warned[0]
    assert warned[1].startswith("Config key 'layers.1' holds a builtins.object object")
    text = (tmp_path / "cfg.yaml").read_text()
    assert text.startswith("# Not serializable, saved as ??? (missing):\n#   model.act: function ")
    loaded = LazyConfig.load(str(tmp_path / "cfg.yaml"))
    assert OmegaConf.is_missing(loaded.model, "act") and loaded.model.lr == 0.1
    assert OmegaConf.is_missing(loaded.layers, 1)


def test_save_rejects_non_mapping(tmp_path):
    assert error_of(LazyConfig.save, OmegaConf.create([1, 2]), str(tmp_path / "x.yaml")) == (
        "Only a DictConfig or dict can be saved as a config, got ListConfig"
    )
    assert not (tmp_path / "x.yaml").exists()
