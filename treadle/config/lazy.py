"""``LazyConfig``: load, save and override lazy configs (detectron2's names)."""

from __future__ import annotations

import os
import posixpath
import sys
from typing import Any, Sequence, Tuple, Union

from omegaconf import DictConfig

from treadle.utils.file_io import PathManager

from ._keys import select
from ._loader import load_config_file
from ._serialize import to_yaml
from .errors import ConfigError
from .overrides import apply_overrides

__all__ = ["LazyConfig"]


class LazyConfig:
    """Entry points for lazy configs: Python or YAML files whose nodes are lazy
    calls (``{"_target_": ..., **arguments}``) turned into objects by
    :func:`~treadle.config.instantiate`.

    All methods are static; the class is a namespace, as in detectron2.
    """

    @staticmethod
    def load(
        filename: Union[str, os.PathLike], keys: Union[None, str, Sequence[str]] = None
    ) -> Union[DictConfig, Any, Tuple[Any, ...]]:
        """Loads a ``.py`` or ``.yaml``/``.yml`` config file.

        Args:
            filename: the file, opened through ``PathManager``.
            keys: ``None`` for the whole config; one (dotted) key for its value
                (``"train"``); a sequence of keys for a tuple of their values.
                Selected nodes stay attached to the whole config, so their
                interpolations still resolve.

        Raises:
            ConfigError: see the loading rules in ``docs/config.md``; also
                for a key the file does not define, naming it and close keys.
        """
        cfg = load_config_file(os.fspath(filename))
        if keys is None:
            return cfg
        where = f"config file '{os.fspath(filename)}'"
        if isinstance(keys, str):
            return select(cfg, keys, where)
        return tuple(select(cfg, key, where) for key in keys)

    @staticmethod
    def load_rel(
        filename: str, keys: Union[None, str, Sequence[str]] = None
    ) -> Union[DictConfig, Any, Tuple[Any, ...]]:
        """Like :meth:`load`, with ``filename`` relative to the file that calls this
        (for use inside a config file)."""
        caller = sys._getframe(1).f_globals.get("__file__")
        if not caller:
            raise ConfigError(
                f"LazyConfig.load_rel('{filename}') must be called from a file with a __file__"
            )
        return LazyConfig.load(posixpath.join(posixpath.dirname(caller), filename), keys)

    @staticmethod
    def save(cfg: Union[DictConfig, dict], filename: Union[str, os.PathLike]) -> None:
        """Writes ``cfg`` as YAML through ``PathManager`` (creating the directory).

        ``LazyConfig.load`` of the file gives back an equal config, except that
        callables (``_target_`` above all) come back as their import-path
        strings. Values that YAML cannot hold are saved as ``???`` with a
        warning naming their key; no pickle is written. ``cfg`` is not modified.
        """
        filename = os.fspath(filename)
        text = to_yaml(cfg)
        directory = posixpath.dirname(filename)
        if directory:
            PathManager.mkdirs(directory)
        with PathManager.open(filename, "w", encoding="utf-8") as f:
            f.write(text)

    @staticmethod
    def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
        """Applies ``["train.max_iter=500", "+train.new_key=1", ...]`` to ``cfg`` in
        place, all or nothing, and returns it. See :func:`~treadle.config.apply_overrides`."""
        return apply_overrides(cfg, overrides)

    @staticmethod
    def to_yaml(cfg: Union[DictConfig, dict]) -> str:
        """The text :meth:`save` writes (handy for logging the full config)."""
        return to_yaml(cfg)

