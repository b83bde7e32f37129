"""The top-level nodes of a runnable config, and which code reads each.

``tools/train_net.py`` runs :class:`~treadle.engine.DefaultTrainer`, which
reads exactly the nodes of :data:`TOP_LEVEL_NODES`. A config may hold other
top-level nodes that other nodes interpolate (``corpus`` in
``configs/charlm_transformer.py``, read as ``${corpus.seq_len}``); any
other node would be carried into ``config.yaml`` and read by nothing, so
:func:`check_top_level_nodes` refuses it in one line.

Another trainer's top-level node (LiBai's ``graph``) is read where a layer
above the job registered it (:mod:`treadle.config.other_nodes`), and selects
the step: :func:`step_kind`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, Dict, Iterator, Optional, Set, Tuple

from omegaconf import DictConfig, ListConfig

from .errors import ConfigError
from .nodes import child_node, is_missing, is_none, raw_value
from .other_nodes import OTHER_NODES
from .train_keys import train_setting

__all__ = ["TOP_LEVEL_NODES", "check_top_level_nodes", "step_kind", "step_kind_and_why"]

class _ReadNodes(Mapping[str, str]):
    """The job's own nodes, then those registered by a layer above it, in
    that order; read live, so that a registration after import is seen."""

    def __init__(self, own: Dict[str, str]) -> None:
        self._own = own

    def _all(self) -> Dict[str, str]:
        return {**self._own, **{name: reader.what for name, reader in OTHER_NODES.items()}}

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Every top-level node that ``DefaultTrainer`` (and ``tools/train_net.py``)
#: reads, and what reads it: the job's own, then the nodes of
#: :data:`~treadle.config.other_nodes.OTHER_NODES`.
TOP_LEVEL_NODES: Mapping[str, str] = _ReadNodes({
    "model": "DefaultTrainer.build_model",
    "optimizer": "DefaultTrainer.build_optimizer",
    "lr_multiplier": "DefaultTrainer.build_lr_scheduler (optional)",
    "dataloader": "build_train_loader, build_test_loader and build_evaluator (train, test, evaluator)",
    "train": "the table of train.* keys (treadle/config/train_keys.py)",
})

# The first key of an absolute interpolation: ${corpus.seq_len} -> corpus (not ${.sibling}).
_INTERPOLATED = re.compile(r"\$\{\s*([A-Za-z_]\w*)")


def _interpolated_roots(node: Any, found: Set[str]) -> Set[str]:
    """The top-level names that the ``${...}`` interpolations written in ``node`` start with."""
    if isinstance(node, (DictConfig, ListConfig)):
        if is_none(node) or is_missing(node):
            return found
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            _interpolated_roots(child_node(node, key), found)
        return found
    value = raw_value(node) if node is not None else None
    if isinstance(value, str):
        found.update(_INTERPOLATED.findall(value))
    return found


def check_top_level_nodes(cfg: DictConfig) -> None:
    """Refuses a top-level node that no code of the job reads: not one of
    :data:`TOP_LEVEL_NODES` and not interpolated by another node. Also checks
    the registered nodes (:func:`step_kind`).

    Raises:
        ConfigError: naming the node, and the node meant where one is close
            (LiBai's ``optim`` is treadle's ``optimizer``).
    """
    interpolated = _interpolated_roots(cfg, set())
    nodes = dict(TOP_LEVEL_NODES)
    for key in cfg.keys():
        name = str(key)
        if name in nodes or name in interpolated:
            continue
        close = difflib.get_close_matches(name, list(nodes), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(
            f"The config's top-level node '{name}' is read by nothing: {hint}a job reads "
            f"{', '.join(nodes)}, and a node that another interpolates ('${{{name}...}}'); "
            f"remove it, or move it into one of those"
        )
    step_kind(cfg)


def step_kind(cfg: Any, *, kind_given: bool = False) -> str:
    """The step a config trains with: ``"eager"`` or ``"compiled"``
    (:func:`step_kind_and_why`)."""
    return step_kind_and_why(cfg, kind_given=kind_given)[0]


def step_kind_and_why(cfg: Any, *, kind_given: bool = False) -> Tuple[str, Optional[str]]:
    """The step a config trains with, ``"eager"`` or ``"compiled"``, and
    the line that says why where a registered node (LiBai's ``graph``)
    chose it over ``train.step.kind`` (``None`` otherwise).

    ``train.step.kind``, unless a registered node the config holds selects
    the step (:class:`~treadle.config.other_nodes.NodeReader`).

    ``kind_given``: the user gave ``train.step.kind`` (on the command line,
    ``tools/train_net.py``'s :func:`~treadle.tools.train_net.load_config`),
    so that ``'eager'`` is a choice of theirs, not the default.

    Raises:
        ConfigError: a registered node's value is refused, or contradicts
            ``train.step.kind`` (one line naming both).
    """
    kind, why = train_setting(cfg, "step.kind"), None
    for name, reader in OTHER_NODES.items():
        if isinstance(cfg, (DictConfig, dict)) and cfg.get(name) is not None:
            kind, why = reader.step_kind(cfg, kind, kind_given)
    return kind, why
