"""The top-level nodes of a runnable config, and which code reads each.

``tools/train_net.py`` runs :class:`~treadle.engine.DefaultTrainer`, which
reads exactly the nodes of :data:`TOP_LEVEL_NODES`. A config may hold other
top-level nodes that other nodes interpolate (``corpus`` in
``configs/charlm_transformer.py``, read as ``${corpus.seq_len}``); any
other node would be carried into ``config.yaml`` and read by nothing, so
:func:`check_top_level_nodes` refuses it in one line.

LiBai's ``graph.enabled`` ("the mode is determined by the ``graph.enabled``
parameter") selects treadle's step: :func:`step_kind`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Dict, Set

from omegaconf import DictConfig, ListConfig

from .errors import ConfigError
from .nodes import child_node, is_missing, is_none, raw_value
from .rules import shown
from .train_keys import train_setting

__all__ = ["TOP_LEVEL_NODES", "check_top_level_nodes", "step_kind"]

#: Every top-level node that ``DefaultTrainer`` (and ``tools/train_net.py``) reads, and what reads it.
TOP_LEVEL_NODES: Dict[str, str] = {
    "model": "DefaultTrainer.build_model",
    "optimizer": "DefaultTrainer.build_optimizer",
    "lr_multiplier": "DefaultTrainer.build_lr_scheduler (optional)",
    "dataloader": "build_train_loader, build_test_loader and build_evaluator (train, test, evaluator)",
    "train": "the table of train.* keys (treadle/config/train_keys.py)",
    "graph": "LiBai's graph mode: graph.enabled=True selects train.step.kind='compiled' (step_kind)",
}

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
    :data:`TOP_LEVEL_NODES` and not interpolated by another node. Also
    checks ``graph`` (:func:`step_kind`).

    Raises:
        ConfigError: naming the node, and the node meant where one is close
            (LiBai's ``optim`` is treadle's ``optimizer``).
    """
    interpolated = _interpolated_roots(cfg, set())
    for key in cfg.keys():
        name = str(key)
        if name in TOP_LEVEL_NODES or name in interpolated:
            continue
        close = difflib.get_close_matches(name, list(TOP_LEVEL_NODES), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(
            f"The config's top-level node '{name}' is read by nothing: {hint}a job reads "
            f"{', '.join(TOP_LEVEL_NODES)}, and a node that another interpolates ('${{{name}...}}'); "
            f"remove it, or move it into one of those"
        )
    step_kind(cfg)


def step_kind(cfg: Any, *, kind_given: bool = False) -> str:
    """The step a config trains with: ``"eager"`` or ``"compiled"``.

    ``train.step.kind``, unless LiBai's ``graph.enabled`` is given:
    ``True`` selects ``"compiled"`` (treadle's ``CompiledStep``, through
    ``torch.compile``; ``train.step.kind`` is then ``'compiled'`` or its
    default ``'eager'``, which ``graph.enabled`` overrides), ``False`` the
    eager step. ``graph`` takes no other key (LiBai's ``debug``,
    ``train_graph``... configure OneFlow's ``nn.Graph``).

    ``kind_given``: the user gave ``train.step.kind`` (on the command line,
    ``tools/train_net.py``'s :func:`~treadle.tools.train_net.load_config`),
    so that ``'eager'`` is a choice of theirs, not the default.

    Raises:
        ConfigError: ``graph.enabled`` is not a bool, ``graph`` holds another
            key, ``graph.enabled`` asks for another step than a ``train.step.kind``
            the user gave (``'compiled'``, or ``'eager'`` with ``kind_given``),
            or ``graph.enabled=True`` with a step of the user's own (``train.step._target_``).
    """
    kind = train_setting(cfg, "step.kind")
    graph = cfg.get("graph") if isinstance(cfg, (DictConfig, dict)) else None
    if graph is None:
        return kind
    if not isinstance(graph, (DictConfig, dict)):
        raise ConfigError(f"graph must be a node with the key enabled (graph = dict(enabled=True)), got {shown(graph)}")
    others = [str(k) for k in graph.keys() if k != "enabled"]
    if others:
        raise ConfigError(
            f"graph.{others[0]} is a setting of LiBai's OneFlow graph, which treadle does not have: treadle reads "
            "graph.enabled only (True trains with CompiledStep, as train.step.kind='compiled'); remove it"
        )
    if "enabled" not in graph:
        return kind
    enabled = graph["enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError(f"graph.enabled must be True or False, got {shown(enabled)}")
    step = cfg["train"].get("step") if isinstance(cfg.get("train"), (DictConfig, dict)) else None
    if enabled and isinstance(step, (DictConfig, dict)) and "_target_" in step:
        raise ConfigError(
            "graph.enabled=True compiles treadle's step, and train.step is a step of your own (train.step._target_): "
            "remove graph.enabled, or train.step._target_"
        )
    wanted = "compiled" if enabled else "eager"
    # 'compiled' is never the default: it is the user's choice, as 'eager' is when given.
    chosen = kind == "compiled" or (kind_given and kind == "eager")
    if chosen and kind != wanted:
        raise ConfigError(
            f"graph.enabled={enabled} asks for the {wanted} step and train.step.kind={kind!r} for the {kind} one: "
            "give train.step.kind only (treadle's key)"
        )
    return wanted
