"""Override parsing (key=value, YAML-like values) and applying them to configs."""

import dataclasses
import logging
import math
import warnings

import pytest
from omegaconf import OmegaConf

from treadle.config import ConfigError, L, LazyConfig, Override, parse_override, parse_value
from treadle.config._values import SEQUENCE_CONFIGS


@pytest.fixture
def config_warnings(treadle_caplog):
    """A function giving the messages of the warnings logged so far by treadle.config."""
    return lambda: [
        r.getMessage()
        for r in treadle_caplog.records
        if r.name.startswith("treadle.config") and r.levelno == logging.WARNING
    ]


def error_of(fn, *args, **kwargs) -> str:
    """The message of the ConfigError that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def apply(cfg, *overrides):
    return LazyConfig.apply_overrides(cfg, list(overrides))


def base_cfg():
    return OmegaConf.create(
        {
            "a": {"b": 0},
            "name": "x",
            "lr": 0.1,
            "sizes": [0],
            "path": "",
            "flag": False,
            "x": 1,
            "s": "",
            "t": [],
            "d": {"a": 0, "keep": 2},
            "train": {"max_iter": 100, "output_dir": "out", "checkpointer": {"period": 10}},
            "model": L("torch.nn.Linear")(in_features=2, out_features=3),
            "todo": "???",
        },
        flags={"allow_objects": True},
    )


# ---------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1", 1),
        ("-3", -3),
        ("+7", 7),
        ("1_000", 1000),
        ("010", 10),
        ("0.5", 0.5),
        ("1e-3", 0.001),
        ("1E5", 100000.0),
        (".5", 0.5),
        ("2.", 2.0),
        ("-inf", -math.inf),
        ("true", True),
        ("False", False),
        ("TRUE", True),
        ("None", None),
        ("null", None),
        ("~", None),
        ("", ""),
        ("foo", "foo"),
        ("yes", "yes"),
        ("none", "none"),
        ("1.2.3", "1.2.3"),
        ("e5", "e5"),
        ("0x10", "0x10"),
        ("a=b", "a=b"),
        ("http://host:80/x", "http://host:80/x"),
        ("${train.output_dir}/x", "${train.output_dir}/x"),
        ("'quoted str'", "quoted str"),
        ('"a, b"', "a, b"),
        ("'1'", "1"),
        ("'it\\'s'", "it's"),
        ("'C:\\data'", "C:\\data"),
        ("[1,2]", [1, 2]),
        ("[a, b]", ["a", "b"]),
        ("[1, [2, 'x, y'], {k: v}]", [1, [2, "x, y"], {"k": "v"}]),
        ("[1, 2,]", [1, 2]),
        ("[]", []),
        ("{a: 1}", {"a": 1}),
        ("{a:1, b: [true, null]}", {"a": 1, "b": [True, None]}),
        ("{'a b': 1e-3}", {"a b": 0.001}),
        ("{}", {}),
    ],
)
def test_parse_value(text, expected):
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)  # 1 is not True, 1.0 is not 1


def test_parse_value_nan():
    assert math.isnan(parse_value("nan"))


def test_unparseable_container_is_kept_as_string_with_warning(config_warnings):
    assert parse_value("[1, 2") == "[1, 2"
    assert parse_value("[1,,2]") == "[1,,2]"
    assert parse_value("{a: 1, a: 2}") == "{a: 1, a: 2}"
    assert parse_value("'a'b") == "'a'b"
    messages = config_warnings()
    assert messages[0] == (
        "Override value '[1, 2' does not parse (expected ',' or ']' at position 5, found the end); "
        "it is kept as a plain string."
    )
    assert "duplicate key 'a'" in messages[2]
    assert len(messages) == 4


# ---------------------------------------------------------------------------- one override


def test_parse_override_splits_on_first_equals():
    assert parse_override("path=a=b") == Override("path", "a=b", add=False, text="path=a=b")
    assert parse_override("+train.new_key=1") == Override(
        "train.new_key", 1, add=True, text="+train.new_key=1"
    )
    assert parse_override(" lr =1e-3") == Override("lr", 0.001, add=False, text=" lr =1e-3")


@pytest.mark.parametrize(
    "text, message",
    [
        ("foo", r"^Malformed override 'foo': expected KEY=VALUE \(e\.g\. train\.max_iter=100\)$"),
        ("=1", r"^Malformed override '=1': the key before '=' is empty$"),
        ("+=1", r"^Malformed override '\+=1': the key before '=' is empty$"),
        ("a..b=1", r"^Malformed override 'a\.\.b=1': key 'a\.\.b' must be dot-separated names"),
        (".a=1", r"^Malformed override '\.a=1'"),
        ("a b=1", r"^Malformed override 'a b=1'"),
        ("~a=1", r"^Unsupported override '~a=1': '~key' \(delete\) and '\+\+key' \(force add\)"),
        ("++a=1", r"^Unsupported override '\+\+a=1'"),
    ],
)
def test_malformed_overrides_are_named(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_override(text)
    cfg = base_cfg()
    with pytest.raises(ConfigError, match=message):
        LazyConfig.apply_overrides(cfg, [text])


# ---------------------------------------------------------------------------- applying


def test_every_override_form_applies():
    cfg = base_cfg()
    result = LazyConfig.apply_overrides(
        cfg,
        [
            "a.b=1",
            "name=foo",
            "lr=1e-3",
            "sizes=[1,2]",
            "path=a=b",
            "flag=true",
            "x=None",
            "s='quoted str'",
            "t=[a, b]",
            "d={a: 1}",
            "todo=5",
            "train.checkpointer.period=3",
        ],
    )
    assert result is cfg
    assert OmegaConf.to_container(cfg) == {
        "a": {"b": 1},
        "name": "foo",
        "lr": 0.001,
        "sizes": [1, 2],
        "path": "a=b",
        "flag": True,
        "x": None,
        "s": "quoted str",
        "t": ["a", "b"],
        "d": {"a": 1, "keep": 2},  # a dict merges into the existing node
        "train": {"max_iter": 100, "output_dir": "out", "checkpointer": {"period": 3}},
        "model": {"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3},
        "todo": 5,
    }


def test_dict_override_keeps_target_and_list_items_can_be_set():
    cfg = base_cfg()
    LazyConfig.apply_overrides(cfg, ["model={out_features: 8}", "sizes=[5, 6]", "sizes.1=7"])
    assert OmegaConf.to_container(cfg.model) == {
        "_target_": "torch.nn.Linear",
        "in_features": 2,
        "out_features": 8,
    }
    assert list(cfg.sizes) == [5, 7]


def test_interpolation_override_resolves():
    cfg = base_cfg()
    LazyConfig.apply_overrides(cfg, ["name=${train.output_dir}/run"])
    assert cfg.name == "out/run"


def test_unknown_key_names_full_key_and_closest():
    cfg = base_cfg()
    with pytest.raises(ConfigError) as info:
        LazyConfig.apply_overrides(cfg, ["train.max_iters=5"])
    assert str(info.value) == (
        "Unknown config key 'train.max_iters' in override 'train.max_iters=5'; "
        "did you mean 'train.max_iter'? (to add a new key, write '+train.max_iters=5')"
    )
    assert error_of(apply, cfg, "trian.checkpointer.period=1") == (
        "Unknown config key 'trian.checkpointer.period' in override 'trian.checkpointer.period=1'; "
        "did you mean 'train.checkpointer.period'? "
        "(to add a new key, write '+trian.checkpointer.period=1')"
    )
    # A forgotten prefix: the same last part elsewhere.
    assert error_of(apply, cfg, "max_iter=1").startswith(
        "Unknown config key 'max_iter' in override 'max_iter=1'; did you mean 'train.max_iter'?"
    )
    # Nothing close: the keys at that level are listed.
    assert error_of(apply, cfg, "train.zzz=1") == (
        "Unknown config key 'train.zzz' in override 'train.zzz=1'; "
        "valid keys under 'train': max_iter, output_dir, checkpointer "
        "(to add a new key, write '+train.zzz=1')"
    )


def test_unknown_list_index_and_value_parent():
    cfg = base_cfg()
    assert error_of(apply, cfg, "sizes.3=1") == (
        "Unknown config key 'sizes.3' in override 'sizes.3=1'; "
        "'sizes' is a list of 1 item(s), indexed 0..0"
    )
    assert error_of(apply, cfg, "lr.x=1") == (
        "Cannot apply override 'lr.x=1': 'lr' holds a value, not a config node with keys"
    )


def test_plus_adds_new_keys_only():
    cfg = base_cfg()
    LazyConfig.apply_overrides(cfg, ["+train.new_key=1", "+extra.deep.sizes=[1, 2]"])
    assert cfg.train.new_key == 1
    assert OmegaConf.to_container(cfg.extra) == {"deep": {"sizes": [1, 2]}}
    assert error_of(apply, cfg, "+train.max_iter=2") == (
        "Cannot add 'train.max_iter' with '+train.max_iter=2': the key already exists; "
        "drop the '+' to change its value"
    )
    assert error_of(apply, cfg, "+sizes.5=1") == (
        "Cannot add 'sizes.5' with '+sizes.5=1': '+' adds keys to dicts, not items to lists; "
        "override the whole list instead"
    )


def test_overrides_apply_all_or_nothing():
    cfg = base_cfg()
    before = OmegaConf.to_container(cfg)
    with pytest.raises(ConfigError, match=r"^Unknown config key 'no' "):
        apply(
            cfg, "train.max_iter=1", "d={a: 9, new: 1}", "+added=1", "sizes.0=4", "todo=3", "no=1"
        )
    assert OmegaConf.to_container(cfg) == before
    assert OmegaConf.is_missing(cfg, "todo")
    # A malformed override anywhere means nothing is applied.
    with pytest.raises(ConfigError, match=r"Malformed override 'oops'"):
        LazyConfig.apply_overrides(cfg, ["train.max_iter=1", "oops"])
    assert cfg.train.max_iter == 100


def test_rollback_works_on_struct_and_read_only_configs():
    cfg = OmegaConf.create({"a": {"b": 1}, "c": 2, "seq": [1, 2]})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(ConfigError, match=r"^Unknown config key 'zz' "):
        apply(cfg, "+a.x=1", "+new.deep=2", "c=5", "seq.0=9", "zz=1")
    assert OmegaConf.to_container(cfg) == {"a": {"b": 1}, "c": 2, "seq": [1, 2]}
    assert OmegaConf.is_struct(cfg)
    OmegaConf.set_readonly(cfg, True)
    assert error_of(apply, cfg, "c=3") == (
        "Cannot apply override 'c=3': Cannot change read-only config container"
    )
    assert error_of(apply, cfg, "seq.1=3") == (
        "Cannot apply override 'seq.1=3': ListConfig is read-only"
    )
    assert OmegaConf.to_container(cfg) == {"a": {"b": 1}, "c": 2, "seq": [1, 2]}
    assert OmegaConf.is_readonly(cfg) and OmegaConf.is_struct(cfg)


def test_bad_arguments_to_apply_overrides():
    with pytest.raises(ConfigError, match=r"^apply_overrides needs a DictConfig, got dict"):
        LazyConfig.apply_overrides({"a": 1}, ["a=2"])
    assert error_of(LazyConfig.apply_overrides, base_cfg(), "a.b=1") == (
        "apply_overrides needs a list of 'key=value' strings, got str"
    )
    with pytest.raises(ConfigError, match=r"^Malformed override 3: overrides are strings"):
        LazyConfig.apply_overrides(base_cfg(), [3])


@dataclasses.dataclass
class _Optim:
    lr: float = 0.1
    steps: int = 10


def test_typed_nodes_convert_values_without_warnings():
    cfg = OmegaConf.create({"optim": OmegaConf.structured(_Optim)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LazyConfig.apply_overrides(cfg, ["optim.lr=1", "optim.steps=5"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert error_of(apply, cfg, "optim.steps=abc") == (
        "Cannot apply override 'optim.steps=abc': "
        "Value 'abc' of type 'str' could not be converted to Integer"
    )
    assert cfg.optim.steps == 5


@pytest.mark.skipif(len(SEQUENCE_CONFIGS) == 1, reason="this OmegaConf has no TupleConfig")
def test_tuple_nodes_are_replaced_whole():
    cfg = OmegaConf.create({"betas": (0.9, 0.99)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LazyConfig.apply_overrides(cfg, ["betas=[0.8, 0.9]"])
    assert tuple(cfg.betas) == (0.8, 0.9)
    assert error_of(apply, cfg, "betas.0=0.5") == (
        "Cannot apply override 'betas.0=0.5': 'betas' is a tuple, whose items cannot be changed "
        "one by one; override it whole (betas=[...])"
    )
