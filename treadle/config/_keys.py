"""Internal: dotted keys into configs: walking them without resolving values, naming nodes,
and suggesting the keys a user probably meant.

Config paths are written the way overrides are typed: ``model.backbone.depth``,
with list items as numbers (``model.layers.0.act``).
"""

from __future__ import annotations

import difflib
from typing import Any, List, Optional

from omegaconf import DictConfig, ListConfig, Node

from .errors import ConfigError

__all__ = [
    "join_path",
    "node_path",
    "is_branch",
    "child",
    "all_keys",
    "suggest_keys",
    "describe_level",
    "unknown_key_message",
    "select",
]

_MAX_LISTED = 12


def join_path(prefix: str, key: Any) -> str:
    """``join_path("model", "backbone") == "model.backbone"``; an empty prefix is the root."""
    return f"{prefix}.{key}" if prefix else str(key)


def node_path(node: Any) -> str:
    """The dotted path of an OmegaConf node from its root (``""`` for a root or a non-node)."""
    parts: List[str] = []
    while isinstance(node, Node):
        parent = node._get_parent()
        if parent is None:
            break
        parts.append(str(node._key()))
        node = parent
    return ".".join(reversed(parts))


def is_branch(node: Any) -> bool:
    """Whether ``node`` is a config container one can descend into (not missing/None/interpolation)."""
    return (
        isinstance(node, (DictConfig, ListConfig))
        and not node._is_missing()
        and not node._is_none()
        and not node._is_interpolation()
    )


def child(node: Any, part: str) -> Any:
    """The child node ``part`` of a container, or ``None`` when it has none.

    Values are not resolved: a ``???`` or ``${...}`` value still counts as an
    existing key. In a list, ``part`` must be an index in range.
    """
    if isinstance(node, ListConfig):
        try:
            index = int(part)
        except ValueError:
            return None
        return node._get_node(index) if -len(node) <= index < len(node) else None
    if isinstance(node, DictConfig) and is_branch(node):
        # Not `part in node`: that is False for keys whose value is ??? (missing).
        keys = node.keys()
        if part in keys:
            return node._get_node(part)
        # YAML may give integer keys ({1: a}); the dotted key spells them as text.
        if part.lstrip("-").isdigit() and int(part) in keys:
            return node._get_node(int(part))
    return None


def all_keys(cfg: Any, prefix: str = "") -> List[str]:
    """Every dotted key of the dicts in ``cfg`` (lists are not entered), depth first."""
    keys: List[str] = []
    if not isinstance(cfg, DictConfig) or not is_branch(cfg):
        return keys
    for key in cfg.keys():
        path = join_path(prefix, key)
        keys.append(path)
        sub = cfg._get_node(key)
        if isinstance(sub, DictConfig) and is_branch(sub):
            keys.extend(all_keys(sub, path))
    return keys


def suggest_keys(key: str, cfg: Any, n: int = 3) -> List[str]:
    """Existing keys of ``cfg`` close to ``key``: whole-path matches first, then
    siblings of the deepest existing parent whose name is close to the last part."""
    candidates = all_keys(cfg)
    found = difflib.get_close_matches(key, candidates, n=n, cutoff=0.6)
    parts = key.split(".")
    node, depth = cfg, 0
    for part in parts[:-1]:
        sub = child(node, part)
        if sub is None or not is_branch(sub):
            break
        node, depth = sub, depth + 1
    if isinstance(node, DictConfig) and is_branch(node):
        prefix = ".".join(parts[:depth])
        # Compare the first unmatched part with the keys at that level.
        for name in difflib.get_close_matches(parts[depth], [str(k) for k in node.keys()], n=n, cutoff=0.6):
            path = join_path(prefix, name)
            if path not in found:
                found.append(path)
    return found[:n]


def describe_level(key: str, cfg: Any) -> str:
    """``"valid keys under 'train': a, b, c"`` for the deepest existing parent of ``key``."""
    parts = key.split(".")
    node, depth = cfg, 0
    for part in parts[:-1]:
        sub = child(node, part)
        if sub is None or not is_branch(sub):
            break
        node, depth = sub, depth + 1
    where = f"under '{'.'.join(parts[:depth])}'" if depth else "at the top level"
    if isinstance(node, ListConfig):
        return f"'{'.'.join(parts[:depth])}' is a list of {len(node)} item(s); use an index 0..{len(node) - 1}"
    names = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    if not names:
        return f"there are no keys {where}"
    listed = ", ".join(names[:_MAX_LISTED]) + (", ..." if len(names) > _MAX_LISTED else "")
    return f"valid keys {where}: {listed}"


def unknown_key_message(key: str, cfg: Any) -> str:
    """The explanation appended to every "unknown key" error: suggestions, or the valid keys."""
    close = suggest_keys(key, cfg)
    if close:
        return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return describe_level(key, cfg)


def select(cfg: Any, key: str, where: Optional[str] = None) -> Any:
    """The value at dotted ``key`` (interpolations resolved), or a :class:`ConfigError`
    naming ``key`` (and ``where`` it was looked up) with close existing keys."""
    node = cfg
    for part in key.split("."):
        node = child(node, part) if part else None
        if node is None:
            place = f" in {where}" if where else ""
            raise ConfigError(f"Config key '{key}' not found{place}; {unknown_key_message(key, cfg)}")
    parent = node._get_parent()
    return parent[node._key()] if parent is not None else node

