"""Internal: how Python values enter a config, the same on every OmegaConf version."""

from __future__ import annotations

from typing import Any, Tuple, Type

from omegaconf import DictConfig, ListConfig, OmegaConf, SCMode

from .nodes import child_node

__all__ = ["SEQUENCE_CONFIGS", "tuples_to_lists", "tuple_nodes_to_lists"]

try:  # OmegaConf >= 2.4 keeps tuples as immutable TupleConfig nodes.
    from omegaconf import TupleConfig

    SEQUENCE_CONFIGS: Tuple[Type[Any], ...] = (ListConfig, TupleConfig)
except ImportError:  # OmegaConf 2.3 turns tuples into ListConfig.
    TupleConfig = None  # type: ignore[misc,assignment]  # the name stays, as None, for the checks below
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


def tuple_nodes_to_lists(cfg: DictConfig) -> DictConfig:
    """``cfg``, or a copy of it in which every ``TupleConfig`` node is a list.

    :func:`tuples_to_lists` covers values as they enter a config; this covers
    tuples assigned into a config node afterwards (``model.sizes = (1, 2)`` in a
    config file, after ``model = L(...)(...)``), which OmegaConf 2.4 stores as
    ``TupleConfig``. Such a node keeps its tuple type when assigned a list, so
    the copy is rebuilt from the raw content: interpolations stay unresolved,
    objects stay as they are.
    """
    if TupleConfig is None or not _has_tuple_node(cfg):
        return cfg
    content = OmegaConf.to_container(cfg, resolve=False, structured_config_mode=SCMode.DICT_CONFIG)
    return DictConfig(tuples_to_lists(content), flags={"allow_objects": True})


def _has_tuple_node(node: Any) -> bool:
    if isinstance(node, TupleConfig):
        return True
    if isinstance(node, DictConfig):
        return any(_has_tuple_node(child_node(node, key)) for key in node.keys())
    if isinstance(node, ListConfig):
        return any(_has_tuple_node(child_node(node, i)) for i in range(len(node)))
    return False
