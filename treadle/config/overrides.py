"""Applying parsed overrides to a config: all of them, or none."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, List, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from ._keys import child, deepest, is_branch, unknown_key_message
from ._values import SEQUENCE_CONFIGS
from .errors import ConfigError, first_line
from .override_parser import Override, parse_override
from .nodes import child_node, key_of

__all__ = ["apply_overrides"]

_ABSENT = object()


@dataclass
class _Undo:
    """How to put one key back: its container, its key, and the node it held (or _ABSENT)."""

    parent: Any
    key: Any
    old: Any


def _nested(parts: Sequence[str], value: Any) -> Any:
    """``_nested(["a", "b"], 1) == {"a": {"b": 1}}``: the value of a new key with new parents."""
    for part in reversed(parts):
        value = {part: value}
    return value


def _apply_one(cfg: DictConfig, override: Override, done: List[_Undo]) -> None:
    parts = override.key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts[:-1]):
        sub = child(node, part)
        if sub is None:
            if override.add:
                # +a.b.c=1 where a.b does not exist: create the missing parents.
                _set(node, part, _nested(parts[depth + 1 :], override.value), override, True, done)
                return
            raise _unknown(cfg, override)
        if not is_branch(sub):
            prefix = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"Cannot apply override {override.text!r}: '{prefix}' holds a value, not a config "
                f"node with keys"
            )
        node = sub
    last = parts[-1]
    existing = child(node, last)
    if override.add and existing is not None:
        raise ConfigError(
            f"Cannot add '{override.key}' with {override.text!r}: the key already exists; "
            f"drop the '+' to change its value"
        )
    if not override.add and existing is None:
        raise _unknown(cfg, override)
    _set(node, last, override.value, override, existing is None, done)


def _unknown(cfg: DictConfig, override: Override) -> ConfigError:
    parent, _ = deepest(cfg, override.key)
    # '+' adds keys to dicts only; do not suggest it where the path runs into a list.
    hint = (
        ""
        if isinstance(parent, SEQUENCE_CONFIGS)
        else f" (to add a new key, write '+{override.text}')"
    )
    return ConfigError(
        f"Unknown config key '{override.key}' in override {override.text!r}; "
        f"{unknown_key_message(override.key, cfg)}{hint}"
    )


def _set(node: Any, key: str, value: Any, override: Override, new: bool, done: List[_Undo]) -> None:
    """Sets ``node[key]``, first recording in ``done`` how to undo it (also a partial merge).

    The write goes through ``OmegaConf.update``: a dict merges into an existing
    dict node (as in hydra and detectron2, so ``model={depth: 50}`` keeps the
    node's ``_target_``), and a typed node converts the value to its type
    without OmegaConf's implicit-conversion warnings.
    """
    if isinstance(node, SEQUENCE_CONFIGS):
        if new:
            raise ConfigError(
                f"Cannot add '{override.key}' with {override.text!r}: '+' adds keys to dicts, "
                f"not items to lists; override the whole list instead"
            )
        if not isinstance(node, ListConfig):
            parent_key = override.key.rsplit(".", 1)[0]
            raise ConfigError(
                f"Cannot apply override {override.text!r}: '{parent_key}' is a tuple, whose items "
                f"cannot be changed one by one; override it whole ({parent_key}=[...])"
            )
        index = int(key)
        done.append(_Undo(node, index, copy.deepcopy(child_node(node, index))))
        OmegaConf.update(node, str(index), value, merge=True)
        return
    if not isinstance(node, DictConfig):
        raise ConfigError(
            f"Cannot apply override {override.text!r}: its parent is not a config node"
        )
    existing = None if new else child(node, key)
    real_key: Any = key if existing is None else key_of(existing)  # YAML may have made it an int
    done.append(_Undo(node, real_key, _ABSENT if new else copy.deepcopy(existing)))
    if isinstance(real_key, str) and not any(c in real_key for c in "[]\\"):
        OmegaConf.update(node, real_key, value, merge=True, force_add=new)
    elif isinstance(value, dict) and isinstance(existing, DictConfig) and is_branch(existing):
        existing.merge_with(value)
    else:
        # Keys OmegaConf.update cannot address (ints, brackets) are set directly.
        node[real_key] = value


def _undo(undo: _Undo) -> None:
    # Putting back the previous state is allowed where flags forbid changes (a struct
    # config refuses deletions, a read-only one refuses everything): the failed
    # override may have been recorded before OmegaConf refused it.
    with read_write(undo.parent), open_dict(undo.parent):
        if undo.old is not _ABSENT:
            undo.parent[undo.key] = undo.old
        elif undo.key in undo.parent.keys():
            del undo.parent[undo.key]


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Applies command-line style overrides to ``cfg`` in place and returns it.

    Each override is ``key=value`` (the key must exist) or ``+key=value`` (the
    key must not exist; missing parents are created). Values are parsed by
    :func:`~treadle.config.parse_value`. A dict value merges into an existing
    dict node; any other value replaces the old one.

    The overrides are applied all or nothing: every one is parsed before the
    config is touched, and when one fails the earlier ones are undone.

    Raises:
        ConfigError: naming the override for a malformed override, an unknown
            key (with the closest existing keys), a ``+`` on an existing key, or
            a value OmegaConf rejects.
    """
    if not isinstance(cfg, DictConfig):
        raise ConfigError(
            f"apply_overrides needs a DictConfig, got {type(cfg).__name__}; "
            f"wrap a dict with omegaconf.OmegaConf.create"
        )
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence):
        raise ConfigError(
            f"apply_overrides needs a list of 'key=value' strings, got {type(overrides).__name__}"
        )
    parsed = [parse_override(text) for text in overrides]
    done: List[_Undo] = []
    try:
        for override in parsed:
            try:
                _apply_one(cfg, override, done)
            except OmegaConfBaseException as e:
                raise ConfigError(
                    f"Cannot apply override {override.text!r}: {first_line(e)}"
                ) from e
    except BaseException:
        for undo in reversed(done):
            _undo(undo)
        raise
    return cfg
