"""Internal: how Python values enter a config, the same on every OmegaConf version."""

from __future__ import annotations

from typing import Any, Tuple, Type

from omegaconf import ListConfig

__all__ = ["SEQUENCE_CONFIGS", "tuples_to_lists"]

try:  # OmegaConf >= 2.4 keeps tuples as immutable TupleConfig nodes.
    from omegaconf import TupleConfig

    SEQUENCE_CONFIGS: Tuple[Type[Any], ...] = (ListConfig, TupleConfig)
except ImportError:  # OmegaConf 2.3 turns tuples into ListConfig.
    SEQUENCE_CONFIGS = (ListConfig,)


def tuples_to_lists(value: Any) -> Any:
    """``value`` with every tuple inside plain dicts, lists and tuples made a list.

    Configs store sequences as (mutable) lists whatever OmegaConf version is
    installed, as detectron2 configs always did: an override can then change one
    item (``model.sizes.0=3``) and a YAML round trip gives back an equal config.
    Config nodes and other objects are left as they are.
    """
    if isinstance(value, dict):
        return {key: tuples_to_lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [tuples_to_lists(item) for item in value]
    return value
