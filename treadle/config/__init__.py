"""Lazy Python configs on OmegaConf: ``LazyCall``, ``LazyConfig`` and ``instantiate``.

A config is a tree of ``DictConfig`` nodes; a node with ``_target_`` describes a
call that :func:`instantiate` makes. See ``docs/config.md``.
"""

from .errors import ConfigError
from .instantiate import instantiate
from .lazy import LazyConfig
from .lazy_call import L, LazyCall
from .locate import import_path, locate
from .override_parser import Override, parse_override, parse_value
from .overrides import apply_overrides
from .zoo import get_config, get_config_file, shipped_configs

__all__ = [
    "ConfigError",
    "L",
    "LazyCall",
    "LazyConfig",
    "Override",
    "apply_overrides",
    "get_config",
    "get_config_file",
    "shipped_configs",
    "import_path",
    "instantiate",
    "locate",
    "parse_override",
    "parse_value",
]
