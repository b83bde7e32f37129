"""Internal: dotted keys into configs. Walking them without resolving values,
naming nodes, and suggesting the keys a user probably meant.

Config paths are written the way overrides are typed: ``model.backbone.depth``,
with list items as numbers (``model.layers.0.act``).
"""

from __future__ import annotations

import difflib
from typing import Any, List, Optional, Tuple

from omegaconf import DictConfig, Node
from omegaconf.errors import OmegaConfBaseException

from ._values import SEQUENCE_CONFIGS
from .errors import ConfigError, first_line
from .nodes import child_node, is_interpolation, is_missing, is_none, key_of, parent_of

__all__ = [
    "join_path",
    "node_path",
    "is_branch",
    "child",
    "all_keys",
    "deepest",
    "suggest_keys",
    "describe_level",
    "unknown_key_message",
    "select",
]

_MAX_LISTED = 12
_CUTOFF = 0.75  # difflib similarity of whole dotted keys
_MARGIN = 0.1


def join_path(prefix: str, key: Any) -> str:
    """``join_path("model", "backbone") == "model.backbone"``; an empty prefix is the root."""
    return f"{prefix}.{key}" if prefix else str(key)


def node_path(node: Any) -> str:
    """The dotted path of an OmegaConf node from its root (``""`` for a root or a non-node)."""
    parts: List[str] = []
    while isinstance(node, Node):
        parent = parent_of(node)
        if parent is None:
            break
        parts.append(str(key_of(node)))
        node = parent
    return ".".join(reversed(parts))


def is_branch(node: Any) -> bool:
    """Whether ``node`` is a container one can descend into (not ???, None or ``${...}``)."""
    return (
        isinstance(node, (DictConfig,) + SEQUENCE_CONFIGS)
        and not is_missing(node)
        and not is_none(node)
        and not is_interpolation(node)
    )


def child(node: Any, part: str) -> Any:
    """The child node ``part`` of a container, or ``None`` when it has none.

    Values are not resolved: a ``???`` or ``${...}`` value still counts as an
    existing key. In a list, ``part`` must be an index in range.
    """
    if not is_branch(node):
        return None
    if isinstance(node, SEQUENCE_CONFIGS):
        try:
            index = int(part)
        except ValueError:
            return None
        return child_node(node, index) if -len(node) <= index < len(node) else None
    if isinstance(node, DictConfig):
        # Not `part in node`: that is False for keys whose value is ??? (missing).
        keys = node.keys()
        if part in keys:
            return child_node(node, part)
        # YAML may give integer keys ({1: a}); the dotted key spells them as text.
        if part.lstrip("-").isdigit() and int(part) in keys:
            return child_node(node, int(part))
    return None


def all_keys(cfg: Any, prefix: str = "") -> List[str]:
    """Every dotted key of the dicts in ``cfg`` (lists are not entered), depth first."""
    keys: List[str] = []
    if not isinstance(cfg, DictConfig) or not is_branch(cfg):
        return keys
    for key in cfg.keys():
        path = join_path(prefix, key)
        keys.append(path)
        sub = child_node(cfg, key)
        if isinstance(sub, DictConfig) and is_branch(sub):
            keys.extend(all_keys(sub, path))
    return keys


def deepest(cfg: Any, key: str) -> Tuple[Any, int]:
    """The deepest existing container on the way to ``key``, and the number of parts
    of ``key`` that lead to it."""
    node, depth = cfg, 0
    for part in key.split(".")[:-1]:
        sub = child(node, part)
        if sub is None or not is_branch(sub):
            break
        node, depth = sub, depth + 1
    return node, depth


def suggest_keys(key: str, cfg: Any, n: int = 3) -> List[str]:
    """Up to ``n`` existing keys of ``cfg`` that the user probably meant by ``key``.

    In order of preference, the first rule that finds any wins: whole dotted
    paths close to ``key`` (a typo anywhere: ``trian.max_iter``); keys elsewhere
    with the same last part (a forgotten prefix: ``max_iter``); keys next to
    where ``key`` stops matching whose names are close to the unmatched part.
    """
    # Ancestors of `key` exist by construction and are never what was meant.
    candidates = [c for c in all_keys(cfg) if not key.startswith(c + ".")]
    scored = sorted(
        ((difflib.SequenceMatcher(None, key, c).ratio(), c) for c in candidates),
        key=lambda pair: -pair[0],
    )
    if scored and scored[0][0] >= _CUTOFF:
        # Only the near-best: a clear winner is not diluted by weaker lookalikes.
        floor = max(_CUTOFF, scored[0][0] - _MARGIN)
        return [c for score, c in scored[:n] if score >= floor]
    last = key.split(".")[-1]
    found = [c for c in candidates if c.split(".")[-1] == last and c != key]
    if found:
        return found[:n]
    node, depth = deepest(cfg, key)
    if not isinstance(node, DictConfig) or not is_branch(node):
        return []
    parts = key.split(".")
    prefix = ".".join(parts[:depth])
    names = [str(k) for k in node.keys()]
    close = difflib.get_close_matches(parts[depth], names, n=n, cutoff=0.6)
    return [join_path(prefix, name) for name in close]


def describe_level(key: str, cfg: Any) -> str:
    """``"valid keys under 'train': a, b, c"`` for the deepest existing parent of ``key``."""
    node, depth = deepest(cfg, key)
    prefix = ".".join(key.split(".")[:depth])
    if isinstance(node, SEQUENCE_CONFIGS):
        return f"'{prefix}' is a list of {len(node)} item(s), indexed 0..{len(node) - 1}"
    where = f"under '{prefix}'" if depth else "at the top level"
    names = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    if not names:
        return f"there are no keys {where}"
    listed = ", ".join(names[:_MAX_LISTED]) + (", ..." if len(names) > _MAX_LISTED else "")
    return f"valid keys {where}: {listed}"


def unknown_key_message(key: str, cfg: Any) -> str:
    """The explanation appended to every "unknown key" error: suggestions, or the valid keys."""
    node, _ = deepest(cfg, key)
    close = [] if isinstance(node, SEQUENCE_CONFIGS) else suggest_keys(key, cfg)
    if close:
        return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return describe_level(key, cfg)


def select(cfg: Any, key: str, where: Optional[str] = None) -> Any:
    """The value at dotted ``key`` (interpolations resolved), or a :class:`ConfigError`
    naming ``key`` (and ``where`` it was looked up) with close existing keys."""
    place = f" in {where}" if where else ""
    node = cfg
    for part in key.split("."):
        node = child(node, part) if part else None
        if node is None:
            hint = unknown_key_message(key, cfg)
            raise ConfigError(f"Config key '{key}' not found{place}; {hint}")
    parent = parent_of(node)
    try:
        return parent[key_of(node)] if parent is not None else node
    except OmegaConfBaseException as e:
        first = first_line(e)
        raise ConfigError(f"Config key '{key}'{place} cannot be read: {first}") from e

