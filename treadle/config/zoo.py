"""The configs that ship with treadle, by name: LiBai's ``get_config`` and
detectron2's ``model_zoo.get_config``.

The example and common configs live inside the package
(``treadle/model_zoo/configs/``; a checkout also links them as ``configs/``),
so that a non-editable install finds them: ``get_config("common/train.py")``
returns the config that file defines, from anywhere.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, List

from .errors import ConfigError

__all__ = ["get_config", "get_config_file", "shipped_configs", "CONFIG_ROOT"]

#: Where the shipped configs are.
CONFIG_ROOT = Path(__file__).resolve().parents[1] / "model_zoo" / "configs"


def shipped_configs() -> List[str]:
    """Every shipped config file, as the name ``get_config`` takes (``"digits_mlp.py"``,
    ``"common/train.py"``), sorted."""
    return sorted(str(p.relative_to(CONFIG_ROOT)).replace(os.sep, "/") for p in CONFIG_ROOT.rglob("*.py"))


def get_config_file(config_path: str) -> str:
    """The path of the shipped config ``config_path`` (``"digits_mlp.py"``;
    a leading ``"configs/"`` is accepted, as a checkout's path).

    Raises:
        ConfigError: no such shipped config; the message suggests the closest names.
    """
    name = config_path.replace(os.sep, "/")
    if name.startswith("configs/"):
        name = name[len("configs/"):]
    path = CONFIG_ROOT / name
    if not path.is_file():
        known = shipped_configs()
        close = _closest(name, known)
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "? " if close else ""
        raise ConfigError(f"No shipped config named {config_path!r}; {hint}shipped configs: {', '.join(known)}")
    return str(path)


def _closest(name: str, known: List[str]) -> List[str]:
    """Up to two shipped names close to ``name``: compared in lower case and
    without ".py", which every name shares (it made 'nope.py' look like
    'common/optim.py'); the same file name in another folder first, then
    close file names, then close whole paths."""

    def stem(path: str) -> str:
        path = path.lower()
        return path[:-3] if path.endswith(".py") else path

    wanted = stem(name)
    by_stem = {stem(c): c for c in known}
    by_base = {s.rsplit("/", 1)[-1]: c for s, c in by_stem.items()}
    base = wanted.rsplit("/", 1)[-1]
    close = [c for s, c in by_stem.items() if s.rsplit("/", 1)[-1] == base]
    close += [by_base[s] for s in difflib.get_close_matches(base, list(by_base), n=2, cutoff=0.6)]
    close += [by_stem[s] for s in difflib.get_close_matches(wanted, list(by_stem), n=2, cutoff=0.6)]
    return list(dict.fromkeys(close))[:2]


def get_config(config_path: str, trained: bool = False) -> Any:
    """The config a shipped config file defines (``LazyConfig.load`` of it):
    ``get_config("common/train.py").train``.

    ``trained`` is detectron2's: treadle ships no trained weights, so
    ``trained=True`` is an error rather than a config pointing nowhere.
    """
    if trained:
        raise ConfigError("treadle ships no trained weights: get_config(..., trained=True) has nothing to point to")
    from .lazy import LazyConfig

    return LazyConfig.load(get_config_file(config_path))
