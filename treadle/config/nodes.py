"""OmegaConf's node interface that treadle uses, in one place.

OmegaConf keeps these methods private (``_get_node``, ``_is_missing``...),
but no public call tells a value that is ``???`` from one that is ``None``,
reads a ``${...}`` interpolation without resolving it, or names a node's key
and parent. Config checking needs all four (an unset key is named as such,
a broken interpolation by its own key). They are wrapped here so that an
OmegaConf release that changes them breaks this module only; the tests of
``treadle.config`` run against the pinned OmegaConf (``constraints.txt``).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["child_node", "raw_value", "is_none", "is_missing", "is_interpolation", "key_of", "parent_of", "metadata_of"]


def child_node(container: Any, key: Any) -> Optional[Any]:
    """The node under ``key`` of a ``DictConfig`` or ``ListConfig``, unresolved (``None`` when absent)."""
    return container._get_node(key)


def raw_value(node: Any) -> Any:
    """A node's value as written: ``"???"``, ``"${...}"``, or the value."""
    return node._value()


def is_none(node: Any) -> bool:
    """Whether the node's value is None (a ``None`` written in the config)."""
    return bool(node._is_none())


def is_missing(node: Any) -> bool:
    """Whether the value is ``???`` (to be given)."""
    return bool(node._is_missing())


def is_interpolation(node: Any) -> bool:
    """Whether the value is an interpolation (``"${...}"``), not yet resolved."""
    return bool(node._is_interpolation())


def key_of(node: Any) -> Any:
    """The node's key in its parent (a key of a dict, an index of a list)."""
    return node._key()


def parent_of(node: Any) -> Optional[Any]:
    """The node that holds this one, or None for the config's root."""
    return node._get_parent()


def metadata_of(node: Any) -> Any:
    """The node's metadata (its declared type, for a ``TupleConfig``)."""
    return node._metadata
