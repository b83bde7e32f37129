"""Lazy Python configs on OmegaConf: ``LazyCall``, ``LazyConfig`` and ``instantiate``.

A config is a tree of ``DictConfig`` nodes; a node with ``_target_`` describes a
call that :func:`instantiate` makes. See ``docs/config.md``.

The names below are imported from their modules when first used, so that
``ConfigError`` (which the hooks raise) comes without OmegaConf: a training
script that builds its trainer in Python imports no config machinery.
"""

from typing import TYPE_CHECKING

from treadle.utils.lazy_exports import lazy_exports

from .errors import ConfigError

if TYPE_CHECKING:
    from .instantiate import instantiate
    from .lazy import LazyConfig
    from .lazy_call import L, LazyCall
    from .locate import import_path, locate
    from .override_parser import Override, parse_override, parse_value
    from .overrides import apply_overrides
    from .zoo import get_config, get_config_file, shipped_configs

# Public name -> the submodule that defines it.
_LAZY = {
    "instantiate": "instantiate",
    "LazyConfig": "lazy",
    "L": "lazy_call",
    "LazyCall": "lazy_call",
    "import_path": "locate",
    "locate": "locate",
    "Override": "override_parser",
    "parse_override": "override_parser",
    "parse_value": "override_parser",
    "apply_overrides": "overrides",
    "get_config": "zoo",
    "get_config_file": "zoo",
    "shipped_configs": "zoo",
}

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


lazy_exports(__name__, _LAZY)
