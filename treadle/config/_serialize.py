"""Internal: writing configs as YAML that loads back to an equal config, without pickle."""

from __future__ import annotations

import logging
import pathlib
from typing import Any, List, Tuple

from omegaconf import DictConfig, OmegaConf

from ._keys import join_path
from .errors import ConfigError
from .locate import import_path

__all__ = ["to_yaml"]

logger = logging.getLogger(__name__)

_YAML_SCALARS = (str, bytes, int, float, bool, type(None), pathlib.PurePath)
_MISSING = "???"


def _describe(value: Any) -> str:
    qualname = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    if isinstance(qualname, str):
        kind = type(value).__name__
        return f"{kind} {module}.{qualname}" if module else f"{kind} {qualname}"
    return f"a {type(value).__module__}.{type(value).__qualname__} object"


def _plain(value: Any, path: str, unsaved: List[Tuple[str, str]]) -> Any:
    """``value`` made of YAML-safe parts only; what cannot be written is recorded in ``unsaved``."""
    if isinstance(value, dict):
        return {key: _plain(item, join_path(path, key), unsaved) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, join_path(path, i), unsaved) for i, item in enumerate(value)]
    if isinstance(value, _YAML_SCALARS):
        return value
    name = import_path(value)
    if name is not None:
        # Classes and functions (`_target_`s above all) are written as the path
        # that `instantiate`/`locate` import back.
        return name
    unsaved.append((path, _describe(value)))
    return _MISSING


def to_yaml(cfg: Any) -> str:
    """The YAML text of ``cfg`` (a ``DictConfig`` or dict), with interpolations kept.

    - Callables and classes, as ``_target_`` or as any other value, are written
      as their import path (``torch.nn.Linear``); loaded back they are strings,
      which ``instantiate`` imports for ``_target_``.
    - Values that cannot be written (lambdas, local functions, arbitrary
      objects) become ``???`` (OmegaConf's "missing": reading them after loading
      fails loudly instead of silently yielding a wrong value). Each is logged
      as a warning naming its key and listed in a comment at the top of the text.
      Nothing is ever pickled.
    """
    if isinstance(cfg, DictConfig):
        content = OmegaConf.to_container(cfg, resolve=False, enum_to_str=False)
    elif isinstance(cfg, dict):
        content = cfg
    else:
        raise ConfigError(
            f"Only a DictConfig or dict can be saved as a config, got {type(cfg).__name__}"
        )
    unsaved: List[Tuple[str, str]] = []
    plain = _plain(content, "", unsaved)
    text = OmegaConf.to_yaml(OmegaConf.create(plain), resolve=False)
    if not unsaved:
        return text
    header = ["# Not serializable, saved as ??? (missing):"]
    for key, what in unsaved:
        logger.warning(
            "Config key '%s' holds %s, which cannot be written to YAML and has no import path; "
            "it is saved as ??? (missing). Use a LazyCall or an importable function instead.",
            key,
            what,
        )
        header.append(f"#   {key}: {what}")
    return "\n".join(header) + "\n" + text
